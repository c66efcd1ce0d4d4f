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

__all__ = ["claimable", "decide_claim"]


def _expired(current: Mapping[str, Any], worker: str, at: float) -> bool:
    expires = current.get("lease_expires_at")
    return (current["status"] == "running" and current["worker"] != worker and expires is not None
            and expires <= at)


def claimable(current: Mapping[str, Any], worker: str, at: float) -> bool:
    """Whether ``worker`` would win the cell ``current`` at ``at`` (seconds since the epoch)."""
    status = current["status"]
    return status == "pending" or (status == "running" and current["worker"] == worker) or _expired(
        current, worker, at)


def decide_claim(row_id: str, current: Mapping[str, Any], worker: str, at: float,
                 lease: float | None) -> tuple[Claim, dict[str, Any] | None]:
    """The claim ``worker`` makes on ``current`` at ``at``, and the cell's columns to write (None: nothing).

    A pending cell, the claimant's own, or a running one whose lease expired before
    ``at`` is won (``lease``: the new expiry); any other is held by its worker.
    """
    status, holder = current["status"], current["worker"]
    if not claimable(current, worker, at):
        return Claim(row_id=row_id, holder=holder, won=False, status=status, since=current["started_at"],
                     lease_expires_at=current.get("lease_expires_at")), None
    expired = _expired(current, worker, at)
    started = (current["started_at"] if status == "running" and holder == worker else None) or utc_now()
    claim = Claim(row_id=row_id, holder=worker, won=True, since=started, lease_expires_at=lease,
                  taken_over_from=holder if expired else None)
    return claim, {"status": "running", "worker": worker, "started_at": started, "lease_expires_at": lease}
