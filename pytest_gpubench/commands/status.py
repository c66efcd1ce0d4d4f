"""``gpubench status``: per phase (run), what is done, claimed (by whom, since when) and left.

Reads any store through the :class:`~pytest_gpubench.store.base.Store` protocol (``cells(run)``:
status, worker, started_at, lease_expires_at), so it answers the same for the SQLite manifest
and a store many machines share. A running cell whose lease has run out is *stale*: its holder
is gone, and the next controller to claim it takes it over. docs/runners.md shows the output.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from ..store.records import key_of

if TYPE_CHECKING:
    from ..store.base import Store
    from ..store.records import CellRecord

__all__ = ["CellState", "RunStatus", "add_parser", "render", "run_status", "show_status"]

#: Final statuses, and what a person calls them here.
DONE = ("success", "partial")


class CellState(BaseModel):
    """One cell as status tells it."""

    model_config = ConfigDict(frozen=True)

    cell: str
    #: The store's status: pending, running, success, partial, failed, skipped.
    status: str
    holder: str | None = None
    since: str | None = None
    lease_expires_at: float | None = None
    #: Running with a lease that has run out: the holder is gone, another controller takes it over.
    stale: bool = False


class RunStatus(BaseModel):
    """A phase's (run's) cells counted by state; its claims, and (asked for) every cell."""

    run_id: str
    success: int = 0
    partial: int = 0
    failed: int = 0
    skipped: int = 0
    claimed: int = 0
    stale: int = 0
    left: int = 0
    total: int = 0
    claims: list[CellState] = []
    cells: list[CellState] | None = None

    @property
    def done(self) -> int:
        return self.success + self.partial


def _state(record: CellRecord, now: float) -> CellState:
    expires = record.lease_expires_at
    running = record.status == "running"
    return CellState(cell=record.cell_id or key_of(record.row_id, record.run_id), status=record.status,
                     holder=record.worker if running else None, since=record.started_at if running else None,
                     lease_expires_at=expires if running else None,
                     stale=running and expires is not None and expires <= now)


def run_status(store: Store, run_id: str, *, now: float | None = None, with_cells: bool = False) -> RunStatus:
    """Count ``run_id``'s cells by state at ``now`` (seconds since the epoch; default: now)."""
    at = time.time() if now is None else now
    states = [_state(record, at) for record in store.cells(run_id)]
    status = RunStatus(run_id=run_id, total=len(states), claims=[s for s in states if s.status == "running"],
                       cells=states if with_cells else None)
    for state in states:
        if state.status in ("success", "partial", "failed", "skipped"):
            setattr(status, state.status, getattr(status, state.status) + 1)
        elif state.status == "running":
            status.claimed += 1
            status.stale += state.stale
        else:
            status.left += 1
    return status


def _duration(seconds: float) -> str:
    """``40 s``, ``5 min``, ``2 h 5 min``."""
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def _claim_text(state: CellState, now: float) -> str:
    text = f"by {state.holder or 'unknown'}" + (f" since {state.since}" if state.since else "")
    if state.lease_expires_at is None:
        return text + ", no lease (held until it finishes)"
    if state.stale:
        return text + f", lease expired {_duration(now - state.lease_expires_at)} ago: stale, will be taken over"
    return text + f", lease {_duration(state.lease_expires_at - now)} left"


def render(statuses: Sequence[RunStatus], *, now: float | None = None) -> list[str]:
    """The text ``gpubench status`` prints: a line per phase, its claims, and its cells when asked."""
    at = time.time() if now is None else now
    lines: list[str] = []
    for status in statuses:
        stale = f" ({status.stale} stale)" if status.stale else ""
        lines.append(f"{status.run_id}: {status.done} done ({status.success} success, {status.partial} partial), "
                     f"{status.failed} failed, {status.skipped} skipped, {status.claimed} claimed{stale}, "
                     f"{status.left} left; {status.total} cells")
        width = max((len(s.cell) for s in (status.cells or status.claims)), default=0)
        for claim in status.claims:
            lines.append(f"  claimed  {claim.cell:<{width}}  {_claim_text(claim, at)}")
        for cell in status.cells or ():
            if cell.status != "running":
                lines.append(f"  {_word(cell.status):<7}  {cell.cell}")
    return lines


def _word(status: str) -> str:
    return "left" if status == "pending" else status


def show_status(store: Store, run_id: str | None, *, cells: bool, as_json: bool, out: IO[str],
                now: float | None = None) -> int:
    """Print the status of ``run_id`` (None: every run, most recent first) to ``out``."""
    from ..errors import EXIT_OK

    at = time.time() if now is None else now
    statuses = [run_status(store, run, now=at, with_cells=cells)
                for run in ([run_id] if run_id is not None else store.run_ids())]
    if as_json:
        runs = [s.model_dump(exclude_none=True) | {"done": s.done} for s in statuses]
        json.dump({"store": store.location, "now": at, "runs": runs}, out, indent=2)
        out.write("\n")
    elif not statuses:
        out.write(f"no runs in {store.location} yet\n")
    else:
        out.write("\n".join(render(statuses, now=at)) + "\n")
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction,
               handler: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """Register ``gpubench status`` (its handler opens the store: commands/cli.py, which gives it
    ``--store`` from the option table)."""
    status = commands.add_parser(
        "status", help="per phase (run): what is done, claimed (by whom, since when) and left",
        description="For each run (a phase of a runners file is a run named after it): cells done (success, "
                    "partial), failed, skipped, claimed (running: the holder, since when, and its lease; a "
                    "lease run out is stale: another controller takes the cell over) and left (pending). "
                    "Works on any store (--store). See docs/runners.md.")
    status.add_argument("--run", "--phase", dest="run", metavar="NAME|last",
                        help="only this run or phase (default: every run, most recent first)")
    status.add_argument("--cells", action="store_true", help="list every cell with its state")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=handler)
    return status
