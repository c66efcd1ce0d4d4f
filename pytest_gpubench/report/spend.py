"""A run's cells and money, for the report's Spend section (docs/report.md).

Money is read from the manifest's ``attempts`` table: every rented session is one
row there (the renting attempt of a shared session carries its whole bill), so the
sum counts each session once, as the spend cap (:mod:`.budget`) does. The cells'
own ``cost_usd`` (each one's share of its session) is kept beside it; a
run without attempt rows (imported, or older) has only that.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from ..cloud.budget import spend_of
from ..store.base import Store
from ..store.records import RunRecord

__all__ = ["RunSpend", "run_spend"]


class RunSpend(BaseModel):
    """One run's cells and money."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    started_at: str
    finished_at: str
    status: str
    cells: int
    statuses: dict[str, int]
    sessions: int
    #: Billed session time (price x lifetime), each session once; see the module docstring.
    spent_usd: float
    #: The cells' ``cost_usd`` summed: their shares of the sessions they ran on.
    cells_cost_usd: float
    #: ``attempts`` or ``cells`` (a run without attempt rows, such as an imported one).
    spent_from: str
    #: Sessions with no recorded end: their cost is counted up to ``as_of``.
    open_sessions: int
    as_of: str


def run_spend(store: Store, run_id: str, now: datetime) -> RunSpend:
    """Run ``run_id``'s cells and spend; an unfinished run's open sessions count up to ``now``."""
    run = store.run(run_id) or RunRecord(run_id=run_id)
    cells = store.cells(run_id)
    attempts = store.attempts(run_id)
    finished = run.finished_at or ""
    as_of = datetime.fromisoformat(finished) if finished else now
    cells_cost = sum(cell.cost_usd or 0.0 for cell in cells)
    if attempts:
        spent, source = spend_of(attempts, as_of).spent, "attempts"
        sessions = {a.session_id for a in attempts if a.session_id}
        still_open = sum(1 for a in attempts if a.session_id and not a.ended_at)
    else:  # a run from before attempts were kept, or an imported one: the cells' own figures
        spent, source = cells_cost, "cells"
        sessions = {cell.session_id for cell in cells if cell.session_id}
        still_open = 0
    return RunSpend(
        run_id=run_id, started_at=run.started_at or min((c.created_at or "" for c in cells), default=""),
        finished_at=finished, status=run.status or "",
        cells=len(cells), statuses=dict(sorted(Counter(cell.status for cell in cells).items())),
        sessions=len(sessions), spent_usd=spent, cells_cost_usd=cells_cost, spent_from=source,
        open_sessions=still_open, as_of=as_of.isoformat(timespec="seconds"),
    )
