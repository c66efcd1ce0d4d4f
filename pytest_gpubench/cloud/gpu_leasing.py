"""Holding GPUs of a shared machine for one cell: claim, wait, heartbeat, release.

:class:`GpuLeaseKeeper` is what the ``hosts`` and ``local`` providers (:mod:`.hosts_provider`)
lease through: it claims GPUs in the store (:meth:`~pytest_gpubench.store.base.Store.claim_gpus`,
atomic across processes), waits with progress while every matching GPU is busy, renews a
held lease on a heartbeat (a third of its time to live) so that only a dead run's lease
runs out, and releases it. Store calls are short SQLite transactions, run in a thread so
the event loop never waits on another process's write lock.

The record, :class:`GpuLease`, is some GPUs of one machine held by one holder: what the
store hands a provider of shared machines. A lease expires unless renewed, so a dead
run's GPUs come free by themselves. It is defined here, not in ``store/``, so ``cloud/``
reads it without importing the store (as :class:`~.provider.OwnedSession`), and so is
:class:`GpuLeaseBook`, the part of the ``Store`` protocol a provider leases through
(``Store`` extends it). ``Lease`` is the session pool's: these are ``GpuLease``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


class GpuLease(BaseModel):
    """Some GPUs of one machine, held by one holder until released or expired."""

    model_config = ConfigDict(frozen=True)

    lease_id: str
    #: The machine (a host's inventory name, ``local`` for this machine).
    machine: str
    #: nvidia-smi indices, ascending.
    gpu_indices: tuple[int, ...]
    #: Who holds it, for people: the run, the worker and the cell.
    holder: str
    run_id: str | None = None
    #: Seconds since the epoch.
    acquired_at: float
    expires_at: float
    released_at: float | None = None

    def active(self, now: float) -> bool:
        """Held at ``now``: not released and not expired."""
        return self.released_at is None and self.expires_at > now


@runtime_checkable
class GpuLeaseBook(Protocol):
    """Where GPU leases are kept: every :class:`~pytest_gpubench.store.base.Store` (which
    extends this protocol), handed to the ``hosts`` and ``local`` providers as an opener."""

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        """Lease ``count`` of ``gpus`` (nvidia-smi indices) of ``machine`` for ``ttl`` seconds,
        the lowest free ones; None when fewer are free. ``now``: seconds since the epoch (tests)."""

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        """Hold the lease ``ttl`` seconds from now; False when it was released or had expired."""

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        """End the lease (idempotent); an expired one keeps its expiry as its end."""

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        """Leases (of ``machine``, or all) oldest first; with ``active_at``, those held then."""


#: How often a waiting cell asks again for free GPUs (seconds, real time; at most this).
WAIT_POLL_SECONDS = 1.0


@dataclass
class Held:
    """One lease being kept alive."""

    lease: GpuLease
    heartbeat: asyncio.Task[None] | None = None
    #: Set when a renewal found the lease gone (expired: its GPUs may be another's now).
    lost: str = ""


@dataclass
class GpuLeaseKeeper:
    """Leases GPUs through a store for one process's cells; ``ttl`` in seconds."""

    store: Callable[[], GpuLeaseBook]
    ttl: float
    holder_prefix: str = ""
    run_id: str | None = None
    held: dict[str, Held] = field(default_factory=dict)

    async def try_claim(self, machine: str, gpus: list[int], count: int, holder: str) -> GpuLease | None:
        """Claim ``count`` of ``gpus`` now, or None when fewer are free."""
        store = self.store()
        lease = await asyncio.to_thread(store.claim_gpus, machine, gpus, count,
                                        holder=f"{self.holder_prefix}{holder}", ttl=self.ttl, run_id=self.run_id)
        if lease is not None:
            self._keep(lease)
        return lease

    async def busy_with(self, machine: str) -> list[GpuLease]:
        """The leases holding ``machine``'s GPUs now (who the cell waits for)."""
        store = self.store()
        return await asyncio.to_thread(store.gpu_leases, machine, active_at=time.time())

    def _keep(self, lease: GpuLease) -> None:
        held = Held(lease)
        held.heartbeat = asyncio.get_running_loop().create_task(self._beat(held))
        self.held[lease.lease_id] = held

    async def _beat(self, held: Held) -> None:
        store, interval = self.store(), self.ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                renewed = await asyncio.to_thread(store.renew_gpu_lease, held.lease.lease_id, self.ttl)
            except Exception:  # noqa: BLE001 - a store hiccup: the next beat tries again, well within the ttl
                continue
            if not renewed:
                held.lost = (f"the lease on GPU(s) {list(held.lease.gpu_indices)} of {held.lease.machine} "
                             "expired before it could be renewed (the run stalled for longer than the lease "
                             "lasts); another run may use them now")
                return

    def lost(self, lease_id: str) -> str:
        """Why the lease is no longer held, or ``""``."""
        held = self.held.get(lease_id)
        return held.lost if held is not None else ""

    async def release(self, lease_id: str) -> None:
        """Stop renewing and end the lease (idempotent)."""
        held = self.held.pop(lease_id, None)
        if held is None:
            return
        if held.heartbeat is not None:
            held.heartbeat.cancel()
        store = self.store()
        await asyncio.to_thread(store.release_gpu_lease, lease_id)

    async def release_all(self) -> None:
        for lease_id in list(self.held):
            try:
                await self.release(lease_id)
            except Exception:  # noqa: BLE001 - closing: an unreleased lease still expires
                pass
