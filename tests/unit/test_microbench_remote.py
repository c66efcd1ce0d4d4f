"""Torch on the instance and the script run there (measure/microbench.py), through a real shell
(``LocalShell``, the Connection interface on this machine, whose python3 has no torch): a failed
pip install names the stage and pip's error, the venv install from a wheel is found again without
installing twice, the script's events come back, and an error event fails the benchmark stage."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pytest_gpubench.errors import RemoteCommandError, Stage, StageError
from pytest_gpubench.remote.local import LocalShell
from pytest_gpubench.measure.microbench import TORCH_VENV, ensure_torch, run_microbench
from pytest_gpubench.sandbox.instances import build_torch_wheel

PLAN = {"kinds": ["memory_bandwidth"], "runs": 2, "warmup": 0, "memory_mib": 16, "matmul_size": 256,
        "precisions": []}


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def shell_with_wheels(monkeypatch: pytest.MonkeyPatch, wheels: Path) -> LocalShell:
    # pip's own environment settings, as a sandbox instance (or a user's mirror) sets them.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.delenv("PYTHONPATH", raising=False)  # nothing of this checkout leaks into the venv
    return LocalShell.open()


@pytest.mark.slow  # a venv and pip: seconds
def test_a_failing_pip_install_is_an_install_stage_error_with_pips_words(tmp_path, monkeypatch) -> None:
    (tmp_path / "empty").mkdir()
    shell = shell_with_wheels(monkeypatch, tmp_path / "empty")
    try:
        with pytest.raises(RemoteCommandError) as caught:
            run(ensure_torch(shell, timeout=120))
    finally:
        run(shell.close())
    assert caught.value.stage is Stage.RUNTIME_SETUP and caught.value.exit_status == 6
    assert "pip install torch" in str(caught.value) and "torch" in caught.value.stderr_tail


def test_torch_is_installed_in_a_venv_once_and_the_script_runs_with_it(tmp_path, monkeypatch) -> None:
    build_torch_wheel(tmp_path / "wheels")
    instance = tmp_path / "instance.json"
    instance.write_text(json.dumps({"time_scale": 0, "gpu": {"name": "NVIDIA A100 80GB PCIe",
                                                             "compute_capability": "8.0",
                                                             "microbench": {"memory_gb_per_s": 1600.0}}}))
    monkeypatch.setenv("GPUBENCH_SANDBOX_INSTANCE", str(instance))
    shell = shell_with_wheels(monkeypatch, tmp_path / "wheels")
    try:
        first = run(ensure_torch(shell, timeout=120))
        assert first.installed and first.python == str(shell.home / TORCH_VENV / "bin" / "python")
        again = run(ensure_torch(shell, timeout=60))
        assert (again.python, again.installed) == (first.python, False)
        events = run(run_microbench(shell, again.python, PLAN, timeout=60))
        with pytest.raises(StageError) as caught:  # the script's own error event, at stage benchmark
            monkeypatch.setenv("GPUBENCH_SANDBOX_INSTANCE", str(tmp_path / "nothing.json"))  # no GPU there
            failing = LocalShell.open()
            try:
                run(run_microbench(failing, first.python, PLAN, timeout=60))
            finally:
                run(failing.close())
    finally:
        run(shell.close())
    assert [e["event"] for e in events] == ["device", "figure", "done"]
    assert events[1]["values"] == [pytest.approx(1600.0, rel=0.011)] * 2
    assert caught.value.stage is Stage.BENCHMARK and not isinstance(caught.value, RemoteCommandError)
    assert "could not run: torch 2.5.1+gpubench.sandbox sees no CUDA device" in str(caught.value)


def test_a_script_that_dies_without_its_done_event_fails_the_benchmark_with_stderr(tmp_path) -> None:
    shell = LocalShell.open()
    try:
        with pytest.raises(RemoteCommandError) as caught:
            run(run_microbench(shell, "false", PLAN, timeout=30))
    finally:
        run(shell.close())
    assert caught.value.stage is Stage.BENCHMARK and caught.value.exit_status == 1
