"""Watch a rented session through the API while a long stage runs on it.

A provider that stops an instance does not say so over SSH: the connection just
goes quiet, and a stage would wait for its timeout (seed 001, BUG-011: "detect
early, fail fast"). While the model pull and the benchmark run, a
:class:`SessionWatch` asks ``GET /api/v1/sessions/{id}`` every few seconds; any
status other than ``running`` means the instance is gone (the server reports a
dead instance as ``stopped``, see CONTRACTS.md), and the stage is aborted at once
with the API's own reason. SSH keepalives are the second line, for when the API
itself is slow to notice.

An API that does not answer is not a lost instance: a failed poll is counted and
the next one tried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from ..errors import ApiError, InstanceLost, Stage, StageError
from ..settings import Settings
from .provider import Session

log = logging.getLogger("pytest_gpubench.cloud.watch")
T = TypeVar("T")

#: Seconds between status polls, before time scaling (seed 001 checks every 30 s;
#: a stopped instance should be noticed within seconds).
WATCH_INTERVAL = 5.0
#: However small the time scale, polls are at least this far apart.
MIN_WATCH_INTERVAL = 0.5
#: Polls after a failure before it is blamed on something other than a lost instance.
CONFIRM_CHECKS = 3
#: What a lost instance tells the user to do.


class SessionSource(Protocol):
    """Where a session's current state comes from (the GPU Shopper client)."""

    def get_session(self, session_id: str, stage: Stage = ...) -> Awaitable[Session]: ...


class SessionWatch:
    """Polls one session's status until it leaves ``running``; use as ``async with``.

    ``lost`` is set (and ``reason`` says why, in the API's words) once it has;
    :meth:`guard` runs a coroutine that is cut short when that happens.
    """

    def __init__(self, source: SessionSource, session_id: str, interval: float, stage: Stage = Stage.BENCHMARK):
        self.source = source
        self.session_id = session_id
        self.interval = interval
        self.stage = stage
        self.lost = asyncio.Event()
        self.reason = ""
        self.polls = 0
        self.failed_polls = 0
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def __aenter__(self) -> SessionWatch:
        self._task = asyncio.ensure_future(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            # Never wait on the cancellation alone: before Python 3.12, asyncio.wait_for
            # can swallow a cancel that meets its inner result (cpython gh-86296), and the
            # poll would then go on, and this exit wait for it, forever (seen in the soak
            # run). The flag ends the loop at its next turn; the wait is bounded.
            await asyncio.wait({self._task}, timeout=self.interval + 1)

    async def _poll(self) -> None:
        while not self.lost.is_set() and not self._closing:
            await asyncio.sleep(self.interval)
            if not self._closing:
                await self.check()

    async def check(self) -> bool:
        """Ask the API once; True (and ``lost`` set) if the instance is gone."""
        if self.lost.is_set():
            return True
        self.polls += 1
        try:
            session = await asyncio.wait_for(self.source.get_session(self.session_id, self.stage),
                                             max(10.0, 2 * self.interval))
        except ApiError as exc:
            if exc.status == 404:
                return self._gone(f"the API no longer knows session {self.session_id}")
            self.failed_polls += 1
            log.info("session %s: status poll failed: %s", self.session_id, exc)
            return False
        except (StageError, asyncio.TimeoutError) as exc:
            self.failed_polls += 1
            log.info("session %s: status poll failed: %s", self.session_id, exc or type(exc).__name__)
            return False
        if session.status == "running":
            return False
        detail = f": {session.error}" if session.error else ""
        return self._gone(f"the instance is gone: the API reports session {self.session_id} "
                          f"{session.status}{detail}")

    async def confirm(self, checks: int = CONFIRM_CHECKS) -> bool:
        """After the work failed: whether the instance is gone, asking up to ``checks``
        times one poll interval apart, since a provider may report a death a moment
        after the connection felt it."""
        for attempt in range(checks):
            if await self.check():
                return True
            if attempt < checks - 1:
                await asyncio.sleep(self.interval)
        return False

    def _gone(self, reason: str) -> bool:
        self.reason = reason
        self.lost.set()
        return True

    def error(self, stage: Stage | None = None) -> InstanceLost:
        """The error that ends a stage cut short by the loss."""
        return InstanceLost(stage or self.stage, self.reason)

    async def guard(self, work: Awaitable[T], stage: Stage | None = None) -> T:
        """Await ``work``; if the instance is lost first, cancel it and raise :class:`InstanceLost`.

        When ``work`` fails on its own (a broken link, say), the API is asked once
        more at once, so that a lost instance is named as the cause, not its symptom.
        """
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise self.error(stage)
        if task.exception() is not None and await self.confirm():
            raise self.error(stage) from None
        return task.result()


def watch_interval(settings: Settings) -> float:
    """Seconds between status polls on this run's clock."""
    return settings.scaled(WATCH_INTERVAL, MIN_WATCH_INTERVAL)
