"""The spend cap (``--gpubench-budget USD``): arithmetic over the manifest's attempts.

A run's money is in its sessions, and every session is one row of the manifest's
``attempts`` table (written by whichever xdist worker rented it):

* **spent**: ended attempts cost ``cost_usd`` (price x lifetime); attempts whose
  session still runs have cost price x the time since their session started.
* **committed**: what running attempts will still cost if they last as long as
  expected: price x (expected lifetime - elapsed), never below zero.

Before renting a session, a cell reserves its own expected cost (price x
:func:`expected_session_seconds`). The session is rented only when
spent + committed + that reservation stays within the budget; otherwise the
cell is skipped (or, after failed attempts, fails) with the figures. The check
and the reservation run in one manifest write transaction
(:meth:`~pytest_gpubench.store.base.Store.start_attempt`), so two workers
cannot both take the last dollar.

The cap is on expected spend: a cell that runs longer than expected costs more
than it reserved, and the next cells see that in ``spent``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

#: A session's setup before the benchmark: seed 000's example run took 8 minutes
#: from create to MODEL_READY (boot, SSH, install, a 40 GB pull); rounded up.
EXPECTED_SETUP_S = 600.0
#: Results, cleanup and the server's destroy check after the benchmark.
EXPECTED_TEARDOWN_S = 60.0


def expected_session_seconds(duration: float, runs: int, time_scale: float) -> float:
    """How long a cell's session is expected to live: setup and teardown (on the run's
    clock), plus ``runs`` benchmarks of ``duration`` seconds (the cell's effective
    duration: already on the sandbox's clock in a ``--gpubench-sandbox`` run)."""
    return (EXPECTED_SETUP_S + EXPECTED_TEARDOWN_S) * time_scale + duration * max(runs, 1)


class AttemptCost(Protocol):
    """What the budget reads of an attempt (a :class:`~pytest_gpubench.store.records.AttemptRecord`)."""

    @property
    def price_per_hour(self) -> float | None: ...
    @property
    def started_at(self) -> str: ...
    @property
    def session_started_at(self) -> str | None: ...
    @property
    def ended_at(self) -> str | None: ...
    @property
    def expected_seconds(self) -> float | None: ...
    @property
    def cost_usd(self) -> float | None: ...


@dataclass(frozen=True)
class Spend:
    """A run's money as of one moment, in USD."""

    spent: float = 0.0
    committed: float = 0.0

    @property
    def total(self) -> float:
        return self.spent + self.committed


def spend_of(attempts: Iterable[AttemptCost], now: datetime) -> Spend:
    """Spent and committed money of a run's ``attempts`` at ``now`` (UTC-aware)."""
    spent = committed = 0.0
    for attempt in attempts:
        price = attempt.price_per_hour or 0.0
        if attempt.ended_at:
            cost = attempt.cost_usd
            if cost is None:  # ended by a version that did not price it
                cost = price * _hours(attempt.session_started_at, attempt.ended_at)
            spent += cost
            continue
        # Before its create answers, an attempt has spent nothing but has committed all.
        start = attempt.session_started_at or attempt.started_at
        elapsed_s = _hours(start, now) * 3600
        if attempt.session_started_at:
            spent += price * elapsed_s / 3600
        committed += price * max((attempt.expected_seconds or 0.0) - elapsed_s, 0.0) / 3600
    return Spend(spent, committed)


def exhausted(budget: float, spend: Spend) -> str | None:
    """Why no cell may start any more (nothing is left), or None."""
    if spend.total >= budget:
        return (f"budget {usd(budget)} used up: spent {usd(spend.spent)} + committed "
                f"{usd(spend.committed)} by running cells")
    return None


def refusal(budget: float, spend: Spend, price_per_hour: float, expected_seconds: float) -> str | None:
    """Why a session at ``price_per_hour`` for ``expected_seconds`` does not fit, or None."""
    cost = price_per_hour * expected_seconds / 3600
    if spend.total + cost > budget:
        return (f"budget {usd(budget)}: spent {usd(spend.spent)} + committed {usd(spend.committed)} "
                f"+ this cell's expected {usd(cost)} (${price_per_hour:.3f}/h x {expected_seconds / 60:.1f} min) "
                f"would pass it")
    return None


def admission(
    budget: float | None, price_per_hour: float, expected_seconds: float, clock: Callable[[], datetime]
) -> Callable[[list[AttemptCost]], str | None] | None:
    """The ``admit`` callback for ``Store.start_attempt``; None when there is no budget."""
    if budget is None:
        return None

    def admit(attempts: list[AttemptCost]) -> str | None:
        return refusal(budget, spend_of(attempts, clock()), price_per_hour, expected_seconds)

    return admit


def summary_line(budget: float, spent: float, skipped: int) -> str:
    """The terminal summary's budget line."""
    share = f" ({100 * spent / budget:.0f} %)" if budget > 0 else ""
    line = f"budget {usd(budget)}: spent {usd(spent)}{share}"
    return line + (f"; {skipped} cell(s) skipped by the budget" if skipped else "")


def skipped_by_budget(error_message: str | None) -> bool:
    """Whether a skipped cell's reason is the budget's (the wording of :func:`exhausted`/:func:`refusal`)."""
    return bool(error_message) and ("] budget $" in error_message or error_message.startswith("budget $"))


def usd(amount: float) -> str:
    """Money for people: cents from a dollar up, four decimals below (sandbox runs cost fractions of a cent)."""
    return f"${amount:.2f}" if abs(amount) >= 1 else f"${amount:.4f}"


def _hours(start: str | datetime | None, end: str | datetime) -> float:
    if not start:
        return 0.0
    begin = datetime.fromisoformat(start) if isinstance(start, str) else start
    finish = datetime.fromisoformat(end) if isinstance(end, str) else end
    return max((finish - begin).total_seconds(), 0.0) / 3600
