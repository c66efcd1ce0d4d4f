"""The health check before a benchmark run (plugin/cell_benchmark.py ``Bench._ensure_healthy``).

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
from pytest_gpubench.plugin.cell_benchmark import Bench
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
