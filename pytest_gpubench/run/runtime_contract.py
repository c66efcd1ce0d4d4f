"""The ``Runtime`` contract (``runtimes/base.py``) as plain checks a runtime's author runs.

Each check drives one part of the protocol for real, on one instance the caller opened (a
sandbox session, or a real machine): install or locate, serve, health, prepare the model,
warm up, the endpoint the load generator measures through, unload, remove, stop and the
restart after it, and the next cell's take-over on a reused session. The project's own suite
(``tests/e2e/test_runtime_contract.py``) runs every check on every runtime on an instance;
a third party's runtime passes the same ones::

    from pytest_gpubench.run.runtime_contract import RuntimeUnderTest, check_runtime, contract_cell
    from pytest_gpubench.runtimes.registry import runtime_for

    subject = RuntimeUnderTest("toy", lambda: runtime_for(contract_cell("toy"), conn), conn)
    await check_runtime(subject)              # or one check: await CHECKS["serve_and_health"](subject)

A broken rule raises :class:`ContractBroken` (an ``AssertionError``: pytest reports it as a
failure) saying which. No pytest here: the checks are coroutines, bounded by each call's timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Stage, StageError
from ..matrix.cells import SEED_PROMPTS, Cell, expand, parse_matrix
from ..measure.benchmark import BenchmarkPlan
from ..measure.repeats import measure_once
from ..remote.ssh import Connection
from ..runtimes.base import Runtime, ServingApi
from .session_pool import note_model, take_over_server
from .session_pool import Lease

#: A catalog model the sandbox pulls in a moment on its clock.
CONTRACT_MODEL = "qwen2:1.5b"


class ContractBroken(AssertionError):
    """A runtime that breaks a rule of the contract; the message says which."""


def holds(condition: Any, rule: str) -> None:
    """Raise :class:`ContractBroken` with ``rule`` unless ``condition``."""
    if not condition:
        raise ContractBroken(rule)


def contract_cell(runtime: str, model: str = CONTRACT_MODEL, extra: str = "") -> Cell:
    """A cell whose matrix names ``runtime`` (``extra``: more of its ``runtime:`` mapping, such as
    ``presets: FILE``), as a user's file would."""
    more = f", {extra}" if extra else ""
    text = (f"runtime: {{name: {runtime}{more}}}\n"
            f"matrix:\n  - {{gpu: RTX 4090, provider: vastai, model: '{model}'}}\n")
    (cell,) = expand(parse_matrix(text, "gpubench_contract.yaml"))
    return cell


@dataclass
class RuntimeUnderTest:
    """The runtime a check drives: its name, how to build a fresh one (as ``runtime_for`` does for a
    cell naming it) on the instance's connection ``conn``, and the model it prepares."""

    name: str
    make: Callable[[], Runtime]
    conn: Connection
    model: str = CONTRACT_MODEL


async def serve(runtime: Runtime) -> str:
    """Install or locate, then serve: what every later operation needs first."""
    await runtime.ensure_installed(60)
    await runtime.locate(30)
    return await runtime.ensure_serving(60, num_parallel=2)


async def ready(runtime: Runtime, model: str) -> None:
    """Served, with ``model`` prepared and loaded."""
    await serve(runtime)
    await runtime.pull(model, 120)
    await runtime.warm_up(model, 60)


async def it_is_the_runtime_the_cell_names(subject: RuntimeUnderTest) -> None:
    runtime = subject.make()
    holds(runtime.name == subject.name, f"runtime_for built {runtime.name!r} for a cell naming {subject.name!r}")
    holds(runtime.conn is subject.conn, "the runtime does not drive the connection it was given")
    holds((runtime.version, runtime.warmup_load_seconds, runtime.cold_first_token_ms) == ("", None, None),
          "a fresh runtime already has a version or cold-start figures")


async def install_or_locate_then_serve_then_health(subject: RuntimeUnderTest) -> None:
    runtime = subject.make()
    holds(isinstance(await runtime.ensure_installed(60), bool), "ensure_installed returns no bool")
    holds(await runtime.ensure_installed(60) is False, "ensure_installed installed again what is there")
    await runtime.locate(30)
    version = await runtime.ensure_serving(60, num_parallel=2)
    holds(version and runtime.version == version, f"ensure_serving returned {version!r}, version is {runtime.version!r}")
    if runtime.started_here:
        holds(runtime.num_parallel == 2, f"a server started for 2 parallel requests says {runtime.num_parallel}")
    holds(await runtime.ensure_healthy(30) is False, "ensure_healthy restarted a server that answers")


async def prepare_the_model_and_describe_it(subject: RuntimeUnderTest) -> None:
    runtime, model = subject.make(), subject.model
    await serve(runtime)
    progress: list[dict[str, Any]] = []
    await runtime.pull(model, 120, progress.append)
    holds(progress, "the pull reported no progress")
    info = await runtime.model_info(model)
    holds(runtime.canonical_model(info.name) == runtime.canonical_model(model),
          f"model_info({model!r}) describes {info.name!r}")
    holds(info.size_bytes > 0, f"model_info gives no size: {info}")
    holds(runtime.canonical_model(runtime.canonical_model(model)) == runtime.canonical_model(model),
          "canonical_model is not idempotent")


async def a_model_the_runtime_cannot_prepare_fails_at_model_pull(subject: RuntimeUnderTest) -> None:
    runtime = subject.make()
    await serve(runtime)
    try:
        await runtime.pull("no-such-model:7b", 60)
    except StageError as exc:
        holds(exc.stage is Stage.MODEL_PULL and "no-such-model:7b" in str(exc),
              f"an unknown model fails at {exc.stage} with {exc}")
    else:
        raise ContractBroken("pulling a model no one has succeeded")


async def warm_up_loads_the_model_and_keeps_its_cold_start(subject: RuntimeUnderTest) -> None:
    runtime, model = subject.make(), subject.model
    await serve(runtime)
    await runtime.pull(model, 120)
    load = await runtime.warm_up(model, 60)
    holds(load >= 0 and runtime.warmup_load_seconds == load and (runtime.cold_first_token_ms or 0) > 0,
          f"warm_up returned {load}, kept {runtime.warmup_load_seconds} s and {runtime.cold_first_token_ms} ms")
    cold = (runtime.warmup_load_seconds, runtime.cold_first_token_ms)
    await runtime.warm_up(model, 60, cold_start=False)
    holds((runtime.warmup_load_seconds, runtime.cold_first_token_ms) == cold, "a warm load replaced the cold start")
    loaded = {runtime.canonical_model(name) for name in await runtime.loaded_models()}
    if getattr(runtime, "keeps_models_loaded", True):
        holds(runtime.canonical_model(model) in loaded, f"{model} is not among the loaded models {loaded}")
        residency = await runtime.residency(model)
        holds(residency is not None and residency["fully_in_gpu"] is True, f"residency is {residency}")
    else:  # the model lives only in a benchmark's containers (workers): it cannot say, and says so
        holds(loaded == set() and await runtime.residency(model) is None,
              "a runtime that keeps no model loaded names loaded models or a residency")


async def the_load_generator_measures_through_the_endpoint(subject: RuntimeUnderTest) -> None:
    runtime, model = subject.make(), subject.model
    await ready(runtime, model)
    endpoint = runtime.endpoint
    holds(endpoint.api in set(ServingApi) and endpoint.remote_url and endpoint.local_url, f"endpoint {endpoint}")
    plan = BenchmarkPlan(model=model, duration=1.0, max_tokens=8, prompts=list(SEED_PROMPTS[:2]), warmup_requests=0,
                         progress_interval=0.5, checkpoint_every=5,
                         checkpoint_path=f".gpubench/contract/{runtime.name}.checkpoint.json", request_timeout=30,
                         protocol=str(endpoint.api))
    outcome, _ = await measure_once(runtime, plan, timeout=60, telemetry_interval=0.5, on_event=lambda event: None)
    measured = [record for record in outcome.records if not record.warmup]
    holds(measured and all(record.ok and record.output_tokens > 0 for record in measured),
          f"the load generator's requests failed: {measured[:3]}")


async def unload_frees_the_gpu_and_remove_the_disk(subject: RuntimeUnderTest) -> None:
    runtime, model = subject.make(), subject.model
    await ready(runtime, model)
    wanted = runtime.canonical_model(model)
    await runtime.unload(model)
    deadline = time.monotonic() + 30
    while wanted in {runtime.canonical_model(name) for name in await runtime.loaded_models()}:
        holds(time.monotonic() < deadline, f"{model} still in GPU memory 30 s after unload")
        await asyncio.sleep(0.05)
    await runtime.model_info(model)  # unloaded, still prepared
    await runtime.remove(model)
    try:
        await runtime.model_info(model)
    except StageError as exc:
        holds(exc.stage is Stage.MODEL_PULL, f"a removed model's model_info fails at {exc.stage}")
    else:
        raise ContractBroken("model_info still describes a removed model")


async def stop_then_the_health_check_restarts_the_server_once(subject: RuntimeUnderTest) -> None:
    runtime = subject.make()
    await serve(runtime)
    await runtime.stop(30)  # whatever an earlier runtime on this session started
    await serve(runtime)
    holds(runtime.started_here, "the server was running before any runtime started it")
    reasons: list[str] = []
    await runtime.stop(30)
    holds(await runtime.ensure_healthy(60, on_restart=reasons.append) is True, "a stopped server was not restarted")
    holds(len(reasons) == 1 and runtime.version, f"the restart was told {reasons}, version {runtime.version!r}")
    holds(await runtime.ensure_healthy(30) is False, "a restarted server that answers was restarted again")
    await runtime.stop(30)
    try:
        await runtime.ensure_healthy(60, Stage.BENCHMARK)
    except StageError as exc:
        holds(exc.stage is Stage.BENCHMARK and "again" in str(exc), f"a second restart fails at {exc.stage}: {exc}")
    else:
        raise ContractBroken("a server stopped twice was restarted twice")


async def the_next_cell_on_a_session_takes_over_the_server_an_earlier_one_started(subject: RuntimeUnderTest) -> None:
    """Session reuse (run/session_pool.py): the lease remembers a server a cell's runtime started,
    and the next cell's runtime takes it over: no install, and it can still restart it."""
    first = subject.make()
    await serve(first)
    await first.stop(30)  # whatever an earlier check left running: this runtime starts its own
    await serve(first)
    # Only what the lease records of the runtime matters here, not the session it holds.
    lease = Lease("contract", provisioning=None, gpu_session=None)  # type: ignore[arg-type]
    fresh = subject.make()
    holds(take_over_server(lease, fresh) is False and not fresh.started_here, "took over a server no cell started")
    note_model(lease, first, subject.model)
    holds((lease.runtime_started_here, lease.runtime_num_parallel) == (True, 2), "the lease did not note the server")
    following = subject.make()
    holds(take_over_server(lease, following) is True, "the next cell's runtime did not take the server over")
    holds((following.started_here, following.num_parallel) == (True, 2), "the taken-over server is not its own")
    await following.locate(30)
    holds(await following.ensure_serving(60, num_parallel=2) == first.version, "the taken-over server was replaced")
    await following.stop(30)
    holds(await following.ensure_healthy(60) is True, "the taken-over server was not its own to restart")


#: Every check, by name, in the order :func:`check_runtime` runs them.
CHECKS: dict[str, Callable[[RuntimeUnderTest], Awaitable[None]]] = {
    check.__name__: check for check in (
        it_is_the_runtime_the_cell_names,
        install_or_locate_then_serve_then_health,
        prepare_the_model_and_describe_it,
        a_model_the_runtime_cannot_prepare_fails_at_model_pull,
        warm_up_loads_the_model_and_keeps_its_cold_start,
        the_load_generator_measures_through_the_endpoint,
        unload_frees_the_gpu_and_remove_the_disk,
        stop_then_the_health_check_restarts_the_server_once,
        the_next_cell_on_a_session_takes_over_the_server_an_earlier_one_started,
    )
}


async def check_runtime(subject: RuntimeUnderTest) -> None:
    """Run every check of the contract on ``subject``, in order; the first broken rule raises."""
    for check in CHECKS.values():
        await check(subject)
