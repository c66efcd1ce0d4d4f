"""The Ollama stand-in's timing primitives, in-process: when the TTFT clock starts,
the order slots are handed out in, and how the loop's wake-up latency is learned.

These fix the *rules* of the stand-in's schedule; how close a client gets to its
truth on this machine is measured by ``bench/fidelity.py``.
"""

from __future__ import annotations

import asyncio
import selectors
import sys

import pytest
from standin_helpers import write_instance

from pytest_gpubench.sandbox.instance_spec import InstanceSpec
from pytest_gpubench.sandbox.ollama_engine import Engine, EngineSettings, FifoSlots, Job, LagStats
from pytest_gpubench.sandbox.ollama_server import run_with_fine_timers
from pytest_gpubench.sandbox.standin_state import StateStore


def test_slots_say_when_a_waiter_got_its_slot():
    async def scenario():
        loop = asyncio.get_running_loop()
        slots = FifoSlots(1)
        assert await slots.acquire() is None  # free at once: no hand-over time
        waiter = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        released_at = loop.time()
        slots.release()
        granted = await waiter
        assert released_at <= granted <= loop.time()

    asyncio.run(scenario())


def test_wake_latency_is_learned_and_stalls_are_capped():
    lag = LagStats()
    for _ in range(200):
        lag.learn_wake(0.0006)
    assert lag.wake_latency_s == pytest.approx(0.0006, rel=1e-3)
    for _ in range(10):
        lag.learn_wake(0.5)  # another task held the loop: not a wake-up cost
    assert lag.wake_latency_s <= 0.002
    lag.learn_wake(-0.001)  # woken early never teaches "wake later than asked"
    assert lag.wake_latency_s >= 0
    assert "typical wake-up" in lag.summary()


def job(arrived: float, prompt: str = "Why is the sky blue?") -> Job:
    return Job(model="qwen2:7b", prompt=prompt, prompt_eval_count=6, num_predict=4, keep_alive=60.0,
               arrived=arrived)


def test_ttft_clock_starts_at_arrival_or_when_the_request_could_start(tmp_path):
    spec = InstanceSpec.model_validate_json(write_instance(tmp_path).read_text())

    async def scenario():
        loop = asyncio.get_running_loop()
        engine = Engine(spec, StateStore(spec.state_dir), EngineSettings(num_parallel=1))
        engine.record_pull("qwen2:7b", spec.find_model("qwen2:7b")[1])
        # The first request waits for the model to load: its clock starts after the load.
        first_arrived = loop.time()
        async with engine.generation(job(first_arrived)) as gen:
            loaded_at = engine.runners["qwen2:7b"].loaded_at
            assert gen.start == loaded_at > first_arrived
        # Model loaded and slot free: the clock starts at arrival, so the handler's
        # own work before this point is inside the TTFT, as with a real server.
        arrived = loop.time()
        await asyncio.sleep(0.005)
        async with engine.generation(job(arrived)) as gen:
            assert gen.start == arrived
            # A request queued behind this one starts when it gets the slot.
            queued_arrived = loop.time()
            queued = asyncio.ensure_future(_start_of(engine, job(queued_arrived)))
            await asyncio.sleep(0.01)
            released_at = loop.time()
        queued_start = await queued
        assert released_at <= queued_start and queued_start > queued_arrived + 0.009

    asyncio.run(scenario())


async def _start_of(engine: Engine, queued: Job) -> float:
    async with engine.generation(queued) as gen:
        return gen.start


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.Runner's loop_factory is new in 3.11")
def test_the_standin_loop_has_microsecond_timers():
    async def selector_name():
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()._selector).__name__  # noqa: SLF001

    assert run_with_fine_timers(selector_name()) == selectors.SelectSelector.__name__
