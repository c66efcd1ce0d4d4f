"""Who wins a claim on a cell, given the cell as stored: the rule every store applies.

Each store reads the cell inside its own atomic write (SQLite's ``BEGIN IMMEDIATE``,
PostgreSQL's ``SELECT ... FOR UPDATE SKIP LOCKED``) and applies the answer; the rule
itself is here once, so the stores cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import Claim
from .sqlite import utc_now

__all__ = ["ABANDONED", "REOPENED", "abandoned", "claimable", "decide_claim"]

#: The failure reason of a cell cleanup closed because its holder's process was gone (not its
#: run's own failure): the claim rule lets the next claimant take it over.
ABANDONED = "abandoned"

#: What an abandoned cell's row says of its end, cleared when it is taken over (it runs again).
REOPENED = ("completed_at", "failure_stage", "failure_reason", "error_message", "cost_usd")


def abandoned(status: str | None, failure_reason: str | None) -> bool:
    """Whether a cell so ended was abandoned: cleanup found its holder's process gone, released
    its session and marked it ``failed`` as ``abandoned`` (``run/cleanup.py``). Its run never
    failed it: like a running cell whose lease ran out, the next claimant takes it over."""
    return status == "failed" and failure_reason == ABANDONED


def _expired(current: Mapping[str, Any], worker: str, at: float) -> bool:
    expires = current.get("lease_expires_at")
    return (current["status"] == "running" and current["worker"] != worker and expires is not None
            and expires <= at)


def _taken_over(current: Mapping[str, Any], worker: str, at: float) -> bool:
    """Whether ``worker``'s claim at ``at`` takes the cell from a holder gone (an expired lease, or abandoned)."""
    return _expired(current, worker, at) or abandoned(current["status"], current.get("failure_reason"))


def claimable(current: Mapping[str, Any], worker: str, at: float) -> bool:
    """Whether ``worker`` would win the cell ``current`` at ``at`` (seconds since the epoch)."""
    status = current["status"]
    return status == "pending" or (status == "running" and current["worker"] == worker) or _taken_over(
        current, worker, at)


def decide_claim(row_id: str, current: Mapping[str, Any], worker: str, at: float,
                 lease: float | None) -> tuple[Claim, dict[str, Any] | None]:
    """The claim ``worker`` makes on ``current`` at ``at``, and the cell's columns to write (None: nothing).

    A pending cell, the claimant's own, a running one whose lease expired before ``at``,
    or an abandoned one (taken over: it runs again, without its recorded end) is won
    (``lease``: the new expiry); any other is held by its worker, or ended.
    """
    status, holder = current["status"], current["worker"]
    if not claimable(current, worker, at):
        return Claim(row_id=row_id, holder=holder, won=False, status=status, since=current["started_at"],
                     lease_expires_at=current.get("lease_expires_at")), None
    taken = _taken_over(current, worker, at)
    started = (current["started_at"] if status == "running" and holder == worker else None) or utc_now()
    claim = Claim(row_id=row_id, holder=worker, won=True, since=started, lease_expires_at=lease,
                  taken_over_from=holder if taken else None)
    columns: dict[str, Any] = {"status": "running", "worker": worker, "started_at": started, "lease_expires_at": lease}
    if status != "running" and taken:
        columns.update(dict.fromkeys(REOPENED))
    return claim, columns
