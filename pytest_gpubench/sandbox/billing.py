"""The sandbox's clock and its cost ledger, billed by the clock hour like the server.

The real cost tracker does two things:

- every hour (a ticker started with the server) it records ``price_per_hour`` for
  each session that is ``running`` at that moment, keyed by the clock hour;
- when a session *fails*, it records ``price_per_hour`` for every clock hour the
  session touched (at least one).

So a session stopped normally within its first hour costs 0 in ``/costs``, while a
failed one costs at least an hour. :class:`Ledger` keeps one record per
(session, clock hour), as the server's ``ON CONFLICT`` upsert does.

:class:`Clock` is wall-clock time plus an offset, so tests can jump forward
(``POST /sandbox/clock``) to see hourly billing, expiry and the 12-hour cap.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

HOUR = 3600.0


class Clock:
    """UTC wall-clock time that can be advanced (never moved back)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def timestamp(self) -> float:
        return time.time() + self.offset

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp(), tz=timezone.utc)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the sandbox clock only moves forward")
        self.offset += seconds


class Billable(Protocol):
    """What the ledger reads from a session record."""

    id: str
    consumer_id: str
    provider: str
    gpu_type: str
    price_per_hour: float


@dataclass(frozen=True)
class CostRecord:
    session_id: str
    consumer_id: str
    provider: str
    gpu_type: str
    hour: datetime
    amount: float


class Ledger:
    """Cost records, one per (session, clock hour)."""

    def __init__(self, started: datetime) -> None:
        self._records: dict[tuple[str, datetime], CostRecord] = {}
        self.next_tick = started + timedelta(seconds=HOUR)

    def record(self, record: CostRecord) -> None:
        self._records[(record.session_id, record.hour)] = record

    def hourly_ticks(self, now: datetime, running: Iterable[Billable]) -> int:
        """Fire every hourly tick due by ``now``; returns how many fired.

        ``running`` yields session records (``id``, ``consumer_id``, ``provider``,
        ``gpu_type``, ``price_per_hour``) running at the time of the call.
        """
        sessions = list(running)
        fired = 0
        while now >= self.next_tick:
            hour = floor_hour(self.next_tick)
            for session in sessions:
                self.record(_record_for(session, hour))
            self.next_tick += timedelta(seconds=HOUR)
            fired += 1
        return fired

    def final_cost(self, session: Billable, created_at: datetime, ended_at: datetime) -> None:
        """Bill every clock hour a failed session touched (the server's RecordFinalCost)."""
        if session.price_per_hour <= 0 or ended_at <= created_at:
            return
        hour = floor_hour(created_at)
        while hour <= ended_at:
            self.record(_record_for(session, hour))
            hour += timedelta(seconds=HOUR)

    def session_cost(self, session_id: str) -> float:
        return round(sum(r.amount for r in self._records.values() if r.session_id == session_id), 10)

    def summary(self, consumer_id: str, start: datetime, end: datetime) -> dict[str, object]:
        """The server's cost summary over ``[start, end)`` of clock hours."""
        chosen = [
            r
            for r in self._records.values()
            if start <= r.hour < end and (not consumer_id or r.consumer_id == consumer_id)
        ]
        body: dict[str, object] = {
            "total_cost": round(sum(r.amount for r in chosen), 10),
            "session_count": len({r.session_id for r in chosen}),
            "hours_used": float(len(chosen)),
            "period_start": start,
            "period_end": end,
        }
        if consumer_id:
            body = {"consumer_id": consumer_id, **body}
        return body


def floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The current calendar month, the server's default cost period."""
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def _record_for(session: Billable, hour: datetime) -> CostRecord:
    return CostRecord(
        session_id=session.id,
        consumer_id=session.consumer_id,
        provider=session.provider,
        gpu_type=session.gpu_type,
        hour=hour,
        amount=session.price_per_hour,
    )
