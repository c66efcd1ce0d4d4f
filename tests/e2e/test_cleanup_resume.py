"""Cleanup that always happens, and resume.

Unit tests run the ownership rules against a real manifest and the sandbox API
(``sandbox``/``api`` fixtures); the slow tests run pytest as a subprocess against a
standalone sandbox and interrupt it: SIGINT, SIGTERM, SIGKILL of an xdist worker, a
pytest-timeout expiry (both methods); then ``gpubench cleanup`` must find nothing
running. A resumed run records into the same run id.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlite_utils
from e2e_helpers import RENTABLE_OFFER, SANDBOX_TOKEN, PytestRun, active_sessions, rent, session_status
from polling import wait_for

from pytest_gpubench.run.cleanup import ReleaseOutcome, owning_run, release, stage_reached
from pytest_gpubench.commands.cli import main as gpubench
from pytest_gpubench.errors import Stage, UsageProblem
from pytest_gpubench.settings import Settings
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.cloud.processes import ProcessIdentity, pid_alive, start_token
from pytest_gpubench.store.progress import ProgressWriter
from pytest_gpubench.cloud.provider import consumer_id
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.store.opening import ResumePlan, plan_resume, still_to_run
from pytest_gpubench.cloud.shopper_client import ShopperClient
from pytest_gpubench.run.shutdown import GracefulTermination, Terminated

OFFER = RENTABLE_OFFER
status = session_status
ACTIVE = {"pending", "provisioning", "running", "stopping"}




def dead_process() -> ProcessIdentity:
    """The identity of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    token = start_token(child.pid)
    child.wait()
    return ProcessIdentity(pid=child.pid, host=socket.gethostname(), start=token)


def add_run(manifest: Manifest, run_id: str, owner: ProcessIdentity | None, api_url: str | None,
            sandbox: bool = False) -> None:
    manifest.start_run(run_id, argv=[], matrix_files=[], owner=owner, api=api_url, sandbox=sandbox)


def add_cell(manifest: Manifest, run_id: str, cell_id: str, tmp_path: Path, session_id: str | None = None,
             cell_status: str = "running") -> str:
    row_id = manifest.add_cell(run_id, cell_id, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                               matrix_file="m.yaml")
    progress = tmp_path / "progress" / run_id / f"{cell_id}.log"
    writer = ProgressWriter(progress)
    for label in ("STARTING", "INVENTORY_QUERY", "PROVISIONING", "SSH_READY", "SYSTEM_INFO", "OLLAMA_INSTALLED",
                  "MODEL_READY"):
        writer.status(label)
    writer.close()
    manifest.update_cell(row_id, status="running", worker="gw0", progress_file=str(progress))
    if session_id is not None:
        manifest.record_session(row_id, session_id=session_id, consumer_id=consumer_id(run_id, cell_id),
                                offer_id=OFFER, price_per_hour=0.16)
    if cell_status != "running":
        manifest.finish_cell(row_id, status=cell_status)
    return row_id


# ------------------------------------------------------------------- ownership


def test_owning_run_takes_the_longest_run_id_and_nothing_foreign():
    runs = ["nightly", "nightly-2", "20260101T000000Z-abc123"]
    assert owning_run(consumer_id("nightly-2", "RTX_4090-vastai-qwen2:7b"), runs) == "nightly-2"
    assert owning_run(consumer_id("nightly", "RTX_4090-vastai-qwen2:7b", 3), runs) == "nightly"
    assert owning_run("gpubench-20260101T000000Z-abc123-cell-a1", runs) == "20260101T000000Z-abc123"
    assert owning_run("gpubench-someone-elses-run-cell-a1", runs) is None
    assert owning_run("benchmark-worker-nightly-cell", runs) is None  # seed 000's own, not ours
    assert owning_run("gpubench-nightlyX-cell-a1", runs) is None


def test_process_identity_tells_live_dead_reused_and_remote():
    me = ProcessIdentity.current()
    assert me.alive() is True
    assert dead_process().alive() is False
    assert me.model_copy(update={"start": "another-boot:1"}).alive() is False  # the pid was reused
    assert me.model_copy(update={"host": "elsewhere.example"}).alive() is None  # cannot be told
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not pid_alive(zombie.pid), 30, "the child to exit")  # a zombie until reaped: dead
    zombie.wait()


def test_start_run_records_the_owner_and_a_new_owner_takes_over(tmp_path):
    with Manifest(tmp_path / "m.db") as manifest:
        first, second = dead_process(), ProcessIdentity.current()
        add_run(manifest, "r1", first, "http://api")
        row = manifest.run("r1")
        assert (row["pid"], row["pid_start"], row["api"], row["resumed_at"]) == (
            first.pid, first.start, "http://api", None)
        add_run(manifest, "r1", first, "http://api")  # an xdist worker of the same run: no change
        assert manifest.run("r1")["resumed_at"] is None
        manifest.finish_run("r1", "interrupted")
        add_run(manifest, "r1", second, "http://api")  # resumed by another process
        row = manifest.run("r1")
        assert row["pid"] == second.pid and row["finished_at"] is None and row["status"] == "running"
        assert row["resumed_at"]


def test_cleanup_releases_only_what_dead_runs_of_this_manifest_own(tmp_path, sandbox, api, capsys):
    path = tmp_path / "manifest.db"
    url = sandbox.url
    with Manifest(path) as manifest:
        add_run(manifest, "dead", dead_process(), url)
        add_run(manifest, "live", ProcessIdentity.current(), url)
        add_run(manifest, "done", dead_process(), url)
        recorded = rent(api, consumer_id("dead", "cell-a"))
        row_a = add_cell(manifest, "dead", "cell-a", tmp_path, recorded)
        row_b = add_cell(manifest, "dead", "cell-b", tmp_path)  # died between create and record
        unrecorded = rent(api, consumer_id("dead", "cell-b", 2))
        live = rent(api, consumer_id("live", "cell-c"))
        add_cell(manifest, "live", "cell-c", tmp_path, live)
        finished = rent(api, consumer_id("done", "cell-d"))  # the run ended, its release failed
        row_d = add_cell(manifest, "done", "cell-d", tmp_path, finished, cell_status="success")
        manifest.finish_run("done", "passed")
    foreign = rent(api, "someone-else")
    unknown_run = rent(api, consumer_id("not-in-this-manifest", "cell-e"))
    ours = {recorded, unrecorded, finished}
    reports = ["--reports", str(tmp_path)]  # the cells' progress files are under tmp_path/progress

    assert gpubench(["cleanup", "--store", str(path), "--api", url, "--dry-run", *reports]) == 0
    out = capsys.readouterr().out
    for session_id in ours:
        assert f"would release session {session_id}" in out
    assert f"left alone session {live} (run live, cell cell-c)" in out and "still running" in out
    assert foreign not in out and unknown_run not in out
    assert "dry run: nothing was changed" in out
    assert all(status(api, s) == "running" for s in [*ours, live, foreign, unknown_run])

    assert gpubench(["cleanup", "--store", str(path), "--api", url, *reports]) == 0
    out = capsys.readouterr().out
    for session_id in ours:
        assert f"released session {session_id}" in out and "running -> stopped" in out
    assert {s: status(api, s) for s in ours} == dict.fromkeys(ours, "stopped")
    assert {status(api, s) for s in (live, foreign, unknown_run)} == {"running"}  # never touched

    with Manifest(path) as manifest:
        a, b, d = manifest.cell(row_a), manifest.cell(row_b), manifest.cell(row_d)
    assert (a["session_status"], a["released_by"], a["status"]) == ("stopped", "gpubench cleanup", "failed")
    assert a["failure_stage"] == "benchmark"  # from its progress file
    # Its process died, its run did not fail it: the next controller of run "dead" takes it over.
    assert a["failure_reason"] == "abandoned" and "released by gpubench cleanup" in a["error_message"]
    assert (b["session_id"], b["session_status"], b["status"]) == (unrecorded, "stopped", "failed")
    assert (d["session_status"], d["status"]) == ("stopped", "success")  # a finished cell keeps its outcome
    assert "STATUS: CLEANUP" in Path(a["progress_file"]).read_text()

    assert gpubench(["cleanup", "--store", str(path), "--api", url, *reports]) == 0
    out = capsys.readouterr().out
    assert "released" not in out and "would release" not in out
    for session_id in (live, foreign, unknown_run):
        api.post(f"/api/v1/sessions/{session_id}/done")


def test_cleanup_leaves_other_hosts_and_apis_alone_and_closes_dead_sandbox_runs(tmp_path, sandbox, capsys,
                                                                                 monkeypatch):
    path = tmp_path / "manifest.db"
    with Manifest(path) as manifest:
        add_run(manifest, "remote", dead_process().model_copy(update={"host": "elsewhere.example"}), sandbox.url)
        add_run(manifest, "other-api", dead_process(), "http://127.0.0.1:9")
        add_run(manifest, "own-sandbox", dead_process(), "http://127.0.0.1:9", sandbox=True)
        add_cell(manifest, "remote", "c1", tmp_path, "11111111-1111-4111-8111-111111111111")
        add_cell(manifest, "other-api", "c2", tmp_path, "22222222-2222-4222-8222-222222222222")
        row = add_cell(manifest, "own-sandbox", "c3", tmp_path, "33333333-3333-4333-8333-333333333333")
    assert gpubench(["cleanup", "--store", str(path), "--api", sandbox.url]) == 0
    out = capsys.readouterr().out
    assert "left alone session 11111111" in out and "may still be running there" in out
    assert "left alone session 22222222" in out and "gpubench cleanup --api http://127.0.0.1:9" in out
    assert "ended with its sandbox session 33333333" in out
    with Manifest(path) as manifest:
        closed = manifest.cell(row)
        assert closed["session_status"] == "stopped" and closed["released_by"] == "the run's sandbox, on exit"
        assert [s["run_id"] for s in manifest.unreleased_sessions()] == ["remote", "other-api"]
    # Without --api, $GPUBENCH_API_BASE is the API: a run recorded against another is never visited.
    monkeypatch.setenv("GPUBENCH_API_BASE", sandbox.url)
    assert gpubench(["cleanup", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "left alone session 22222222" in out and "gpubench cleanup --api http://127.0.0.1:9" in out


async def _release_all(url: str, leftovers):
    provider = ShopperProvider(ShopperClient(url, token=SANDBOX_TOKEN), Settings(api=url, api_token=SANDBOX_TOKEN))
    try:
        return [await release(provider, lo) for lo in leftovers]
    finally:
        await provider.aclose()


def test_release_copes_with_stopped_missing_and_failed_sessions(sandbox, api):
    import asyncio

    from pytest_gpubench.run.cleanup import Leftover

    stopped = rent(api, "gpubench-x-stopped-a1")
    api.post(f"/api/v1/sessions/{stopped}/done")
    api.post("/sandbox/faults", json={"offer_id": OFFER, "fault": "provision_error", "when": "boot",
                                      "message": "No available public IPs"}).raise_for_status()
    answer = api.post("/api/v1/sessions", json={"consumer_id": "gpubench-x-failed-a1", "offer_id": OFFER,
                                                "workload_type": "interactive", "reservation_hours": 1})
    failed = answer.json()["session"]["id"]
    wait_for(lambda: status(api, failed) == "failed", 60, "the session to fail")
    missing = "44444444-4444-4444-8444-444444444444"
    actions = asyncio.run(_release_all(sandbox.url, [Leftover(session_id=s, run_id="x")
                                                     for s in (stopped, missing, failed)]))
    assert [a.outcome for a in actions] == [ReleaseOutcome.ALREADY_ENDED, ReleaseOutcome.NOT_FOUND, ReleaseOutcome.RELEASED]
    assert (actions[2].before, actions[2].after) == ("failed", "stopped")  # DELETE ended its instance


# ------------------------------------------------------------------ the pieces


def test_stage_reached_follows_the_progress_file(tmp_path):
    log = tmp_path / "cell.log"
    assert stage_reached(str(log)) is Stage.INVENTORY
    writer = ProgressWriter(log)
    writer.status("STARTING")
    writer.status("INVENTORY_QUERY")
    assert stage_reached(str(log)) is Stage.PROVISION
    writer.status("PROVISIONING")
    writer.status("SSH_READY")
    writer.progress(stage="provision", status="running")
    assert stage_reached(str(log)) is Stage.SSH_CONNECT
    writer.close()


def test_sigterm_becomes_an_interrupt_once():
    termination = GracefulTermination()
    if not termination.install():
        pytest.skip("SIGTERM already has a handler in this process")
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode; this never ends normally
        os.kill(os.getpid(), signal.SIGTERM)  # a second one is ignored: teardowns must finish
    finally:
        termination.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_restart_cell_clears_the_earlier_attempt(tmp_path):
    with Manifest(tmp_path / "m.db") as manifest:
        add_run(manifest, "r", dead_process(), None)
        row_id = add_cell(manifest, "r", "c", tmp_path, "55555555-5555-4555-8555-555555555555")
        manifest.finish_cell(row_id, status="failed", failure_stage="results", error_message="min_tps missed")
        assert manifest.restart_cell(row_id) is True
        row = manifest.cell(row_id)
        assert row["status"] == "pending" and row["failure_stage"] is None and row["session_id"] is None
        assert "55555555" in row["notes"]  # the unreleased session is named, not forgotten
        assert manifest.restart_cell(row_id) is False  # pending already: nothing to do
        assert len(manifest.cells("r")) == 1


def test_resume_plan_resolves_last_and_names_the_runs_it_knows(tmp_path):
    path = tmp_path / "m.db"
    with pytest.raises(UsageProblem, match="no manifest at"):
        plan_resume(path, "last")
    with Manifest(path) as manifest:
        for run_id in ("r1", "r2"):
            add_run(manifest, run_id, dead_process(), None)
            add_cell(manifest, run_id, "ok", tmp_path, cell_status="success")
            add_cell(manifest, run_id, "bad", tmp_path, cell_status="failed")
        add_run(manifest, "busy", ProcessIdentity.current(), None)
        manifest.db.execute("UPDATE runs SET started_at = '2000-01-01' WHERE run_id != 'busy'")
        manifest.db.conn.commit()
    plan = plan_resume(path, "r1")
    assert plan.run_id == "r1" and plan.done == ("ok",) and plan.cells == ("ok", "bad")
    # Only the run's unfinished cells run again: not what it never selected, not a Python test's absence.
    assert still_to_run(["ok", "bad", "never-selected", None], plan) == [False, True, False, True]
    assert plan.header() == ("gpubench: resuming run r1: 1 of its 2 cell(s) still to run; cells it did not select "
                             "are deselected; 1 cell(s) already successful are deselected: ok")
    # A run that recorded no cell has no known selection: every cell selected now runs.
    nothing = ResumePlan(run_id="r0")
    assert still_to_run(["ok", "never-selected"], nothing) == [True, True]
    assert "recorded no cells, so every cell selected now runs" in nothing.header()
    with pytest.raises(UsageProblem, match=r"no run 'nope' in the manifest .*: busy, r\d, r\d$"):
        plan_resume(path, "nope")
    with pytest.raises(UsageProblem, match="run busy is still running"):
        plan_resume(path, "last")


def test_resume_with_an_unknown_run_is_a_usage_error(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    manifest_path = tmp_path / "m.db"
    with Manifest(manifest_path) as manifest:
        add_run(manifest, "20260101T000000Z-aaaaaa", dead_process(), None)
    pytester.makefile(".yaml", gpubench_demo="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n")
    # In a subprocess: an in-process run would unload modules it imported, under later tests' feet.
    result = pytester.runpytest_subprocess("--gpubench-store", str(manifest_path), "--gpubench-resume", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpubench-resume: no run 'nope' in the manifest*20260101T000000Z-aaaaaa*"])
    both = pytester.runpytest_subprocess("--gpubench-store", str(manifest_path), "--gpubench-resume", "last",
                                         "--gpubench-run-id", "x")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--gpubench-resume and --gpubench-run-id both name the run*"])


# ------------------------------------------------------- end to end, interrupted

ONE_CELL = "4090 and 1.5b"


def cleanup_command(*args: str) -> tuple[int, str]:
    """``gpubench ARGS`` in this process (the command is a function: a Python process of its own
    would add only its start), with its exit status and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        status = gpubench(list(args))
    return status, printed.getvalue()


def cleanup_finds_nothing(run: PytestRun) -> None:
    """``gpubench cleanup`` afterwards: nothing of the run was left to release."""
    status, printed = cleanup_command("cleanup", "--store", str(run.manifest), "--api", run.url)
    assert status == 0, printed
    assert "nothing to clean up" in printed, printed
    assert active_sessions(run.url) == []


def worker_holding(controller: int, path: Path) -> int:
    """The xdist worker (a child of ``controller``) that has ``path`` open: the one running that cell."""
    from pytest_gpubench.cloud.processes import xdist_worker_pids

    for pid in xdist_worker_pids(controller):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if Path(os.readlink(fd)) == path.resolve():
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no worker of {controller} has {path} open")


@pytest.fixture
def sandbox_url(standalone_sandbox):
    return standalone_sandbox


@pytest.mark.slow
def test_ctrl_c_releases_the_session_in_teardown(tmp_path, sandbox_url):
    run = PytestRun(tmp_path, sandbox_url, "-k", ONE_CELL, "--gpubench-duration", "300")
    run.measuring()
    assert len(active_sessions(sandbox_url)) == 1
    os.killpg(run.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    output = run.finish(timeout=90)  # seconds: the session is released in teardown
    assert run.process.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert active_sessions(sandbox_url) == [], "released in-process, before any cleanup"
    (row,) = run.rows()
    assert (row["session_status"], row["released_by"]) == ("stopped", "teardown"), row
    assert row["status"] == "failed" and row["failure_stage"] == "benchmark"
    assert run.run_row()["status"] == "interrupted" and run.run_row()["finished_at"]
    cleanup_finds_nothing(run)


@pytest.mark.slow
def test_sigterm_to_the_xdist_controller_releases_every_session(tmp_path, sandbox_url):
    # One session per cell, so that both workers measure at once (reuse would queue the
    # two RTX 4090 cells on one worker).
    run = PytestRun(tmp_path, sandbox_url, "-k", "4090", "-n", "2", "--gpubench-duration", "300",
                    "--gpubench-reuse", "cell")
    run.measuring(cells=2)
    assert len(active_sessions(sandbox_url)) == 2
    os.kill(run.process.pid, signal.SIGTERM)  # the controller only, as `kill` or a CI cancel sends it
    output = run.finish()
    assert run.process.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert "SIGTERM" in output
    assert active_sessions(sandbox_url) == [], "released in-process, before any cleanup"
    rows = run.rows()
    assert len(rows) == 2 and {r["session_status"] for r in rows} == {"stopped"}
    # Each worker released its own session in teardown: the controller had nothing left to do.
    assert {r["released_by"] for r in rows} == {"teardown"}, rows
    assert {r["status"] for r in rows} == {"failed"}
    cleanup_finds_nothing(run)


@pytest.mark.slow
def test_a_killed_xdist_worker_s_session_is_released_by_the_controller(tmp_path, sandbox_url):
    run = PytestRun(tmp_path, sandbox_url, "-k", ONE_CELL, "-n", "2", "--gpubench-duration", "300")
    (log,) = run.measuring()
    worker = worker_holding(run.process.pid, log)
    os.kill(worker, signal.SIGKILL)
    output = run.finish()
    assert run.process.returncode == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    assert "crashed" in output and "gpubench: released session" in output
    assert active_sessions(sandbox_url) == [], "the controller released it while the run went on"
    (row,) = run.rows()
    assert row["session_status"] == "stopped"
    assert row["released_by"] == f"the controller, after worker {row['worker']} died", row
    assert (row["status"], row["failure_stage"], row["failure_reason"]) == ("failed", "benchmark", "interrupted")
    assert f"worker {row['worker']} died" in row["error_message"]
    assert run.run_row()["finished_at"]
    cleanup_finds_nothing(run)


#: pytest-timeout's limit on the test's call alone (``timeout_func_only``): 10 s into the benchmark.
TIMEOUT_IN_THE_BENCHMARK = ("--timeout", "10", "-o", "timeout_func_only=true")


@pytest.mark.slow
def test_timeout_signal_method_releases_in_teardown(tmp_path, sandbox_url):
    # The benchmark would take 300 s; the timeout counts the test's call alone (the benchmark, not
    # the renting and installing of its fixtures), so it hits while measuring, however loaded the machine.
    run = PytestRun(tmp_path, sandbox_url, "-k", ONE_CELL, "--gpubench-duration", "300",
                    *TIMEOUT_IN_THE_BENCHMARK, "--timeout-method", "signal")
    run.measuring()
    output = run.finish()
    assert run.process.returncode == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    assert "Timeout" in output
    assert active_sessions(sandbox_url) == [], "released in-process, before any cleanup"
    (row,) = run.rows()
    assert (row["session_status"], row["released_by"]) == ("stopped", "teardown"), row
    assert row["status"] == "failed" and row["failure_stage"] == "benchmark" and "Timeout" in row["error_message"]
    cleanup_finds_nothing(run)


@pytest.mark.slow
def test_timeout_thread_method_leftover_is_released_at_the_next_start(tmp_path, sandbox_url):
    # The thread method ends the process with os._exit: no teardown can run.
    run = PytestRun(tmp_path, sandbox_url, "-k", ONE_CELL, "--gpubench-duration", "300",
                    *TIMEOUT_IN_THE_BENCHMARK, "--timeout-method", "thread")
    run.measuring()
    output = run.finish()
    assert run.process.returncode != 0 and "Timeout" in output, output[-3000:]
    (left,) = active_sessions(sandbox_url)
    (row,) = run.rows()
    assert row["session_id"] == left["id"] and row["status"] == "running" and row["released_by"] is None

    status, printed = cleanup_command("cleanup", "--store", str(run.manifest), "--api", sandbox_url, "--dry-run")
    assert status == 0 and f"would release session {left['id']}" in printed, printed
    assert [s["id"] for s in active_sessions(sandbox_url)] == [left["id"]]  # a dry run changes nothing

    # The next run on the same manifest releases it before running anything (here: nothing).
    after = PytestRun(tmp_path, sandbox_url, "-k", "no_such_cell", name="next")
    output = after.finish()
    assert after.process.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, output[-3000:]
    assert f"gpubench: released session {left['id']}" in output
    assert active_sessions(sandbox_url) == []
    (row,) = run.rows()
    assert row["session_status"] == "stopped" and row["released_by"].startswith("the start of run ")
    assert (row["status"], row["failure_stage"]) == ("failed", "benchmark")
    cleanup_finds_nothing(run)


#: 1 s benchmarks: the resume test checks which cells run again, not what they measure
#: (min_tps 1 passes with any measured rate, 100000 fails with any).
RESUME_MATRIX = """
workload: {duration: 1s, max_tokens: 16, progress_interval: 1s}
matrix:
  - gpu: RTX 4090
    provider: vastai
    model: qwen2:1.5b
  - gpu: RTX 3090
    provider: vastai
    model: qwen2:7b
    thresholds: {min_tps: 100000}
  - gpu: A100 80GB
    provider: vastai
    model: qwen2:7b
"""


@pytest.mark.slow
def test_resume_reruns_only_the_failed_cell_of_the_run_s_selection_into_the_same_run(tmp_path, sandbox_url):
    matrix = tmp_path / "gpubench_resume.yaml"
    matrix.write_text(RESUME_MATRIX)
    first = PytestRun(tmp_path, sandbox_url, "--rootdir", str(tmp_path), "-k", "4090 or 3090", name="first",
                      target=matrix, cache=True)
    output = first.finish()
    assert "1 failed, 1 passed, 1 deselected" in output, output[-3000:]
    before = {r["cell_id"]: r for r in first.rows()}
    assert set(before) == {"RTX_4090-vastai-qwen2:1.5b", "RTX_3090-vastai-qwen2:7b"}  # the A100 was not selected
    run_id = before["RTX_4090-vastai-qwen2:1.5b"]["run_id"]
    assert before["RTX_3090-vastai-qwen2:7b"]["failure_stage"] == "results"

    # pytest's own --lf still knows the matrix item by its stable node id.
    lf = PytestRun(tmp_path, sandbox_url, "--rootdir", str(tmp_path), "--lf", "--collect-only", "-q",
                   name="lf", target=matrix, cache=True)
    output = lf.finish()
    listed = [line for line in output.splitlines() if "::" in line]
    assert listed == ["gpubench_resume.yaml::RTX_3090-vastai-qwen2:7b"], output[-3000:]
    assert "2 deselected" in output

    # The user fixes the impossible threshold, and resumes without repeating -k: the run's
    # selection comes from the manifest, so the A100 cell it never selected stays out.
    matrix.write_text(RESUME_MATRIX.replace("min_tps: 100000", "min_tps: 1"))
    again = PytestRun(tmp_path, sandbox_url, "--rootdir", str(tmp_path), "--gpubench-resume", "last",
                      name="again", target=matrix)
    output = again.finish()
    assert again.process.returncode == 0, output[-3000:]
    assert "1 passed, 2 deselected" in output, output[-3000:]
    assert (f"gpubench: resuming run {run_id}: 1 of its 2 cell(s) still to run; cells it did not select are "
            "deselected; 1 cell(s) already successful are deselected: RTX_4090-vastai-qwen2:1.5b") in output
    after = {r["cell_id"]: r for r in again.rows()}
    assert set(after) == set(before) and {r["run_id"] for r in after.values()} == {run_id}  # updated, not added
    assert after["RTX_4090-vastai-qwen2:1.5b"] == before["RTX_4090-vastai-qwen2:1.5b"]  # not run again
    rerun = after["RTX_3090-vastai-qwen2:7b"]
    assert rerun["status"] == "success" and rerun["failure_stage"] is None and rerun["error_message"] is None
    assert rerun["session_id"] != before["RTX_3090-vastai-qwen2:7b"]["session_id"]
    assert rerun["completed_at"] > before["RTX_3090-vastai-qwen2:7b"]["completed_at"]
    (run_row,) = list(sqlite_utils.Database(again.manifest)["runs"].rows)
    assert run_row["status"] == "passed" and run_row["resumed_at"] and run_row["pid"] == again.process.pid

    # The live terminal shows this attempt only: the first run's lines are in the same
    # progress files, and none of them is replayed.
    live = [line for line in output.splitlines() if line.startswith("gpubench RTX_")]
    assert live and all(line.startswith("gpubench RTX_3090-vastai-qwen2_7b: ") for line in live), live
    assert sum("STATUS: STARTING" in line for line in live) == 1, live
    assert not any("ERROR:" in line or "STATUS: FAILED" in line for line in live), live
    progress = Path(rerun["progress_file"]).read_text()
    assert progress.count("STATUS: STARTING") == 2 and "ERROR: stage=results" in progress  # both attempts kept


CRASH_GROUP_MATRIX = """
workload: {duration: 1s, max_tokens: 16, progress_interval: 1s}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {duration: 300s}}
  - {gpu: RTX 4090, provider: vastai, model: qwen2:1.5b}
"""


@pytest.mark.slow
def test_a_worker_killed_mid_group_fails_its_cell_once_and_the_group_goes_on(tmp_path, sandbox_url):
    matrix = tmp_path / "gpubench_crash.yaml"
    matrix.write_text(CRASH_GROUP_MATRIX)
    run = PytestRun(tmp_path, sandbox_url, "--rootdir", str(tmp_path), "-n", "2", target=matrix)
    (log,) = run.measuring()
    os.kill(worker_holding(run.process.pid, log), signal.SIGKILL)
    output = run.finish(timeout=240)  # a rerun of the crashed 300 s cell would not end in time
    assert run.process.returncode == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    rows = {row["cell_id"]: row for row in run.rows()}
    crashed, rest = rows["RTX_4090-vastai-qwen2:7b"], rows["RTX_4090-vastai-qwen2:1.5b"]
    assert crashed["status"] == "failed" and "died" in crashed["error_message"], crashed
    assert rest["status"] == "success" and rest["session_id"] != crashed["session_id"]  # a new worker, a new session
    assert output.count("crashed") >= 1 and "1 failed, 1 passed" in output, output[-3000:]
    assert active_sessions(sandbox_url) == []
    cleanup_finds_nothing(run)


def test_cleanup_ends_a_dead_runs_gpu_leases_on_hosts_without_asking_any_api(tmp_path, capsys):
    """A ``hosts``/``local`` session is a GPU lease, nothing an API rented: cleanup of a dead run ends
    the lease at once (it would run out anyway) and records the session stopped; a live run's is left."""
    from pytest_gpubench.store.sqlite_store import SqliteStore

    path = tmp_path / "manifest.db"
    with Manifest(path) as manifest:
        add_run(manifest, "dead", dead_process(), "http://127.0.0.1:9")
        add_run(manifest, "alive", ProcessIdentity.current(), "http://127.0.0.1:9")
        row = add_cell(manifest, "dead", "c1", tmp_path, "hosts-lab1-1-abc123")
        add_cell(manifest, "alive", "c2", tmp_path, "hosts-lab2-1-def456")
    with SqliteStore.open(path) as store:
        dead = store.claim_gpus("127.0.0.1:2201", [0], 1, holder=f"dead/{consumer_id('dead', 'c1')}", ttl=600)
        alive = store.claim_gpus("127.0.0.1:2202", [0], 1, holder=f"alive/{consumer_id('alive', 'c2')}", ttl=600)
    assert gpubench(["cleanup", "--store", str(path)]) == 0  # no API reached, none needed
    out = capsys.readouterr().out
    assert "GPU lease ended session hosts-lab1-1-abc123" in out and "left alone session hosts-lab2" in out
    with SqliteStore.open(path) as store:
        held = {lease.lease_id for lease in store.gpu_leases(active_at=time.time())}
        assert held == {alive.lease_id} and dead.lease_id not in held
        assert store.cell(row).session_status == "stopped"
