"""A GPU box runs its share of a phase (--gpubench-runners): deselection, reruns, the run named
after the phase, every cell of the phase registered as pending. (pytester)"""

from __future__ import annotations

import sqlite3

import pytest

#: Running endpoints (``runtime: openai``): a run of them needs no GPU Shopper API.
MATRIX = """
workload: {duration: 2s, max_tokens: 8}
matrix:
  - {gpu: RTX 4090, model: qwen2:7b, runtime: {name: openai, endpoint: 'http://127.0.0.1:9/v1'}}
  - {gpu: RTX 4090, model: llama3:8b, runtime: {name: openai, endpoint: 'http://127.0.0.1:9/v1'}}
  - {gpu: A100 80GB, model: qwen2:7b, runtime: {name: openai, endpoint: 'http://127.0.0.1:9/v1'}}
  - {gpu: T4, model: qwen2:7b, runtime: {name: openai, endpoint: 'http://127.0.0.1:9/v1'}}
"""
RUNNERS = """
phases:
  nightly: {gpus: [RTX 4090, A100 80GB], reruns: 2}
runners:
  box-a: {phase: nightly, models: [qwen2]}
  default: {phase: nightly, gpus: [A100 80GB]}
"""
SUFFIX = "-runtime_openai"


@pytest.fixture
def project(pytester, monkeypatch):
    pytester.makefile(".yaml", gpubench_endpoints=MATRIX)
    pytester.makefile(".yaml", runners=RUNNERS)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    for name in ("GPUBENCH_RUNNERS", "GPUBENCH_PHASE", "GPUBENCH_RUNNER", "GPUBENCH_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def manifest(project) -> list[tuple[str, str]]:
    with sqlite3.connect(project.path / "reports" / "manifest.db") as db:
        return db.execute("SELECT id, status FROM benchmark_manifest ORDER BY id").fetchall()


def test_a_runner_collects_only_what_it_takes_of_its_phase_once_per_rerun(project):
    result = project.runpytest("--collect-only", "-q", "--gpubench-runners", "runners.yaml",
                               "--gpubench-runner", "box-a")
    result.stdout.fnmatch_lines([
        f"gpubench_endpoints.yaml::RTX_4090-endpoint-qwen2:7b{SUFFIX}",
        f"gpubench_endpoints.yaml::RTX_4090-endpoint-qwen2:7b{SUFFIX}-rerun2",
        f"gpubench_endpoints.yaml::A100_80GB-endpoint-qwen2:7b{SUFFIX}",
        f"gpubench_endpoints.yaml::A100_80GB-endpoint-qwen2:7b{SUFFIX}-rerun2",
        "gpubench: runner box-a takes qwen2: 4 of 6 cells of phase nightly",
    ])
    # The llama3 cell is another runner's, the T4 cell outside the phase: both deselected.
    assert result.parseoutcomes()["deselected"] == 2
    # Another host is `default`; the header says it too.
    other = project.runpytest("--collect-only", "--gpubench-runners", "runners.yaml", "--gpubench-runner", "ci-7")
    other.stdout.fnmatch_lines(["gpubench: runner default (host ci-7) takes A100 80GB: 2 of 6 cells of phase nightly",
                                "*2 selected*"])


def test_the_controller_registers_the_whole_phase_under_the_phase_name(project):
    # -k leaves nothing to run: what is recorded is the registration alone.
    result = project.runpytest("--gpubench-runners", "runners.yaml", "--gpubench-runner", "box-a",
                               "-k", "nothing_matches")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str()
    assert manifest(project) == sorted((f"nightly/{gpu}-endpoint-{model}{SUFFIX}{rerun}", "pending")
                                       for gpu in ("RTX_4090", "A100_80GB")
                                       for model in ("qwen2:7b", "llama3:8b") if (gpu, model) != ("A100_80GB", "llama3:8b")
                                       for rerun in ("", "-rerun2"))
    # Again from another machine (or the same one): nothing is added twice.
    project.runpytest("--gpubench-runners", "runners.yaml", "--gpubench-runner", "ci-7", "-k", "nothing_matches")
    assert len(manifest(project)) == 6


def test_a_run_id_given_wins_over_the_phase_name(project):
    project.runpytest("--gpubench-runners", "runners.yaml", "--gpubench-runner", "box-a", "-k", "nothing_matches",
                      "--gpubench-run-id", "mine")
    assert {row_id.split("/")[0] for row_id, _ in manifest(project)} == {"mine"}


def test_under_xdist_only_the_controller_registers_and_workers_share_the_phase_run(project):
    result = project.runpytest_subprocess("-n", "2", "--gpubench-runners", "runners.yaml",
                                          "--gpubench-runner", "box-a", "-k", "nothing_matches")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str() + result.stderr.str()
    assert len(manifest(project)) == 6 and {s for _, s in manifest(project)} == {"pending"}


@pytest.mark.parametrize(("args", "words"), [
    (["--gpubench-runners", "missing.yaml"], "cannot read the runners file"),
    (["--gpubench-runners", "runners.yaml", "--gpubench-phase", "weekly"], "no phase 'weekly'; phases: nightly"),
    (["--gpubench-phase", "nightly"], "--gpubench-phase needs a runners file: --gpubench-runners FILE"),
])
def test_a_bad_runners_option_is_a_usage_error(project, args, words):
    result = project.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()


def test_an_unknown_host_without_a_default_runner_is_a_usage_error(project):
    project.makefile(".yaml", runners="phases: {nightly: {}}\nrunners: {box-a: {phase: nightly}}\n")
    result = project.runpytest("--collect-only", "--gpubench-runners", "runners.yaml", "--gpubench-runner", "ci-7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no runner for host 'ci-7' and no `default:` entry; runners: box-a" in result.stderr.str()


def test_gpubench_plan_prices_this_runners_share_with_its_reruns_on_one_session(project, monkeypatch):
    """``gpubench plan`` collects as pytest does: GPUBENCH_RUNNERS gives it the runner's share."""
    from pytest_gpubench.plugin.collect import collect_cells

    monkeypatch.setenv("GPUBENCH_RUNNERS", str(project.path / "runners.yaml"))
    monkeypatch.setenv("GPUBENCH_RUNNER", "box-a")
    collected = collect_cells([str(project.path / "gpubench_endpoints.yaml")])
    keys = [key for key, _ in collected.cells]
    assert sorted(keys) == sorted(f"{gpu}-endpoint-qwen2:7b{SUFFIX}{rerun}"
                                  for gpu in ("RTX_4090", "A100_80GB") for rerun in ("", "-rerun2"))
    groups = {key: cell.session_group for key, cell in collected.cells}
    assert groups[f"RTX_4090-endpoint-qwen2:7b{SUFFIX}"] == groups[f"RTX_4090-endpoint-qwen2:7b{SUFFIX}-rerun2"]
    assert keys.index(f"RTX_4090-endpoint-qwen2:7b{SUFFIX}-rerun2") - keys.index(f"RTX_4090-endpoint-qwen2:7b{SUFFIX}") == 1
