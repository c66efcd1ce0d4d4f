"""The health check before a benchmark run (run/cell_benchmark.py ``Bench._ensure_healthy``).

Issue 21 (soak): an instance killed between the warm-up and the benchmark made the
health check's restart fail with "ending the ollama serve started earlier: SSH
connection lost", the symptom, where every other stage names the cause (the API
says the instance is gone). The fakes stand for the GPU Shopper client and the
runtime; the session watch and the error are the plugin's own.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_gpubench.errors import InstanceLost, Stage, StageError
from pytest_gpubench.run.cell_benchmark import Bench
from pytest_gpubench.settings import Settings


class StoppedSession:
    """The API's answer for a session whose instance the provider lost."""

    async def get_session(self, session_id: str, stage: Stage = Stage.BENCHMARK) -> SimpleNamespace:
        return SimpleNamespace(id=session_id, status="stopped",
                               error="Instance not found on provider during reconciliation")


class DeadRuntime:
    """A runtime whose server stopped answering and whose restart meets a closed SSH link."""

    async def ensure_healthy(self, timeout: float, stage: Stage, restarting) -> bool:
        restarting("Ollama did not answer /api/version")
        raise StageError(Stage.BENCHMARK, "ending the ollama serve started earlier: SSH connection lost")


def test_a_health_check_that_fails_on_a_lost_instance_names_the_instance():
    run = SimpleNamespace(settings=Settings(time_scale=0.01), provider_for=lambda cloud: StoppedSession())
    recorder = SimpleNamespace(progress=SimpleNamespace(status=lambda *a, **k: None))
    session = SimpleNamespace(session=SimpleNamespace(id="s-1"), cloud="shopper")
    bench = Bench(run, SimpleNamespace(model="qwen2:7b"), recorder, DeadRuntime(), session)
    with pytest.raises(InstanceLost) as lost:
        bench._ensure_healthy()
    assert lost.value.stage is Stage.BENCHMARK
    assert "the instance is gone: the API reports session s-1 stopped: Instance not found" in str(lost.value)


class RunningSession:
    async def get_session(self, session_id: str, stage: Stage = Stage.BENCHMARK) -> SimpleNamespace:
        return SimpleNamespace(id=session_id, status="running", error=None)


class CrashedOnce:
    """A server that crashed during the first run: its health check restarts it (the one restart)."""

    def __init__(self) -> None:
        self.restarts = 0
        self.version = "0.12.4"

    async def ensure_healthy(self, timeout: float, stage: Stage, restarting) -> bool:
        if self.restarts:
            return False
        self.restarts += 1
        restarting("Ollama did not answer /api/version")
        return True

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        return 0.1


def crashing_bench(runtime) -> tuple[Bench, list[str]]:
    statuses: list[str] = []
    progress = SimpleNamespace(status=lambda label, **fields: statuses.append(label), results=lambda result: None)
    recorder = SimpleNamespace(progress=progress, enter=lambda stage: None)
    run = SimpleNamespace(settings=Settings(time_scale=0.01), provider_for=lambda cloud: RunningSession())
    cell = SimpleNamespace(sweep=None, model="qwen2:7b", runs=SimpleNamespace(until_cv=None, count=1, max=1),
                           workload=SimpleNamespace(accuracy=None))
    bench = Bench(run, cell, recorder, runtime, SimpleNamespace(session=SimpleNamespace(id="s-1"), cloud="shopper"))
    return bench, statuses


def test_a_run_spoiled_by_a_server_crash_is_measured_again_after_the_restart():
    """Issue 21 (soak): ``ollama serve`` crashing mid-run made every request fail with
    ConnectionRefusedError and the cell fail at ``results`` with no data; its one restart
    came only before the next run, and there was none. Now the run is measured again."""
    bench, statuses = crashing_bench(CrashedOnce())
    outcomes = [SimpleNamespace(successful=0, records=["refused"] * 4), SimpleNamespace(successful=4, records=[1] * 4)]

    def measure_run(plan, run_index):
        outcome = outcomes.pop(0)
        bench.measurement.runs.append({"decode_tokens_per_second": 50.0 if outcome.successful else 0.0})
        return outcome, []

    bench.plan = lambda run_index: None
    bench.measure_run = measure_run
    figures = SimpleNamespace(avg_tokens_per_second=50.0, total_requests=4, total_tokens=64)
    bench._keep = lambda: SimpleNamespace(output_tokens_per_second=60.0, results=figures)
    bench._judge = lambda result: None
    bench.run()
    assert outcomes == [] and bench.measurement.runs == [{"decode_tokens_per_second": 50.0}]
    assert statuses[:3] == ["RUNTIME_RESTART", "RUNTIME_RESTARTED", "RUN_REPEATED"]


def test_a_run_whose_requests_failed_on_a_server_that_answers_is_not_repeated():
    runtime = CrashedOnce()
    runtime.restarts = 1  # healthy: every request failed for another reason
    bench, statuses = crashing_bench(runtime)
    assert bench._spoiled_by_a_crash(SimpleNamespace(successful=0, records=["stalled"]), 0) is False
    assert bench._spoiled_by_a_crash(SimpleNamespace(successful=2, records=[1, "x"]), 0) is False
    assert statuses == []
