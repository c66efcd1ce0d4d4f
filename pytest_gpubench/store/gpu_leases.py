"""GPU leases in the SQLite manifest: the ``gpu_leases`` table and its atomic claim.

One row per leased GPU (``lease_id`` groups a lease's rows). A claim reads which GPUs
of the machine are held (not released, not expired) and inserts its rows in one
``BEGIN IMMEDIATE`` transaction: SQLite takes the write lock first, so two processes
claiming at once are serialised and never both get one GPU. Times are seconds since
the epoch (``time.time()``), so expiry is one comparison.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..cloud.gpu_lease import GpuLease
from .schema import GPU_LEASES_TABLE
from .sqlite import ManifestStore

__all__ = ["GpuLeasesMixin"]

TABLE = GPU_LEASES_TABLE


class GpuLeasesMixin(ManifestStore):
    """Claim, renew, release and list GPU leases (see the Store protocol's promises)."""

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        if count < 1:
            raise ValueError(f"a lease needs at least one GPU, not {count}")

        def claim() -> GpuLease | None:
            moment = time.time() if now is None else now
            busy = {row[0] for row in self.db.execute(
                f"SELECT gpu_index FROM {TABLE} WHERE machine = ? AND released_at IS NULL AND expires_at > ?",
                [machine, moment]).fetchall()}
            rows = lease_rows(machine, gpus, count, busy, holder=holder, ttl=ttl, run_id=run_id, moment=moment)
            if rows is None:
                return None
            self.db.table(TABLE).insert_all(rows)
            return _lease(rows)

        return self._write(claim)

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        def renew() -> bool:
            moment = time.time() if now is None else now
            cursor = self.db.execute(
                f"UPDATE {TABLE} SET expires_at = ? WHERE lease_id = ? AND released_at IS NULL AND expires_at > ?",
                [moment + ttl, lease_id, moment])
            return cursor.rowcount > 0

        return self._write(renew)

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        def release() -> None:
            moment = time.time() if now is None else now
            # An expired lease keeps its expiry as its end: it stopped holding then, not now.
            self.db.execute(f"UPDATE {TABLE} SET released_at = MIN(?, expires_at) "
                            "WHERE lease_id = ? AND released_at IS NULL", [moment, lease_id])

        self._write(release)

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        where, params = ("machine = ?", [machine]) if machine is not None else (None, None)
        rows = self._retry(lambda: list(self.db.table(TABLE).rows_where(
            where, params, order_by="acquired_at, lease_id, gpu_index")))
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["lease_id"], []).append(row)
        leases = [_lease(group) for group in grouped.values()]
        return [lease for lease in leases if active_at is None or lease.active(active_at)]


def lease_rows(machine: str, gpus: Sequence[int], count: int, busy: set[int], *, holder: str, ttl: float,
               run_id: str | None, moment: float) -> list[dict[str, Any]] | None:
    """The rows of a new lease on the ``count`` lowest of ``gpus`` not ``busy``; None when fewer are free."""
    free = [index for index in sorted(set(gpus)) if index not in busy]
    if len(free) < count:
        return None
    lease_id = uuid.uuid4().hex[:16]
    return [{"lease_id": lease_id, "machine": machine, "gpu_index": index, "holder": holder,
             "run_id": run_id, "acquired_at": moment, "expires_at": moment + ttl} for index in free[:count]]


def _lease(rows: list[dict[str, Any]]) -> GpuLease:
    first = rows[0]
    return GpuLease(lease_id=first["lease_id"], machine=first["machine"],
                    gpu_indices=tuple(sorted(row["gpu_index"] for row in rows)), holder=first["holder"],
                    run_id=first.get("run_id"), acquired_at=first["acquired_at"], expires_at=first["expires_at"],
                    released_at=first.get("released_at"))
