"""The sandbox demo's clock: a ``--gpubench-sandbox`` run benchmarks on the sandbox's
time scale (with floors), and ``--gpubench-sandbox-real-time`` keeps the matrix's seconds."""

from pathlib import Path

import pytest

from pytest_gpubench.matrix import expand, load_matrix
from pytest_gpubench.run import apply_overrides
from pytest_gpubench.settings import resolve

SEED = Path(__file__).resolve().parents[1] / "matrix" / "gpubench_seed.yaml"


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
    # Only the clock's quantities: the workload itself is what the matrix says.
    assert cell.workload.max_tokens == seed_cell.workload.max_tokens
    assert cell.workload.warmup_requests == seed_cell.workload.warmup_requests


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
