"""The ``Runtime`` contract (runtimes/base.py), run against every registered implementation.

Each implementation in ``runtimes/registry.py`` gets its own running session of the
in-process sandbox (``sandbox``/``api`` in conftest.py) and a real SSH connection to
it; every test builds a fresh runtime for a cell whose matrix names the
implementation, the way the ``gpu_runtime`` fixture does, and drives one part of
the protocol for real: install or locate, serve, health, prepare the model, warm
up, the endpoint the load generator measures through, unload, remove and stop.
A new runtime in the registry is tested here without a line added.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from polling import wait_for
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import SEED_PROMPTS, Cell, expand, parse_matrix
from pytest_gpubench.matrix.endpoint import ENDPOINT_RUNTIME
from pytest_gpubench.matrix.fields import DEFAULT_RUNTIME, RUNTIME_NAMES
from pytest_gpubench.measure.benchmark import BenchmarkPlan
from pytest_gpubench.measure.repeats import measure_once
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.runtimes.base import ServingApi
from pytest_gpubench.runtimes.registry import RUNTIMES, runtime_for

MODEL = "qwen2:1.5b"  # small: pulled in a moment on the sandbox's clock
T = TypeVar("T")


#: What a runtime needs beside its name in the matrix (container workers: seed 004's presets file).
RUNTIME_EXTRAS = {"worker": f"presets: {Path(__file__).parents[1] / 'data' / 'worker' / 'model_presets.yaml'}"}


def cell_for(runtime_name: str) -> Cell:
    """A cell whose matrix names ``runtime_name``, as a user's file would."""
    extra = f", {RUNTIME_EXTRAS[runtime_name]}" if runtime_name in RUNTIME_EXTRAS else ""
    text = (f"runtime: {{name: {runtime_name}{extra}}}\n"
            f"matrix:\n  - {{gpu: RTX 4090, provider: vastai, model: '{MODEL}'}}\n")
    (cell,) = expand(parse_matrix(text, "gpubench_contract.yaml"))
    return cell


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """One event loop for the module: the SSH connection lives on it across tests."""
    thread = LoopThread("runtime-contract")
    yield thread
    thread.close()


#: Runtimes that start a server on an instance. ``openai`` measures a server already up elsewhere
#: (nothing to install, stop or unload): tests/e2e/test_endpoint_runtime.py holds it to what applies.
ON_AN_INSTANCE = sorted(name for name in RUNTIMES if name != ENDPOINT_RUNTIME)


@pytest.fixture(scope="module", params=ON_AN_INSTANCE)
def instance(request: pytest.FixtureRequest, api: httpx.Client, loop: LoopThread) -> Iterator[tuple[str, Connection]]:
    """A running sandbox session per implementation, and an SSH connection to it."""
    session, key = new_session(api)
    conn = loop.run(connect(session, key), 60)
    yield request.param, conn
    loop.run(conn.close(), 15)
    api.post(f"/api/v1/sessions/{session['id']}/done")


@pytest.fixture
def runtime(instance: tuple[str, Connection]):
    """A fresh runtime of the implementation under test, as the registry builds it for a cell."""
    name, conn = instance
    return runtime_for(cell_for(name), conn)


@pytest.fixture
def run(loop: LoopThread):
    """Await a coroutine on the module's loop, with a generous bound."""
    def run(coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return loop.run(coro, timeout)

    return run


def serve(run, runtime) -> str:
    """Install or locate, then serve: what every later operation needs first."""
    run(runtime.ensure_installed(60))
    run(runtime.locate(30))
    return run(runtime.ensure_serving(60, num_parallel=2))


def ready(run, runtime) -> None:
    """Served, with the model prepared and loaded."""
    serve(run, runtime)
    run(runtime.pull(MODEL, 120))
    run(runtime.warm_up(MODEL, 60))


# --------------------------------------------------------------------- the registry


def test_the_matrix_names_exactly_the_registered_runtimes():
    assert set(RUNTIME_NAMES) == set(RUNTIMES) and DEFAULT_RUNTIME == "ollama"
    assert cell_for("ollama").runtime == "ollama"


def test_a_cell_naming_no_registered_runtime_fails_at_install():
    cell = cell_for(DEFAULT_RUNTIME).model_copy(update={"runtime": "nonesuch"})
    with pytest.raises(StageError) as info:
        runtime_for(cell, conn=None)
    assert info.value.stage is Stage.RUNTIME_SETUP
    assert str(info.value) == f"unknown runtime 'nonesuch'; known runtimes: {', '.join(RUNTIMES)}"


# --------------------------------------------------------------------- the contract


def test_it_is_the_runtime_the_cell_names(runtime, instance):
    assert runtime.name == instance[0]
    assert runtime.conn is instance[1]
    assert (runtime.version, runtime.warmup_load_seconds, runtime.cold_first_token_ms) == ("", None, None)


def test_install_or_locate_then_serve_then_health(runtime, run):
    assert isinstance(run(runtime.ensure_installed(60)), bool)
    assert run(runtime.ensure_installed(60)) is False  # there now: nothing to install
    run(runtime.locate(30))
    version = run(runtime.ensure_serving(60, num_parallel=2))
    assert version and runtime.version == version
    if runtime.started_here:
        assert runtime.num_parallel == 2
    assert run(runtime.ensure_healthy(30)) is False  # answering: no restart


def test_prepare_the_model_and_describe_it(runtime, run):
    serve(run, runtime)
    progress: list[dict] = []
    run(runtime.pull(MODEL, 120, progress.append))
    assert progress, "the pull reported no progress"
    info = run(runtime.model_info(MODEL))
    assert runtime.canonical_model(info.name) == runtime.canonical_model(MODEL)
    assert info.size_bytes > 0
    assert runtime.canonical_model(runtime.canonical_model(MODEL)) == runtime.canonical_model(MODEL)


def test_a_model_the_runtime_cannot_prepare_fails_at_model_pull(runtime, run):
    serve(run, runtime)
    with pytest.raises(StageError) as info:
        run(runtime.pull("no-such-model:7b", 60))
    assert info.value.stage is Stage.MODEL_PULL and "no-such-model:7b" in str(info.value)


def test_warm_up_loads_the_model_and_keeps_its_cold_start(runtime, run):
    serve(run, runtime)
    run(runtime.pull(MODEL, 120))
    load = run(runtime.warm_up(MODEL, 60))
    assert load >= 0 and runtime.warmup_load_seconds == load and runtime.cold_first_token_ms > 0
    cold = (runtime.warmup_load_seconds, runtime.cold_first_token_ms)
    run(runtime.warm_up(MODEL, 60, cold_start=False))
    assert (runtime.warmup_load_seconds, runtime.cold_first_token_ms) == cold  # a warm load is no cold start
    loaded = {runtime.canonical_model(name) for name in run(runtime.loaded_models())}
    if getattr(runtime, "keeps_models_loaded", True):
        assert runtime.canonical_model(MODEL) in loaded
        assert run(runtime.residency(MODEL))["fully_in_gpu"] is True
    else:  # the model lives only in a benchmark's containers (workers): it cannot say, and says so
        assert loaded == set() and run(runtime.residency(MODEL)) is None


def test_the_load_generator_measures_through_the_endpoint(runtime, run):
    ready(run, runtime)
    endpoint = runtime.endpoint
    assert endpoint.api in set(ServingApi) and endpoint.remote_url and endpoint.local_url
    plan = BenchmarkPlan(model=MODEL, duration=1.0, max_tokens=8, prompts=list(SEED_PROMPTS[:2]), warmup_requests=0,
                         progress_interval=0.5, checkpoint_every=5,
                         checkpoint_path=f".gpubench/contract/{runtime.name}.checkpoint.json", request_timeout=30,
                         protocol=str(endpoint.api))
    outcome, _ = run(measure_once(runtime, plan, timeout=60, telemetry_interval=0.5, on_event=lambda event: None))
    measured = [record for record in outcome.records if not record.warmup]
    assert measured and all(record.ok and record.output_tokens > 0 for record in measured), measured[:3]


def test_unload_frees_the_gpu_and_remove_the_disk(runtime, run):
    ready(run, runtime)
    wanted = runtime.canonical_model(MODEL)
    run(runtime.unload(MODEL))
    wait_for(lambda: wanted not in {runtime.canonical_model(n) for n in run(runtime.loaded_models())}, 30,
             f"{MODEL} to leave GPU memory")
    run(runtime.model_info(MODEL))  # unloaded, still prepared
    run(runtime.remove(MODEL))
    with pytest.raises(StageError) as info:
        run(runtime.model_info(MODEL))
    assert info.value.stage is Stage.MODEL_PULL


def test_stop_then_the_health_check_restarts_the_server_once(runtime, run):
    serve(run, runtime)
    run(runtime.stop(30))  # whatever an earlier runtime on this session started
    serve(run, runtime)
    assert runtime.started_here, "the server was running before any runtime started it"
    reasons: list[str] = []
    run(runtime.stop(30))
    assert run(runtime.ensure_healthy(60, on_restart=reasons.append)) is True
    assert len(reasons) == 1 and runtime.version
    assert run(runtime.ensure_healthy(30)) is False  # back, answering
    run(runtime.stop(30))
    with pytest.raises(StageError) as info:
        run(runtime.ensure_healthy(60, Stage.BENCHMARK))
    assert info.value.stage is Stage.BENCHMARK and "again" in str(info.value)


def test_the_next_cell_on_a_session_takes_over_the_server_an_earlier_one_started(instance, run):
    """Session reuse (run/reuse.py): the lease remembers a server a cell's runtime started,
    and the next cell's runtime takes it over: no install, and it can still restart it."""
    from pytest_gpubench.run.session_pool import Lease
    from pytest_gpubench.run.reuse import note_model, take_over_server

    first = runtime_for(cell_for(instance[0]), instance[1])
    serve(run, first)
    run(first.stop(30))  # whatever an earlier test left running: this runtime starts its own
    serve(run, first)
    # Only what the lease records of the runtime matters here, not the session it holds.
    lease = Lease("contract", provisioning=None, gpu_session=None)  # type: ignore[arg-type]
    fresh = runtime_for(cell_for(instance[0]), instance[1])
    assert take_over_server(lease, fresh) is False and not fresh.started_here
    note_model(lease, first, MODEL)
    assert (lease.runtime_started_here, lease.runtime_num_parallel) == (True, 2)
    following = runtime_for(cell_for(instance[0]), instance[1])
    assert take_over_server(lease, following) is True
    assert (following.started_here, following.num_parallel) == (True, 2)
    run(following.locate(30))
    assert run(following.ensure_serving(60, num_parallel=2)) == first.version
    run(following.stop(30))
    assert run(following.ensure_healthy(60)) is True  # its own to restart
