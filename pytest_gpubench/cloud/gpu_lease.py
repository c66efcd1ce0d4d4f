"""A lease on some GPUs of one machine: what the store hands a provider of shared machines.

The ``hosts`` and ``local`` providers (:mod:`.hosts_provider`) lease a machine's GPUs
through the store (:meth:`~pytest_gpubench.store.base.Store.claim_gpus`), so two runs
or two xdist workers never benchmark on the same GPU at once. A lease expires unless
renewed (a heartbeat while the cell runs), so a dead run's GPUs come free by themselves.
Defined here, not in ``store/``, so ``cloud/`` reads it without importing the store
(as :class:`~.provider.OwnedSession`), and so is :class:`GpuLeaseBook`, the part of the
``Store`` protocol a provider leases through (``Store`` extends it). ``Lease`` is the
session pool's: these are ``GpuLease``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

__all__ = ["GpuLease", "GpuLeaseBook"]


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
