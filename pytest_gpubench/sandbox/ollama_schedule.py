"""Timing primitives of the Ollama stand-in: fair slots, batching and token schedules.

A ``Generation`` delivers each token on an absolute schedule (first token ``ttft``
after the request could start: it arrived, its model was loaded and it had a
slot; then one per interval), so sleep overhead never accumulates into drift, and
it reports counters that match what was streamed.
``LagStats`` records how late tokens actually left, the stand-in's own health
figure. ``FifoSlots`` is the per-model parallelism limit, first in, first out.

Batching (:func:`batch_slowdown`): the generations a model runs at once share
each decode step. A step that serves ``b`` sequences takes ``t_w + b * t_s``
(the weights are read once per step, each sequence adds its own KV-cache reads
and sampling), so with ``r1`` the single-stream rate and ``C = 1 / t_s`` the
aggregate ceiling::

    r(b) = r1 / (1 + (b - 1) / F)        F = C / r1, the batch ceiling factor
    b * r(b) -> C as b grows

A token's interval is stretched by the factor for the batch size at the moment
it is scheduled, and a request's prefill (TTFT) by the factor when it starts:
its prompt is processed in steps shared with the others' decoding.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from .ollama_text import OutputPlan
from .standin_state import StreamFault

WAKE_LEARNING_RATE = 0.05  # weight of the newest sleep in LagStats.wake_latency_s
STALL_POLL_SECONDS = 0.05  # how often a stalled stream looks whether its client left


def batch_slowdown(batch: int, ceiling_factor: float | None) -> float:
    """How much longer each step takes for one of ``batch`` sequences decoding
    together than for a sequence alone: ``1 + (batch - 1) / ceiling_factor``.

    ``ceiling_factor`` is the aggregate ceiling over the single-stream rate (the
    catalog's ``batch_ceiling``); None or 0: parallel sequences cost nothing.
    """
    if not ceiling_factor or batch <= 1:
        return 1.0
    return 1.0 + (batch - 1) / ceiling_factor


class FifoSlots:
    """A counting semaphore that serves waiters strictly in arrival order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self.waiters: deque[asyncio.Future[float]] = deque()

    @property
    def held(self) -> int:
        """Slots taken: the generations running now."""
        return self.size - self.free

    async def acquire(self) -> float | None:
        """Take a slot; returns the loop time it was handed over after a wait, or
        ``None`` when one was free at once."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return None
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot arrived just as we were cancelled
            else:
                self.waiters.remove(future)
            raise

    def release(self) -> None:
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(future.get_loop().time())
                return
        self.free += 1


@dataclass(frozen=True)
class Job:
    """One generation request, as the engine needs it."""

    model: str
    prompt: str
    prompt_eval_count: int
    num_predict: int | None
    keep_alive: float
    arrived: float  # loop time when the request reached the handler
    think: bool = False  # the model reasons before it answers (see ollama_text)


@dataclass
class LagStats:
    """How late tokens left against their schedule: the stand-in's own health.

    It also learns how late this event loop wakes from a sleep (``wake_latency_s``,
    a moving average), so that :class:`Generation` can ask to be woken that much
    earlier and its tokens leave on time on average instead of always late.
    """

    tokens: int = 0
    late_over_5ms: int = 0
    max_lag_s: float = 0.0
    wake_latency_s: float = 0.0

    def record(self, lag: float) -> None:
        self.tokens += 1
        if lag > 0.005:
            self.late_over_5ms += 1
        if lag > self.max_lag_s:
            self.max_lag_s = lag

    def learn_wake(self, late: float) -> None:
        """Fold one sleep's lateness into the average; a stall (over 2 ms, another
        task's work rather than the wake-up itself) is capped so it cannot make
        later tokens leave early."""
        self.wake_latency_s += WAKE_LEARNING_RATE * (min(max(late, 0.0), 0.002) - self.wake_latency_s)

    def summary(self) -> str:
        return (
            f"{self.tokens} tokens streamed, {self.late_over_5ms} more than 5 ms late, "
            f"max lag {self.max_lag_s * 1e3:.1f} ms, typical wake-up {self.wake_latency_s * 1e3:.2f} ms"
        )


class Generation:
    """The tokens of one request, delivered on their scheduled times."""

    def __init__(
        self,
        job: Job,
        plan: OutputPlan,
        start: float,
        ttft: float,
        intervals: list[float],
        load: float,
        lag: LagStats | None = None,
        fault: StreamFault | None = None,
        slowdown: Callable[[], float] | None = None,
    ):
        self.lag = lag or LagStats()
        self.fault = fault
        self.job = job
        self.plan = plan
        self.start = start
        self.intervals = intervals  # each token's interval for a sequence decoding alone
        #: The batch's slowdown now (see :func:`batch_slowdown`), asked as each token
        #: is scheduled, so a stream slows when others join and speeds up when they leave.
        self.slowdown = slowdown or (lambda: 1.0)
        self.ttft = ttft * self.slowdown()
        self.used: list[float] = []  # the intervals actually scheduled
        self.load_duration = load
        self.emitted = 0

    async def tokens(self, client_gone: Callable[[], bool] | None = None) -> AsyncIterator[str]:
        """Yield each token at ``start + ttft + sum(previous intervals)``, then wait
        until the end-of-sequence step so that ``eval_duration`` is honest.

        A stream fault cuts in after its ``after_tokens``: ``empty`` ends the answer
        there; ``stall`` goes silent until ``client_gone()`` (then nothing more is
        sent) or its ``stall_seconds`` pass (then the rest follows, that much later).
        """
        loop = asyncio.get_running_loop()
        due = self.start + self.ttft
        fault = self.fault
        for index, (token, interval) in enumerate(zip(self.plan.tokens, self.intervals, strict=True)):
            if fault is not None and index == fault.after_tokens:
                if fault.kind == "empty":
                    break
                stalled = loop.time()
                while loop.time() - stalled < fault.stall_seconds:
                    if client_gone is not None and client_gone():
                        return
                    await asyncio.sleep(STALL_POLL_SECONDS)
                due += loop.time() - stalled
            wake = due - self.lag.wake_latency_s
            delay = wake - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                self.lag.learn_wake(loop.time() - wake)
            self.lag.record(loop.time() - due)
            self.emitted += 1
            yield token
            interval *= self.slowdown()
            self.used.append(interval)
            due += interval
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    @property
    def done_reason(self) -> str:
        return self.plan.done_reason

    def stats(self, now: float) -> dict[str, int]:
        """The final chunk's counters, in nanoseconds, matching what was streamed."""
        eval_duration = sum(self.used[: self.emitted])
        return {
            "total_duration": int((now - self.job.arrived) * 1e9),
            "load_duration": int(self.load_duration * 1e9),
            "prompt_eval_count": self.job.prompt_eval_count,
            "prompt_eval_duration": int(self.ttft * 1e9),
            "eval_count": self.emitted,
            "eval_duration": int(eval_duration * 1e9),
        }
