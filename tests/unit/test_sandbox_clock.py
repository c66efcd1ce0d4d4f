"""The sandbox demo: a ``--gpubench-sandbox`` run benchmarks on the sandbox's time
scale (with floors), ``--gpubench-sandbox-real-time`` keeps the matrix's seconds, and
its figures say they are the sandbox's wherever they appear."""

from pathlib import Path

import pytest

from pytest_gpubench.store.sqlite_store import SqliteStore
from pytest_gpubench.matrix.cells import apply_overrides
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.matrix.cells import expand, load_matrix
from pytest_gpubench.store.progress import read_progress
from pytest_gpubench.run.record import CellRecorder
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.sandbox_label import junit_property, progress_labels, summary_title
from pytest_gpubench.settings import resolve

SEED = Path(__file__).resolve().parents[2] / "matrix" / "gpubench_seed.yaml"


def no_ini(_name):
    return None


@pytest.fixture(scope="module")
def seed_cell():
    return expand(load_matrix(SEED))[0]


def test_sandbox_run_benchmarks_on_the_sandbox_clock(seed_cell):
    assert seed_cell.workload.duration == 300 and seed_cell.workload.progress_interval == 60
    cell = apply_overrides(seed_cell, resolve({"sandbox": True}, {}, no_ini))
    assert cell.workload.duration == pytest.approx(6.0)  # 300 s x 0.02
    assert cell.workload.progress_interval == pytest.approx(1.2)  # 60 s x 0.02
    assert cell.workload.telemetry_interval == 1.0  # 5 s x 0.02 = 0.1 s: the floor
    # No warm-up request (the runtime's one-token warm-up loaded the model); the
    # workload itself is what the matrix says.
    assert seed_cell.workload.warmup_requests == 1 and cell.workload.warmup_requests == 0
    assert cell.workload.max_tokens == seed_cell.workload.max_tokens
    assert cell.workload.prompts == seed_cell.workload.prompts


def test_floor_keeps_a_few_requests_and_never_lengthens(seed_cell):
    settings = resolve({"sandbox": True}, {}, no_ini)
    assert settings.benchmark_seconds(60) == 5.0  # 1.2 s would measure one or two requests
    assert settings.benchmark_seconds(2) == 2.0  # asked for less than the floor: as asked
    assert settings.benchmark_seconds(3600) == pytest.approx(72.0)
    # --gpubench-duration is a matrix duration too: on the sandbox clock.
    cell = apply_overrides(seed_cell, resolve({"sandbox": True, "duration": "600"}, {}, no_ini))
    assert cell.workload.duration == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("cli", "env"),
    [
        ({"sandbox": True, "sandbox_real_time": True}, {}),  # the fidelity benches
        ({"sandbox": True}, {"GPUBENCH_SANDBOX_REAL_TIME": "1"}),
        # A standalone sandbox (or any API) with a time scale: the plugin cannot know
        # it is a sandbox, and tests that interrupt long benchmarks rely on that.
        ({"time_scale": "0.02"}, {}),
        ({}, {}),
    ],
)
def test_real_time_where_asked_or_not_the_runs_own_sandbox(seed_cell, cli, env):
    cell = apply_overrides(seed_cell, resolve(cli, env, no_ini))
    assert cell.workload.duration == 300
    assert cell.workload.progress_interval == 60
    assert cell.workload.telemetry_interval == 5
    assert cell.workload.warmup_requests == 1


# ----------------------------------------------------------------------------- labels


def test_sandbox_figures_are_labelled_in_the_terminal_junit_and_progress():
    sandbox, real = resolve({"sandbox": True}, {}, no_ini), resolve({}, {}, no_ini)
    assert summary_title(sandbox) == "gpubench summary: SANDBOX figures (emulated GPUs, benchmarks on its clock x0.02)"
    assert summary_title(real) == "gpubench summary"
    assert junit_property(sandbox) == ("gpubench_sandbox", "true")
    assert junit_property(real) == ("gpubench_sandbox", "false")
    assert progress_labels(sandbox) == {"sandbox": "true", "time_scale": 0.02}
    assert progress_labels(real) == {}  # a real run's progress files are as they were
    timed = resolve({"sandbox": True, "sandbox_real_time": True}, {}, no_ini)
    assert "benchmarks in real time" in summary_title(timed)
    assert progress_labels(timed)["time_scale"] == 1.0


def test_progress_file_starts_with_the_label(tmp_path, seed_cell):
    with Manifest(tmp_path / "m.db") as manifest:
        manifest.start_run("r1", [], [], sandbox=True)
        recorder = CellRecorder.start(SqliteStore(manifest), "r1", seed_cell, seed_cell.cell_id, tmp_path / "progress", "w0",
                                      labels=progress_labels(resolve({"sandbox": True}, {}, no_ini)))
        recorder.progress.close()
        first = read_progress(recorder.progress.path)[0]
    assert (first.kind, first.label) == ("STATUS", "STARTING")
    assert first.fields["sandbox"] == "true" and first.fields["time_scale"] == "0.02"


def test_report_of_sandbox_runs_says_so_in_title_and_note(tmp_path):
    with Manifest(tmp_path / "m.db") as manifest:
        manifest.start_run("real-run", [], [], sandbox=False)
        manifest.start_run("demo-run", [], [], sandbox=True)
        only_sandbox = build_report(SqliteStore(manifest), ["demo-run"])
        mixed = build_report(SqliteStore(manifest), ["real-run", "demo-run"])
        real = build_report(SqliteStore(manifest), ["real-run"])
    assert only_sandbox.title == "GPU Benchmark Report (sandbox)"
    assert only_sandbox.sandbox_note.startswith("Sandbox figures: Every run in this report used")
    markdown, html = render_markdown(only_sandbox), render_html(only_sandbox)
    assert markdown.startswith("# GPU Benchmark Report (sandbox)\n\n> **Sandbox figures:")
    assert "<title>GPU Benchmark Report (sandbox)</title>" in html and 'class="sandbox-note"' in html
    assert mixed.title == "GPU Benchmark Report (includes sandbox runs)"
    assert "Run demo-run used" in mixed.sandbox_note
    assert real.title == "GPU Benchmark Report" and real.sandbox_note == ""
    assert render_markdown(real).startswith("# GPU Benchmark Report\n\n**")
    assert "sandbox-note" not in render_html(real)
