"""``gpubench plan`` against the sandbox's known catalog: offers, prices, time and cost
arithmetic, reuse groups, flagged cells, selection, and that nothing is rented."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from e2e_helpers import SANDBOX_TOKEN, pytest_env

from pytest_gpubench.errors import Stage
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.errors import CommandProblem
from pytest_gpubench.cloud.reuse_split import DEFAULT_STAGE_SECONDS
from pytest_gpubench.commands.plan import (
    DEFAULT_PULL_SECONDS_PER_GB,
    DEFAULT_TOKENS_PER_SECOND,
    make_plan,
    makespan,
    stage_seconds,
)
from pytest_gpubench.store.progress import ProgressWriter, read_progress
from pytest_gpubench.settings import OPTIONS

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "matrix" / "gpubench_quick.yaml"
SEED = REPO / "matrix" / "gpubench_seed.yaml"
#: Seed 000's setup stages, by default: 5 + 144 + 5 + 25 seconds.
SETUP = sum(DEFAULT_STAGE_SECONDS.values())


@pytest.fixture(autouse=True)
def _no_gpubench_env(monkeypatch):
    """The plan reads settings like pytest does: none may leak in from the environment."""
    for name in [opt.env for opt in OPTIONS if opt.env] + ["GPUBENCH_API_TOKEN"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUBENCH_API_TOKEN", SANDBOX_TOKEN)  # only the test sandboxes' token


def plan_of(sandbox, paths, tmp_path, **kwargs):
    """A plan against the module's sandbox, with a manifest that has no history."""
    kwargs.setdefault("manifest", tmp_path / "none" / "manifest.db")
    return make_plan([str(p) for p in paths], api=sandbox.url, **kwargs)


def matrix(tmp_path: Path, text: str, name: str = "gpubench_plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def sessions_count(api) -> int:
    return api.get("/api/v1/sessions").json()["count"]


def bench_seconds(duration: float, runs: int, warmup: int, max_tokens: int, tps: float) -> float:
    return duration * runs + warmup * max_tokens / tps


# ----------------------------------------------------------------------------- offers and arithmetic


def test_quick_matrix_offers_prices_and_arithmetic(sandbox, api, tmp_path):
    plan = plan_of(sandbox, [QUICK], tmp_path, workers=2)
    by_cell = {c.cell: c for c in plan.cells}
    # The catalog's cheapest eligible offer per GPU (the spot 4090 ask is eligible: confidence 0.80).
    expected = {"RTX_4090-vastai-qwen2:7b": ("vastai-18430205", 0.110, 1, True),
                "RTX_4090-vastai-qwen2:1.5b": ("vastai-18430205", 0.110, 1, False),
                "RTX_3090-vastai-qwen2:7b": ("vastai-18430101", 0.080, 2, True),
                "A100_80GB-vastai-qwen2:7b": ("vastai-18430401", 0.330, 3, True)}
    assert [c.cell for c in plan.cells] == list(expected)  # run order: the 4090 group (longest) first
    for key, (offer, price, session, rents) in expected.items():
        cell = by_cell[key]
        assert (cell.offer_id, cell.price_per_hour, cell.session, cell.rents_session) == (offer, price, session, rents)
        assert cell.no_offer_reason is None

    # quick: 6 s benchmark, 1 run, 1 warm-up request of 64 tokens; qwen2:7b needs 8 GB, qwen2:1.5b 4 GB.
    bench = bench_seconds(6, 1, 1, 64, DEFAULT_TOKENS_PER_SECOND)
    first = by_cell["RTX_4090-vastai-qwen2:7b"]
    assert first.setup_seconds == pytest.approx(SETUP)
    assert [s.stage for s in first.stages] == ["provision", "ssh_wait", "ssh_connect", "runtime_setup",
                                               "model_pull", "benchmark"]
    assert first.pull_seconds == pytest.approx(8 * DEFAULT_PULL_SECONDS_PER_GB)
    assert first.benchmark_seconds == pytest.approx(bench)
    assert first.seconds == pytest.approx(SETUP + 8 * DEFAULT_PULL_SECONDS_PER_GB + bench)
    assert first.cost_usd == pytest.approx(0.11 * first.seconds / 3600)
    second = by_cell["RTX_4090-vastai-qwen2:1.5b"]  # on the same session: no setup, its own pull
    assert second.setup_seconds == 0 and [s.stage for s in second.stages] == ["model_pull", "benchmark"]
    assert second.seconds == pytest.approx(4 * DEFAULT_PULL_SECONDS_PER_GB + bench)
    assert second.cost_usd == pytest.approx(0.11 * second.seconds / 3600)

    sessions = {s.session: s for s in plan.sessions}
    assert len(sessions) == 3
    assert sessions[1].cells == ["RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:1.5b"]
    assert sessions[1].seconds == pytest.approx(first.seconds + second.seconds)
    assert sessions[1].cost_usd == pytest.approx(0.11 * sessions[1].seconds / 3600)
    single = SETUP + 8 * DEFAULT_PULL_SECONDS_PER_GB + bench
    assert sessions[2].seconds == pytest.approx(single) and sessions[3].seconds == pytest.approx(single)

    totals = plan.totals
    assert (totals.cells, totals.cells_without_offer, totals.sessions) == (4, 0, 3)
    everything = sessions[1].seconds + 2 * single
    assert totals.gpu_hours == pytest.approx(everything / 3600)
    assert totals.cost_usd == pytest.approx((0.11 * sessions[1].seconds + 0.08 * single + 0.33 * single) / 3600)
    assert totals.wall_seconds == pytest.approx(everything)
    # Two workers: the 4090 group on one, the two single cells on the other.
    assert totals.workers == 2
    assert totals.wall_seconds_workers == pytest.approx(max(sessions[1].seconds, 2 * single))
    assert sessions_count(api) == 0  # nothing was rented


def test_reuse_off_rents_a_session_per_cell_and_costs_more(sandbox, api, tmp_path):
    text = QUICK.read_text() + "\nreuse: cell\n"
    plan = plan_of(sandbox, [matrix(tmp_path, text)], tmp_path)
    assert plan.totals.sessions == 4
    assert all(c.rents_session and c.setup_seconds == pytest.approx(SETUP) for c in plan.cells)
    reused = plan_of(sandbox, [QUICK], tmp_path)
    assert plan.totals.cost_usd - reused.totals.cost_usd == pytest.approx(0.11 * SETUP / 3600)
    assert plan.totals.gpu_hours - reused.totals.gpu_hours == pytest.approx(SETUP / 3600)
    assert sessions_count(api) == 0


def test_a_session_that_does_not_fit_the_next_cell_is_not_reused(sandbox, api, tmp_path):
    path = matrix(tmp_path, """\
        workload: {duration: 60s, max_tokens: 100, warmup_requests: 2, concurrency: [1, 4]}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - gpu: RTX 4090
            provider: vastai
            model: qwen2:1.5b
            offer: {min_availability_confidence: {vastai: 0.85}}
        """)
    plan = plan_of(sandbox, [path], tmp_path, workers=3)
    cells = [(c.cell, c.offer_id, c.session, c.rents_session) for c in plan.cells]
    assert cells == [
        ("RTX_4090-vastai-qwen2:7b", "vastai-18430205", 1, True),
        ("RTX_4090-vastai-qwen2:7b-c4", "vastai-18430205", 1, False),
        # The spot ask's confidence (0.80) is below this row's bar: a session of its own,
        # on the cheapest offer above 0.85.
        ("RTX_4090-vastai-qwen2:1.5b", "vastai-18430202", 2, True),
        ("RTX_4090-vastai-qwen2:1.5b-c4", "vastai-18430202", 2, False),
    ]
    second = plan.cells[1]
    # The model is on the session already: no pull; 1 run of 60 s and 2 warm-ups of 100 tokens.
    assert [(s.stage, s.seconds) for s in second.stages] == [
        ("model_pull", 0.0), ("benchmark", pytest.approx(bench_seconds(60, 1, 2, 100, DEFAULT_TOKENS_PER_SECOND)))]
    # One reuse group, one worker however many there are.
    assert [g.name for g in plan.groups] == ["RTX_4090-vastai"] and plan.groups[0].sessions == [1, 2]
    assert plan.totals.wall_seconds_workers == pytest.approx(plan.totals.wall_seconds)
    assert sessions_count(api) == 0


def test_runs_until_cv_plans_the_minimum(sandbox, tmp_path):
    path = matrix(tmp_path, """\
        workload: {duration: 30s, max_tokens: 50, runs: {until_cv: 5%, min: 3, max: 8}}
        matrix:
          - {gpu: RTX 3090, provider: vastai, model: qwen2:1.5b}
        """)
    (cell,) = plan_of(sandbox, [path], tmp_path).cells
    assert cell.runs == 3
    assert cell.benchmark_seconds == pytest.approx(bench_seconds(30, 3, 1, 50, DEFAULT_TOKENS_PER_SECOND))


# ----------------------------------------------------------------------------- flagged cells


def test_cells_without_an_eligible_offer_are_flagged_with_the_plugins_reason(sandbox, api, tmp_path):
    path = matrix(tmp_path, """\
        matrix:
          - {gpu: RTX 6000, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, offer: {max_price: 0.05}}
          - {gpu: RTX 3090, provider: tensordock, model: qwen2:7b}
          - {gpu: A100 80GB, provider: vastai, model: qwen2:7b}
        """)
    plan = plan_of(sandbox, [path], tmp_path)
    reasons = {c.cell: c.no_offer_reason for c in plan.cells}
    assert reasons == {
        "RTX_6000-vastai-qwen2:7b": "no offers found for RTX 6000 on vastai",
        "RTX_3090-vastai-qwen2:7b": "3 offer(s) for RTX 3090 on vastai, none eligible: "
                                    "3 over the price cap of $0.05/h, cheapest $0.08/h",
        "RTX_3090-tensordock-qwen2:7b": "2 offer(s) for RTX 3090 on tensordock, none eligible: "
                                        "2 availability confidence not above 0.5 for tensordock, best 0.30",
        "A100_80GB-vastai-qwen2:7b": None,
    }
    flagged = [c for c in plan.cells if c.no_offer_reason]
    assert all(c.session is None and c.seconds == 0 and c.cost_usd == 0 for c in flagged)
    assert (plan.totals.cells, plan.totals.cells_without_offer, plan.totals.sessions) == (4, 3, 1)
    assert plan.totals.cost_usd == pytest.approx(plan.cells[-1].cost_usd)
    assert sessions_count(api) == 0


def test_gpubench_max_price_applies_as_in_a_run(sandbox, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUBENCH_MAX_PRICE", "0.1")  # a run's override, through the same settings
    plan = plan_of(sandbox, [QUICK], tmp_path)
    assert {c.cell: c.offer_id for c in plan.cells} == {
        "RTX_4090-vastai-qwen2:7b": None, "RTX_4090-vastai-qwen2:1.5b": None,
        "RTX_3090-vastai-qwen2:7b": "vastai-18430101", "A100_80GB-vastai-qwen2:7b": None}
    assert "over the price cap of $0.10/h" in plan.cells[0].no_offer_reason


# ----------------------------------------------------------------------------- selection


def test_selection_is_exactly_pytests(sandbox, tmp_path):
    args = ["-k", "deepseek and not 32b", "--gpu", "RTX4090", "--provider", "vastai"]
    listed = subprocess.run([sys.executable, "-m", "pytest", str(SEED), "--collect-only", "-q",
                             "-p", "no:cacheprovider", *args],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    ids = [line.split("::", 1)[1] for line in listed.stdout.splitlines() if "::" in line]
    assert ids == ["RTX_4090-vastai-deepseek-r1:14b"], listed.stdout
    plan = plan_of(sandbox, [SEED], tmp_path, keyword="deepseek and not 32b", gpus=["RTX4090"],
                   providers=["vastai"])
    assert [c.cell for c in plan.cells] == ids

    plan = plan_of(sandbox, [QUICK], tmp_path, gpus=["rtx 3090", "A100 80GB"])
    assert [c.cell for c in plan.cells] == ["RTX_3090-vastai-qwen2:7b", "A100_80GB-vastai-qwen2:7b"]
    plan = plan_of(sandbox, [QUICK], tmp_path, keyword="RTX4090", models=["qwen2:1.5b"])
    assert [c.cell for c in plan.cells] == ["RTX_4090-vastai-qwen2:1.5b"]
    assert plan.cells[0].rents_session  # alone in its group now: it rents


def test_bad_matrix_bad_selection_and_nothing_selected_are_usage_problems(sandbox, tmp_path):
    bad = matrix(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {duration: -3}}
        """, name="gpubench_bad.yaml")
    with pytest.raises(CommandProblem) as caught:
        plan_of(sandbox, [bad], tmp_path)
    assert caught.value.status == 2 and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{bad}: matrix[0].workload.duration: must be")
    with pytest.raises(CommandProblem, match="Wrong expression passed to '-k'") as caught:
        plan_of(sandbox, [QUICK], tmp_path, keyword="and and")
    assert caught.value.status == 2
    with pytest.raises(CommandProblem, match="no matrix cells selected") as caught:
        plan_of(sandbox, [QUICK], tmp_path, gpus=["H100"])
    assert caught.value.status == 2


# ----------------------------------------------------------------------------- history


T0 = datetime(2026, 2, 7, 10, 0, 0, tzinfo=timezone.utc)


def write_progress(path: Path, steps: list[tuple[str, float]]) -> None:
    """A progress file whose STATUS lines are ``seconds`` after T0."""
    times = iter([T0 + timedelta(seconds=s) for _, s in steps])
    with ProgressWriter(path, clock=lambda: next(times)) as writer:
        for label, _ in steps:
            writer.status(label)


def add_cell(manifest: Manifest, run: str, tmp_path: Path, cell: str, gpu: str, model: str,
             steps: list[tuple[str, float]], status: str = "success", tps: float | None = None) -> None:
    row = manifest.add_cell(run, cell, gpu_type=gpu, provider="vastai", model=model, matrix_file="m.yaml")
    progress = tmp_path / "progress" / run / f"{cell.replace(':', '_')}.log"
    write_progress(progress, steps)
    manifest.update_cell(row, status="running", progress_file=str(progress))
    if status != "running":
        manifest.finish_cell(row, status=status, decode_tokens_per_second=tps)


def rented(ssh_wait: float, pull: float) -> list[tuple[str, float]]:
    """A cell that rented its session: provision 2 s, connect 4 s, install 20 s."""
    return [("STARTING", 0), ("INVENTORY_QUERY", 1), ("PROVISIONING", 3), ("SSH_READY", 3 + ssh_wait),
            ("SYSTEM_INFO", 7 + ssh_wait), ("OLLAMA_INSTALLED", 27 + ssh_wait),
            ("MODEL_READY", 27 + ssh_wait + pull), ("BENCHMARK_COMPLETE", 400 + ssh_wait + pull)]


def test_stage_times_of_one_progress_file(tmp_path):
    path = tmp_path / "a.log"
    write_progress(path, rented(60, 30))
    assert stage_seconds(read_progress(path)) == {Stage.PROVISION: 2, Stage.SSH_WAIT: 60, Stage.SSH_CONNECT: 4,
                                                  Stage.RUNTIME_SETUP: 20, Stage.MODEL_PULL: 30}
    write_progress(tmp_path / "b.log", [("STARTING", 0), ("SESSION_REUSED", 1), ("SYSTEM_INFO", 2),
                                        ("OLLAMA_INSTALLED", 3), ("MODEL_READY", 13)])
    # A cell on a reused session tells only its pull.
    assert stage_seconds(read_progress(tmp_path / "b.log")) == {Stage.MODEL_PULL: 10}


def test_stage_estimates_are_medians_of_earlier_real_runs(sandbox, api, tmp_path):
    db = tmp_path / "reports" / "manifest.db"
    with Manifest(db) as manifest:
        manifest.start_run("r1", [], [], sandbox=False)
        add_cell(manifest, "r1", tmp_path, "a", "RTX 4090", "qwen2:7b", rented(60, 30), tps=100.0)
        add_cell(manifest, "r1", tmp_path, "b", "RTX 4090", "qwen2:7b", rented(100, 50), status="failed", tps=300.0)
        add_cell(manifest, "r1", tmp_path, "c", "RTX 4090", "qwen2:7b", rented(900, 900), status="running")
        reused = [("STARTING", 0), ("SESSION_REUSED", 1), ("SYSTEM_INFO", 2), ("OLLAMA_INSTALLED", 3),
                  ("MODEL_READY", 15)]
        add_cell(manifest, "r1", tmp_path, "d", "RTX 4090", "qwen2:1.5b", reused)
        manifest.start_run("s1", [], [], sandbox=True)  # the sandbox's clock: not a real cloud's
        add_cell(manifest, "s1", tmp_path, "e", "RTX 3090", "qwen2:7b", rented(1, 1))
    plan = plan_of(sandbox, [QUICK], tmp_path, manifest=db)
    assert plan.history == f"3 finished real-cloud cell(s) in {db}"
    by_cell = {c.cell: {s.stage: s for s in c.stages} for c in plan.cells}

    first = by_cell["RTX_4090-vastai-qwen2:7b"]
    assert first["ssh_wait"].seconds == 80  # median of 60 and 100; the unfinished cell is left out
    assert first["ssh_wait"].source == "history: median of 2 cell(s), RTX 4090 on vastai"
    assert (first["provision"].seconds, first["ssh_connect"].seconds, first["runtime_setup"].seconds) == (2, 4, 20)
    assert first["model_pull"].seconds == 40
    # Warm-up at the median tokens/s those runs measured for this GPU and model (200).
    assert first["benchmark"].seconds == pytest.approx(bench_seconds(6, 1, 1, 64, 200.0))
    assert by_cell["RTX_4090-vastai-qwen2:1.5b"]["model_pull"].seconds == 12

    # Another GPU on the same provider: the provider's history for setup; the model's for the pull;
    # no tokens/s for this GPU and model yet, so seed 000's figure for the warm-up.
    a100 = by_cell["A100_80GB-vastai-qwen2:7b"]
    assert a100["ssh_wait"].seconds == 80 and a100["ssh_wait"].source == "history: median of 2 cell(s), vastai"
    assert a100["model_pull"].seconds == 40
    assert a100["benchmark"].seconds == pytest.approx(bench_seconds(6, 1, 1, 64, DEFAULT_TOKENS_PER_SECOND))
    # The sandbox run's seconds never reach a real-cloud plan.
    assert by_cell["RTX_3090-vastai-qwen2:7b"]["ssh_wait"].seconds == 80


def test_makespan_is_longest_first_to_the_least_loaded_worker():
    assert makespan([5, 4, 3, 3, 3], 1) == 18
    # 5 | 4, then each 3 to the less loaded: 5+3 | 4+3+3. (The best split, 5+4 | 3+3+3, is 9:
    # LPT is an estimate, as xdist's scheduling is.)
    assert makespan([5, 4, 3, 3, 3], 2) == 10
    assert makespan([7, 1, 1], 3) == 7
    assert makespan([], 4) == 0


# ----------------------------------------------------------------------------- the command


def gpubench(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", *args], cwd=REPO,
                          env=pytest_env(env), capture_output=True, text=True, timeout=timeout)


def test_command_prints_the_table_and_json(sandbox, api, tmp_path):
    common = ["plan", str(QUICK), "--api", sandbox.url, "--store", str(tmp_path / "none.db"), "-n", "2"]
    done = gpubench(*common)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["cell", "offer", "$/h", "setup", "pull", "bench", "time", "cost", "$", "session"]
    assert lines[1].split()[:3] == ["RTX_4090-vastai-qwen2:7b", "vastai-18430205", "0.110"]
    assert lines[1].split()[-2:] == ["#1", "rents"] and lines[2].split()[-2:] == ["#1", "reuses"]
    assert "sessions to create:" in lines
    assert any(line.startswith("total: 4 cell(s), 3 session(s), ") for line in lines)
    assert any(line.startswith("wall time: ") and "with -n 2" in line for line in lines)
    assert not (tmp_path / "none.db").exists()  # no history asked for is no manifest made

    as_json = json.loads(gpubench(*common, "--json").stdout)
    assert as_json["totals"]["sessions"] == 3 and as_json["totals"]["workers"] == 2
    assert [c["offer_id"] for c in as_json["cells"]] == ["vastai-18430205", "vastai-18430205", "vastai-18430101",
                                                         "vastai-18430401"]
    assert sessions_count(api) == 0


def test_command_flags_cells_without_offers(sandbox, tmp_path):
    path = matrix(tmp_path, """\
        matrix:
          - {gpu: RTX 3090, providers: [vastai, tensordock], model: qwen2:7b}
        """)
    done = gpubench("plan", str(path), "--api", sandbox.url, "--store", str(tmp_path / "none.db"))
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("RTX_3090-tensordock-qwen2:7b"))
    assert row.split()[-2:] == ["NO", "OFFER"]
    assert ("  RTX_3090-tensordock-qwen2:7b: 2 offer(s) for RTX 3090 on tensordock, none eligible: "
            "2 availability confidence not above 0.5 for tensordock, best 0.30") in done.stdout.splitlines()
    assert "total: 2 cell(s) (1 without an offer), 1 session(s)" in done.stdout


def test_command_errors_are_one_line(tmp_path):
    bad = matrix(tmp_path, "matrix: []\n", name="gpubench_empty.yaml")
    done = gpubench("plan", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"gpubench plan: error: {bad}: matrix: ")

    # A port that is bound but not listening: connections are refused, the API is unreachable.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{taken.getsockname()[1]}"
        done = gpubench("plan", str(QUICK), "--api", url)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"gpubench plan: error: no GPU Shopper API answers at {url}")
    assert "Traceback" not in done.stderr


def test_command_with_its_own_sandbox_rents_nothing(tmp_path):
    reports = tmp_path / "reports"
    done = gpubench("plan", str(QUICK), "--sandbox", "--json", env={"GPUBENCH_REPORTS": str(reports)})
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["sandbox"] is True and plan["time_scale"] == 0.02
    assert [c["price_per_hour"] for c in plan["cells"]] == [0.11, 0.11, 0.08, 0.33]
    first = plan["cells"][0]
    # The sandbox's clock scales the default setup and the benchmark's duration (6 s x
    # 0.02 is below the 5 s floor), and it sends no warm-up request.
    assert first["setup_seconds"] == pytest.approx(SETUP * 0.02)
    assert first["benchmark_seconds"] == pytest.approx(bench_seconds(5, 1, 0, 64, DEFAULT_TOKENS_PER_SECOND))
    log = (reports / "sandbox.log").read_text()
    assert "gpubench sandbox stopped: 0 session(s) created, 0 left running" in log


# ----------------------------------------------------------------------------- collect-only


SITECUSTOMIZE = '''
import os, socket

_connect = socket.socket.connect


def _logged(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        with open(os.environ["CONNECT_LOG"], "a") as log:
            log.write(repr(address) + "\\n")
    return _connect(self, address)


socket.socket.connect = _logged
'''


def test_collect_only_stays_off_the_network(tmp_path):
    """pytest --collect-only (what the plan builds on) opens no connection and starts no sandbox."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log, reports = tmp_path / "connects.log", tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(REPO)]), CONNECT_LOG=str(log),
               GPUBENCH_REPORTS=str(reports))
    probe = subprocess.run([sys.executable, "-c", "import socket; s = socket.socket(); s.settimeout(2)\n"
                            "try: s.connect(('127.0.0.1', 9))\nexcept OSError: pass"], env=env, timeout=60)
    assert probe.returncode == 0 and log.read_text().strip() == "('127.0.0.1', 9)"  # the probe itself works
    log.unlink()
    for extra in ([], ["--gpubench-sandbox"], ["--gpubench-api", "http://127.0.0.1:9"]):
        done = subprocess.run([sys.executable, "-m", "pytest", str(QUICK), str(SEED), "--collect-only", "-q",
                               "-p", "no:cacheprovider", *extra], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "25 tests collected" in done.stdout
        assert not log.exists(), log.read_text()
        assert not (reports / "sandbox.log").exists() and not (reports / "manifest.db").exists()


def test_a_hosts_matrix_plans_on_its_inventory_and_a_missing_one_names_the_cell(sandbox, tmp_path):
    (tmp_path / "id_lab").write_text("not read by a plan\n")
    (tmp_path / "hosts.yaml").write_text(textwrap.dedent("""\
        hosts:
          lab1: {address: 10.0.0.5, key_file: id_lab, gpu: RTX 4090, gpus: 2, price_per_hour: 0.5}
        """))
    body = """\
        cloud: hosts
        {hosts}
        matrix:
          - {{gpu: RTX 4090, provider: lab1, model: qwen2:7b, runtime: vllm}}
        """
    planned = plan_of(sandbox, [matrix(tmp_path, body.format(hosts="hosts: hosts.yaml"))], tmp_path)
    (cell,) = planned.cells
    # One of the machine's two GPUs: half its price (docs/providers.md).
    assert (cell.offer_id is not None, cell.price_per_hour) == (True, 0.25), cell
    bare = matrix(tmp_path, body.format(hosts=""), name="gpubench_bare.yaml")
    with pytest.raises(CommandProblem) as caught:
        plan_of(sandbox, [bare], tmp_path)
    message = str(caught.value)
    assert "RTX_4090-lab1-qwen2:7b" in message and "-cloud_hosts (hosts): " in message, message
    assert "needs a hosts inventory" in message and sandbox.url not in message, message
