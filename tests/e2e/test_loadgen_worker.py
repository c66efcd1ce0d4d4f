"""The load generator's ``worker`` protocol: seed-004 containers driven over their stdin and stdout.

The containers here are real processes: the sandbox's stand-in worker (the timing
the catalog gives a model) and small scripts that break the contract in one way
each. Every error is a clear per-request error; no process outlives the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_helpers import session_processes
from polling import wait_for

from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan
from pytest_gpubench.measure.gpucheck import processes_with_marker
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.instances import process_cmdline

TTFT_MS, TPS = 40.0, 200.0
#: Set to the test's tmp_path in the load generator's environment, which its workers inherit.
RUN_MARKER = "GPUBENCH_TEST_RUN"
STANDIN = [sys.executable, "-m", "pytest_gpubench.sandbox.worker_standin"]

#: A worker that obeys the contract until ``BREAK`` tells it how to break (after two deltas).
FAKE = textwrap.dedent('''
    import json, os, sys, time
    def emit(**event):
        sys.stdout.write(json.dumps(event) + "\\n"); sys.stdout.flush()
    mode = os.environ.get("BREAK", "")
    if mode == "never-starts":
        sys.stderr.write("docker: Error response from daemon: pull access denied\\n"); sys.exit(125)
    emit(event="connection", status="connected")
    for line in sys.stdin:
        request = json.loads(line)
        for n in range(3):
            if n == 2 and mode == "crash":
                sys.stderr.write("RuntimeError: CUDA error: out of memory\\n"); sys.exit(3)
            if n == 2 and mode == "late-stderr":  # stdout ends first, its last words come after
                os.close(1); time.sleep(0.3)
                sys.stderr.write("RuntimeError: CUDA error: out of memory\\n"); sys.exit(3)
            if n == 2 and mode == "no-finish":
                sys.exit(0)
            if n == 2 and mode == "stall":
                time.sleep(60)
            emit(event="text_delta", delta="word ")
            time.sleep(0.01)
        for bad in {"not-json": ["oops, a print()"], "not-object": ["[1, 2]"], "no-event": ['{"delta": "x"}']}.get(mode, []):
            sys.stdout.write(bad + "\\n"); sys.stdout.flush()
        if mode == "failed":
            emit(event="finish", status="failed", message="CUDA error: an illegal memory access")
        else:
            emit(event="text", content="word word word ")
            emit(event="finish", status="completed")
''')


def run_loadgen(tmp_path: Path, command: list[str], env: dict[str, str] | None = None, **extra) -> list[dict]:
    config = BenchmarkPlan(model="qwen2:7b", duration=1.0, max_tokens=24, prompts=["hello there", "a haiku"],
                           warmup_requests=1, progress_interval=0.5, checkpoint_every=5,
                           checkpoint_path=str(tmp_path / "ck.json"), concurrency=2, request_timeout=5,
                           protocol="worker", worker_command=command).config("docker://worker")
    config.update(extra)
    environ = {**os.environ, "GPUBENCH_WORKER_TTFT_MS": str(TTFT_MS), "GPUBENCH_WORKER_TPS": str(TPS),
               "MODEL_NAME": "qwen2:7b", **(env or {})}
    environ.pop("GPUBENCH_SANDBOX_INSTANCE", None)
    environ[RUN_MARKER] = str(tmp_path)  # its workers inherit it: leftovers() finds this test's alone
    done = subprocess.run([sys.executable, "-", json.dumps(config)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120, env=environ)
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def fake(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(FAKE)
    return ["env", f"BREAK={mode}", sys.executable, str(script)]


def measured(events: list[dict]) -> list[RequestRecord]:
    return [RequestRecord.model_validate(e) for e in events if e["event"] == "request" and not e["warmup"]]


def leftovers(tmp_path: Path, program: str) -> list[str]:
    """``program``'s processes that this test's load generator started, still alive."""
    lines = (process_cmdline(pid).replace(b"\0", b" ").decode(errors="replace").strip()
             for pid in processes_with_marker(RUN_MARKER, str(tmp_path)))
    return [line for line in lines if program in line]


def test_session_workers_give_the_models_ttft_and_decode_rate_and_end_with_the_run(tmp_path):
    events = run_loadgen(tmp_path, STANDIN)
    finish = events[-1]
    assert finish["event"] == "finish" and finish["status"] == "completed", finish
    records = measured(events)
    assert len(records) >= 6 and all(r.ok and r.output_tokens > 0 for r in records)
    ttfts = sorted(r.ttft_ms for r in records)
    assert TTFT_MS <= ttfts[len(ttfts) // 2] < TTFT_MS * 1.5  # from the request line written, not the start
    rates = sorted(r.tokens_per_second for r in records)
    assert TPS * 0.9 < rates[len(rates) // 2] < TPS * 1.1
    # Output tokens are the client's count of text_delta events: workers report none.
    assert all(r.eval_count is None for r in records)
    # Two containers (the concurrency), each up before the clock, announced once per status.
    statuses = [(e["status"], e["container"]) for e in events if e["event"] == "worker" and "container" in e]
    # Whichever container says a status first is the one shown: both start at once.
    assert sorted(status for status, _ in statuses) == ["loading", "ready"]
    assert {container for _, container in statuses} <= {0, 1}
    assert leftovers(tmp_path, "pytest_gpubench.sandbox.worker_standin") == []


def test_one_off_workers_start_a_container_per_request_with_the_start_kept_apart(tmp_path):
    events = run_loadgen(tmp_path, STANDIN, env={"WORKER_MODE": "one-off"}, concurrency=1)
    records = measured(events)
    assert records and all(r.ok for r in records), [r.error for r in records]
    raw = [e for e in events if e["event"] == "request" and not e["warmup"]]
    assert all(e["startup_ms"] > 0 for e in raw[1:])  # each after the first waited for its container
    assert sorted(r.ttft_ms for r in records)[len(records) // 2] < TTFT_MS * 1.5  # and that is not TTFT
    assert ("cleaning_up", 0) in [(e["status"], e["container"]) for e in events if "container" in e]


@pytest.mark.parametrize(("mode", "error"), [
    ("not-json", "malformed worker output: not JSON: 'oops, a print()'"),
    ("not-object", "malformed worker output: not a JSON object: '[1, 2]'"),
    ("no-event", "malformed worker output: no \"event\" name: '{\"delta\": \"x\"}'"),
    ("failed", "worker finished with status failed: CUDA error: an illegal memory access"),
    ("crash", "worker exited with status 3 before its finish event; its stderr ends: "
              "RuntimeError: CUDA error: out of memory"),
    ("late-stderr", "worker exited with status 3 before its finish event; its stderr ends: "
                    "RuntimeError: CUDA error: out of memory"),
    ("no-finish", "worker exited before its finish event"),
    ("stall", "stalled: no data for 1 s (stall timeout)"),
])
def test_a_worker_breaking_the_contract_is_a_clear_request_error(tmp_path, mode, error):
    # Only the stall needs the 1 s stall timeout; elsewhere it would time out a worker that a busy
    # machine is slow to start, failing the request with a stall instead of the fault under test.
    events = run_loadgen(tmp_path, fake(tmp_path, mode), **({"request_timeout": 1} if mode == "stall" else {}))
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert records and all(r.error == error for r in records), [r.error for r in records if r.error != error]
    broke_mid_stream = mode in ("crash", "late-stderr", "no-finish", "stall")
    assert all(r.output_tokens == (2 if broke_mid_stream else 3) for r in records)  # what arrived is kept
    assert events[-1]["status"] == "completed"  # the run goes on; each request failed on its own
    assert leftovers(tmp_path, str(tmp_path / "worker.py")) == []


def test_a_worker_that_never_starts_fails_the_run_with_its_reason(tmp_path):
    events = run_loadgen(tmp_path, fake(tmp_path, "never-starts"))
    finish = events[-1]
    assert finish["event"] == "finish" and finish["status"] == "failed"
    assert finish["message"] == ("RuntimeError: the worker did not start: exited with status 125; its stderr ends: "
                                 "docker: Error response from daemon: pull access denied")


def test_leftovers_are_the_tests_own_processes_found_while_they_live(tmp_path):
    """What the leftover checks above rely on: a process carrying the marker is found until it ends,
    and one of another test's (another tmp_path) never is."""
    mine = subprocess.Popen(["sleep", "60"], env={**os.environ, RUN_MARKER: str(tmp_path)})
    theirs = subprocess.Popen(["sleep", "60"], env={**os.environ, RUN_MARKER: str(tmp_path / "other")})
    try:
        # Between fork and exec a child still carries this process's environment and command line.
        assert wait_for(lambda: leftovers(tmp_path, "sleep"), 30, "sleep's exec") == ["sleep 60"]
    finally:
        for process in (mine, theirs):
            process.kill()
            process.wait()
    assert leftovers(tmp_path, "sleep") == []


def test_a_sandbox_sessions_processes_are_found_by_its_instance_in_their_environment(tmp_path):
    """What test_worker_runtime's leftover check relies on: a process of session ``s-1`` (its
    instance path in ``GPUBENCH_SANDBOX_INSTANCE``) is found, one of session ``s-2`` is not."""
    def instance(session: str) -> dict[str, str]:
        return {**os.environ, "GPUBENCH_SANDBOX_INSTANCE": f"{tmp_path}/instances/{session}/i.json"}

    mine = subprocess.Popen(["sleep", "61"], env=instance("s-1"))
    theirs = subprocess.Popen(["sleep", "62"], env=instance("s-2"))
    try:
        # Between fork and exec a child still carries this process's environment and command line.
        assert wait_for(lambda: session_processes("s-1"), 30, "sleep's exec") == ["sleep 61"]
    finally:
        for process in (mine, theirs):
            process.kill()
            process.wait()
    assert session_processes("s-1") == []
