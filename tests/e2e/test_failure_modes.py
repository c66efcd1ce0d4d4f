"""Issue 4: failures during a run are noticed fast, and nothing measured is lost.

From plain functions up: the VRAM and result checks; the load generator against
the Ollama stand-in with a stalled stream; the session watch, Ollama's restart and
checkpoint recovery against the in-process sandbox over real SSH; then pytest end
to end against a standalone sandbox, faults injected while cells run.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import sqlite_utils
from e2e_helpers import (QUICK, REPO, SANDBOX_AUTH, SANDBOX_TOKEN, manifest_rows, pytest_env, run_pytest,
                         sandbox_sessions)
from polling import wait_for
from sandbox_session import connect, new_session
from standin_helpers import Server, write_instance

from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan, run_benchmark
from pytest_gpubench.errors import BenchmarkInterrupted, Stage, StageError
from pytest_gpubench.matrix.cells import SEED_PROMPTS
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.measure.validity import result_problems
from pytest_gpubench.measure.results import BenchmarkResult, summarize
from pytest_gpubench.remote.readings import GPUStats, HardwareInfo, RequestRecord
from pytest_gpubench.runtimes.ollama import SERVE_PID, OllamaRuntime
from pytest_gpubench.sandbox.standin_state import StateStore, StreamFault
from pytest_gpubench.settings import Settings
from pytest_gpubench.cloud.shopper_client import ShopperClient
from pytest_gpubench.runtimes.base import vram_shortfall
from pytest_gpubench.cloud.watch import SessionWatch
from pytest_gpubench.errors import InstanceLost

TIME_SCALE = 0.01  # the in-process sandbox of tests/e2e/conftest.py
GHOST_ERROR = "Instance not found on provider during reconciliation"
MODEL = "qwen2:1.5b"


# ------------------------------------------------------------------ plain checks


def hardware(mib: int, count: int = 1) -> HardwareInfo:
    return HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_mib=mib, gpu_count=count)


def test_vram_check_counts_memory_as_offers_do():
    # An RTX 4090 shows 24564 MiB (23.99 GiB): a model needing 24 GB must not be refused.
    assert vram_shortfall("deepseek-r1:32b", 24, hardware(24564)) is None
    assert vram_shortfall("llama3:70b", 48, hardware(24564, count=2)) is None  # split over two cards
    assert vram_shortfall("qwen2:7b", 8, hardware(0)) is None  # unknown memory is no reason to skip
    assert vram_shortfall("qwen2:7b", 8, None) is None
    reason = vram_shortfall("deepseek-r1:70b", 48, hardware(24564))
    assert reason == ("deepseek-r1:70b needs 48 GB of VRAM, but nvidia-smi on the instance reports 24564 MiB "
                      "(NVIDIA GeForce RTX 4090, 24.0 GB in all): not pulled")


def record(index: int, **fields: Any) -> RequestRecord:
    base = {"index": index, "prompt_index": 0, "started_at": 0.0, "latency_ms": 100.0, "output_tokens": 10,
            "eval_count": 10, "ttft_ms": 20.0, "tokens_per_second": 100.0}
    return RequestRecord.model_validate({**base, **fields})


def result_of(records: list[RequestRecord], **gpu: float) -> BenchmarkResult:
    return BenchmarkResult(results=summarize(records, 10.0), gpu_stats=GPUStats(**gpu))


def test_result_checks_flag_only_what_cannot_be_right():
    assert result_problems(result_of([record(0), record(1)])) == []
    assert result_problems(result_of([record(0, error="HTTP 500: boom", output_tokens=0)])) == [
        "no successful request (1 measured, 1 failed)"]
    assert result_problems(result_of([record(0, output_tokens=0, eval_count=0, tokens_per_second=None)])) == [
        "no output tokens in 1 successful requests"]
    nan = result_problems(result_of([record(0, tokens_per_second=math.nan)]))
    assert "results.avg_tokens_per_second is nan" in nan
    assert result_problems(result_of([record(0)], avg_power_draw_w=-5.0)) == [
        "gpu_stats.avg_power_draw_w is negative (-5)"]


def test_stall_timeout_is_scaled_but_not_below_its_floor():
    assert Settings(time_scale=1.0).stall_seconds(120) == 120
    assert Settings(time_scale=0.02).stall_seconds(120) == 5.0  # 2.4 s would flake on a busy machine
    assert Settings(time_scale=0.02).stall_seconds(1000) == 20.0
    assert Settings(time_scale=0.02).stall_seconds(2) == 2.0  # asked for less than the floor: as asked


# ------------------------------------------------- load generator vs the stand-in


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    # One slot: a stalled request that kept its slot would hold up every later one.
    server = Server(write_instance(tmp_path_factory.mktemp("failure-modes")), OLLAMA_NUM_PARALLEL="1")
    server.pull("qwen2:7b")
    yield server
    server.stop()


def arm(server: Server, *faults: StreamFault) -> None:
    StateStore(server.instance.parent / "state").write_stream_faults(list(faults))


def run_loadgen(config: dict[str, Any]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-", json.dumps(config)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def loadgen_config(url: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    plan = BenchmarkPlan(model="qwen2:7b", duration=2.5, max_tokens=24, prompts=SEED_PROMPTS, warmup_requests=0,
                         progress_interval=0.5, checkpoint_every=2, checkpoint_path=str(tmp_path / "ck.json"),
                         request_timeout=1.0)
    return {**plan.config(url), **extra}


def test_a_stalled_stream_is_one_error_and_the_run_goes_on(standin, tmp_path):
    arm(standin, StreamFault(id=uuid.uuid4().int % 10**9, kind="stall", after_tokens=3, times=1))
    try:
        events = run_loadgen(loadgen_config(standin.url, tmp_path))
    finally:
        arm(standin)
    assert events[-1]["event"] == "finish" and events[-1]["status"] == "completed"
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    stalled, fine = records[0], records[1:]
    assert stalled.error == "stalled: no data for 1 s (stall timeout)"
    assert stalled.output_tokens == 3 and stalled.latency_ms >= 1000
    # The stand-in let go of its only slot when the client gave up: later requests ran.
    assert len(fine) >= 3 and all(r.ok and 0 < r.output_tokens == r.eval_count for r in fine)


def test_empty_answers_make_an_invalid_result(standin, tmp_path):
    arm(standin, StreamFault(id=uuid.uuid4().int % 10**9, kind="empty"))
    try:
        events = run_loadgen(loadgen_config(standin.url, tmp_path, duration=0.5))
    finally:
        arm(standin)
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert records and all(r.ok and r.output_tokens == 0 and r.eval_count == 0 for r in records)
    problems = result_problems(result_of(records))
    assert problems == [f"no output tokens in {len(records)} successful requests"]


# ------------------------------------------------ against the in-process sandbox


async def ready_runtime(conn: Connection) -> OllamaRuntime:
    runtime = OllamaRuntime(conn)
    await runtime.ensure_installed(60)
    await runtime.locate(30)
    await runtime.ensure_serving(60, num_parallel=2)
    await runtime.pull(MODEL, 120)
    return runtime


def fault(api: httpx.Client, **body: Any) -> dict[str, Any]:
    response = api.post("/sandbox/faults", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_session_watch_names_the_reason_of_an_instance_that_vanished_silently(sandbox, api):
    session, key = new_session(api)

    async def scenario() -> tuple[InstanceLost, float, bool, int]:
        conn = await connect(session, key)
        client = ShopperClient(sandbox.url, token=SANDBOX_TOKEN)
        try:
            async with SessionWatch(client, session["id"], interval=0.2) as watch:
                long_command = conn.run("sleep 120", stage=Stage.BENCHMARK, what="a long command", timeout=300)
                guarded = asyncio.ensure_future(watch.guard(long_command))
                await asyncio.sleep(0.5)
                assert not guarded.done() and not watch.lost.is_set() and watch.polls >= 1
                killed_at = time.monotonic()
                await asyncio.to_thread(fault, api, fault="kill_instance", session_id=session["id"], silent=True)
                with pytest.raises(InstanceLost) as lost:
                    await guarded
                noticed = time.monotonic() - killed_at
                # Silent: SSH itself said nothing; only the API told.
                silent_link = not conn.closed
                return lost.value, noticed, silent_link, watch.failed_polls
        finally:
            conn.abort()
            await client.aclose()

    error, noticed, silent_link, failed_polls = asyncio.run(scenario())
    assert error.stage is Stage.BENCHMARK and silent_link and failed_polls == 0
    assert str(error).startswith(f"the instance is gone: the API reports session {session['id']} stopped: "
                                 f"{GHOST_ERROR} (")
    assert noticed < 10  # polled every 0.2 s; generous for a busy machine


def test_session_watch_ends_even_when_a_poll_swallows_its_cancellation():
    class Swallowing(SessionWatch):
        """A poll that loses the cancel, as asyncio.wait_for can before Python 3.12."""

        async def check(self) -> bool:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                pass
            return False

    async def scenario() -> bool:
        async def watched() -> None:
            async with Swallowing(None, "some-session", interval=0.005):
                await asyncio.sleep(0.1)  # several polls, then the exit cancels one mid-call

        task = asyncio.ensure_future(watched())
        done, _ = await asyncio.wait({task}, timeout=10)
        task.cancel()
        return bool(done)

    assert asyncio.run(scenario()), "the watch never ended"


def test_a_failure_is_blamed_on_a_lost_instance_the_api_reports_a_moment_later():
    class LateApi:
        """Reports the instance stopped from the third status poll on."""

        def __init__(self) -> None:
            self.polls = 0

        async def get_session(self, session_id, stage):
            self.polls += 1
            status = "stopped" if self.polls >= 3 else "running"
            return SimpleNamespace(status=status, error="Instance not found on provider during reconciliation")

    async def broken_link() -> None:
        raise OSError("SSH connection lost")

    async def scenario() -> StageError:
        watch = SessionWatch(LateApi(), "some-session", interval=0.01)
        with pytest.raises(StageError) as lost:
            await watch.guard(broken_link(), Stage.RUNTIME_SETUP)
        return lost.value

    error = asyncio.run(scenario())
    assert error.stage is Stage.RUNTIME_SETUP and "reports session some-session stopped" in str(error)


def test_session_watch_rides_out_an_api_that_does_not_answer():
    async def scenario() -> tuple[bool, int, bool]:
        client = ShopperClient("http://127.0.0.1:9")  # nothing listens on the discard port
        try:
            watch = SessionWatch(client, "some-session", interval=0.1)
            return await watch.check(), watch.failed_polls, watch.lost.is_set()
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (False, 1, False)


def test_ollama_that_crashed_is_restarted_once_then_the_cell_fails(sandbox, api):
    session, key = new_session(api)
    reasons: list[str] = []

    async def scenario() -> tuple[bool, bool, StageError]:
        conn = await connect(session, key)
        try:
            runtime = await ready_runtime(conn)
            healthy = await runtime.ensure_healthy(30, on_restart=reasons.append)
            await asyncio.to_thread(fault, api, fault="stop_ollama", session_id=session["id"])
            restarted = await runtime.ensure_healthy(30, on_restart=reasons.append)
            await runtime.warm_up(MODEL, 60, cold_start=False)  # the model loads again after the restart
            await asyncio.to_thread(fault, api, fault="stop_ollama", session_id=session["id"])
            with pytest.raises(StageError) as second:
                await runtime.ensure_healthy(30, on_restart=reasons.append)
            return healthy, restarted, second.value
        finally:
            await conn.close()

    healthy, restarted, second = asyncio.run(scenario())
    assert (healthy, restarted) == (False, True)
    assert len(reasons) == 1 and reasons[0].endswith("did not answer /api/version")
    assert second.stage is Stage.BENCHMARK
    assert "stopped answering again after its one restart" in str(second)


def test_a_hung_ollama_is_ended_and_restarted(sandbox, api):
    session, key = new_session(api)
    reasons: list[str] = []

    async def scenario() -> tuple[bool, int, int]:
        conn = await connect(session, key)
        try:
            runtime = await ready_runtime(conn)
            hung = (await asyncio.to_thread(fault, api, fault="stop_ollama", session_id=session["id"], hang=True))
            restarted = await runtime.ensure_healthy(30, on_restart=reasons.append)
            await runtime.warm_up(MODEL, 60, cold_start=False)  # the new server serves the model
            serving = int((await conn.run(f"cat {SERVE_PID}", stage=Stage.BENCHMARK, what="pid", timeout=30)).stdout)
            return restarted, hung["stopped_pid"], serving
        finally:
            await conn.close()

    restarted, hung_pid, serving_pid = asyncio.run(scenario())
    assert restarted and len(reasons) == 1
    assert serving_pid != hung_pid
    # The hung server was ended, not left holding the port.
    assert not Path(f"/proc/{hung_pid}").exists() or "Z" in Path(f"/proc/{hung_pid}/stat").read_text().split()[2]


def test_a_lost_connection_keeps_every_record_through_the_checkpoint(sandbox, api):
    session, key = new_session(api)
    plan = BenchmarkPlan(model=MODEL, duration=5.0, max_tokens=24, prompts=SEED_PROMPTS, warmup_requests=1,
                         progress_interval=0.5, checkpoint_every=2,
                         checkpoint_path=f".gpubench/issue4/{uuid.uuid4().hex}.checkpoint.json")

    async def scenario() -> BenchmarkInterrupted:
        conn = await connect(session, key)
        runtime = await ready_runtime(conn)
        measuring = asyncio.Event()

        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "progress":
                measuring.set()

        async def drop_when_measuring() -> None:
            await measuring.wait()
            body = await asyncio.to_thread(fault, api, fault="drop_ssh", session_id=session["id"])
            assert body["dropped_connections"] >= 1

        dropper = asyncio.ensure_future(drop_when_measuring())
        try:
            with pytest.raises(BenchmarkInterrupted) as interrupted:
                await run_benchmark(conn, plan, remote_server_url=runtime.remote_url, local_server_url=runtime.url,
                                    timeout=120, on_event=on_event, reconnect=lambda: connect(session, key))
            await dropper
        finally:
            dropper.cancel()
            conn.abort()
        return interrupted.value

    error = asyncio.run(scenario())
    outcome = error.partial
    assert error.stage is Stage.BENCHMARK
    assert "stream broke off" in str(error) and "recovered from the instance's checkpoint" in str(error)
    assert "(the run there ended completed)" in str(error)
    indexes = [r.index for r in outcome.records]
    assert indexes == sorted(set(indexes)) == list(range(len(indexes)))  # merged, none twice, none missing
    assert outcome.recovered > 0
    # The generator ran on to its end after the drop: records up to the end of the run came back.
    last = max(r.scheduled_at for r in outcome.measured)
    assert last > plan.duration - 1.5
    assert outcome.duration_seconds >= plan.duration - 0.5


# ------------------------------------------------------- end to end, pytest as a user runs it


def start_pytest(tmp_path: Path, url: str, *args: str) -> subprocess.Popen[str]:
    env = pytest_env()  # the sandbox's token
    command = [sys.executable, "-m", "pytest", str(QUICK), "-p", "no:cacheprovider", "-k", "4090 and 1.5b",
               "--gpubench-api", url, "--gpubench-time-scale", "0.02", "--gpubench-progress-interval", "0.5",
               "--gpubench-reports", str(tmp_path / "reports"),
               "--gpubench-store", str(tmp_path / "reports" / "manifest.db"), *args]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def measuring_session(tmp_path: Path, url: str) -> str:
    """Wait until the cell's benchmark reports progress; return its session id."""
    wait_for(lambda: any("PROGRESS: requests=" in p.read_text() for p in (tmp_path / "reports").rglob("*.log")),
             120, "the benchmark to report progress")
    (session,) = [s for s in sandbox_sessions(url) if s["status"] == "running"]
    return session["id"]


def finish(run: subprocess.Popen[str], timeout: float = 180) -> str:
    try:
        output, _ = run.communicate(timeout=timeout)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return output


def db(tmp_path: Path) -> sqlite_utils.Database:
    return sqlite_utils.Database(tmp_path / "reports" / "manifest.db")


@pytest.mark.slow
def test_instance_stopped_silently_mid_benchmark_ends_the_cell_in_seconds(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    # 60 s of benchmark: the stage's own timeout is 60 + 600 s, the SSH link will say nothing.
    run = start_pytest(tmp_path, url, "--gpubench-duration", "60")
    try:
        session_id = measuring_session(tmp_path, url)
        killed_at = time.monotonic()
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
                   json={"fault": "kill_instance", "session_id": session_id,
                                                  "silent": True}).raise_for_status()
        output = finish(run)
        ended_after = time.monotonic() - killed_at
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, output[-3000:]
    assert ended_after < 30, output[-3000:]  # seconds, not the stage timeout
    assert "[benchmark] benchmark interrupted after" in output
    assert f"the API reports session {session_id} stopped: {GHOST_ERROR}" in output
    assert "Traceback" not in output
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "partial" and row["failure_stage"] == "benchmark"
    assert GHOST_ERROR in row["error_message"]
    assert row["total_requests"] > 0 and row["decode_tokens_per_second"] > 0 and row["benchmark_id"]  # kept


@pytest.mark.slow
def test_connection_lost_mid_benchmark_recovers_the_instance_checkpoint(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    duration = 8.0
    run = start_pytest(tmp_path, url, "--gpubench-duration", str(duration))
    try:
        session_id = measuring_session(tmp_path, url)
        dropped = httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
                             json={"fault": "drop_ssh", "session_id": session_id})
        dropped.raise_for_status()
        output = finish(run)
    finally:
        if run.poll() is None:
            run.kill()
    assert dropped.json()["dropped_connections"] >= 1
    assert run.returncode == 1, output[-3000:]
    assert "recovered from the instance's checkpoint (the run there ended completed)" in output
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "partial" and row["failure_stage"] == "benchmark"
    requests = [r for r in db(tmp_path)["requests"].rows if not r["warmup"]]
    assert len(requests) == row["total_requests"] > 0
    assert len({r["index"] for r in requests}) == len(requests)  # merged without duplicates
    # The stream broke at the first progress line (about 0.5 s in): what ran after came from the checkpoint.
    assert max(r["scheduled_at"] for r in requests) > duration - 2


@pytest.mark.slow
def test_a_stalled_request_is_an_error_and_the_cell_goes_on(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    run = start_pytest(tmp_path, url, "--gpubench-duration", "8", "--gpubench-stall-timeout", "2")
    try:
        session_id = measuring_session(tmp_path, url)
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
                   json={"fault": "stall_stream", "session_id": session_id,
                                                  "after_tokens": 2, "times": 1}).raise_for_status()
        output = finish(run)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "success" and row["error_count"] == 1
    errors = [r for r in db(tmp_path)["requests"].rows if r["error"]]
    assert [e["error"] for e in errors] == ["stalled: no data for 2 s (stall timeout)"]
    later = [r for r in db(tmp_path)["requests"].rows if r["index"] > errors[0]["index"]]
    assert later and all(r["error"] is None for r in later)  # the run went on


@pytest.mark.slow
def test_model_too_large_for_the_gpu_is_skipped_before_the_pull(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    # Every RTX 4090 listing is wrong: the machines really have a 4 GB card.
    offers = httpx.get(f"{url}/api/v1/inventory", headers=SANDBOX_AUTH,
                       params={"provider": "vastai", "gpu_type": "RTX 4090"}).json()
    for offer in offers["offers"]:
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH, json={"fault": "gpu_memory", "offer_id": offer["id"],
                                                  "memory_mib": 4096}).raise_for_status()
    done = run_pytest(tmp_path, str(QUICK), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "-k", "4090 and 7b", "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 skipped" in done.stdout
    assert ("[model_pull] qwen2:7b needs 8 GB of VRAM, but nvidia-smi on the instance reports 4096 MiB "
            "(NVIDIA GeForce RTX 4090, 4.0 GB in all): not pulled") in done.stdout
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("skipped", "model_pull")
    assert "needs 8 GB of VRAM" in row["error_message"] and row["session_status"] == "stopped"
    progress = Path(row["progress_file"]).read_text()
    assert "SYSTEM_INFO" in progress and "memory_mib=4096" in progress
    assert "stage=model_pull" not in progress and "OLLAMA_INSTALLED" not in progress  # nothing pulled


BODIES = '''
import os

import httpx
import pytest

API = {api!r}
#: The sandbox's token, as the plugin gets it (the test run's GPUBENCH_API_TOKEN).
SANDBOX_AUTH = {{"Authorization": "Bearer " + os.environ["GPUBENCH_API_TOKEN"]}}


def fault(**body):
    httpx.post(API + "/sandbox/faults", headers=SANDBOX_AUTH, json=body).raise_for_status()


@pytest.mark.gpubench({matrix!r}, gpu="RTX4090", model="qwen2:1.5b")
def test_ollama_crashed_before_the_run(gpubench):
    fault(fault="stop_ollama", session_id=gpubench.session.session.id)
    assert gpubench.run().results.total_errors == 0


@pytest.mark.gpubench({matrix!r}, gpu="RTX4090", model="qwen2:1.5b")
def test_answers_without_tokens(gpubench):
    fault(fault="empty_output", session_id=gpubench.session.session.id)
    gpubench.run()
'''


@pytest.mark.slow
def test_ollama_restarted_once_and_invalid_results_kept_raw(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    test_file = tmp_path / "test_bodies.py"
    test_file.write_text(BODIES.format(api=url, matrix=str(QUICK)))
    done = run_pytest(tmp_path, str(test_file), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--gpubench-duration", "2", "--rootdir", str(tmp_path))
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    rows = {r["cell_id"].split("@")[1]: r for r in manifest_rows(tmp_path)}

    restarted = rows["test_ollama_crashed_before_the_run"]
    assert restarted["status"] == "success" and restarted["total_requests"] > 0
    progress = Path(restarted["progress_file"]).read_text()
    assert "STATUS: RUNTIME_RESTART reason=" in progress and "did not answer /api/version" in progress
    assert "STATUS: RUNTIME_RESTARTED version=" in progress

    invalid = rows["test_answers_without_tokens"]
    assert (invalid["status"], invalid["failure_stage"]) == ("failed", "results")
    assert "the result failed validation: no output tokens in" in invalid["error_message"]
    assert invalid["benchmark_id"] is None  # not recorded as a measurement
    (kept,) = (tmp_path / "reports" / "invalid").rglob("*.json")
    assert str(kept) in invalid["error_message"]
    raw = json.loads(kept.read_text())
    assert raw["problems"] == [invalid["error_message"].split("validation: ", 1)[1].split("; kept raw")[0]]
    assert raw["result"]["results"]["total_tokens"] == 0 and raw["records"]
    assert 'ERROR: stage=results message="the result failed validation: no output tokens in' in done.stdout


@pytest.mark.slow
def test_instance_killed_during_the_install_is_named_as_the_cause(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    env = pytest_env()  # the sandbox's token
    # The cheapest RTX 3090 has no Ollama: the (slow) install command runs, and the
    # instance dies under it.
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(QUICK), "-p", "no:cacheprovider", "-k", "3090",
         "--gpubench-api", url, "--gpubench-time-scale", "0.02", "--gpubench-ollama-install", "sleep 300",
         "--gpubench-reports", str(tmp_path / "reports"),
         "--gpubench-store", str(tmp_path / "reports" / "manifest.db")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: any("SYSTEM_INFO" in p.read_text() for p in (tmp_path / "reports").rglob("*.log")),
                 120, "the cell to reach the install")
        (session,) = [s for s in sandbox_sessions(url) if s["status"] == "running"]
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
                   json={"fault": "kill_instance", "session_id": session["id"]}
                   ).raise_for_status()
        output = finish(run, timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, output[-3000:]
    assert f"[runtime_setup] the instance is gone: the API reports session {session['id']} stopped" in output, \
        output[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "runtime_setup")
    assert GHOST_ERROR in row["error_message"]
