"""A lease on some GPUs of one machine: what the store hands a provider of shared machines.

The ``hosts`` and ``local`` providers (:mod:`.hosts_provider`) lease a machine's GPUs
through the store (:meth:`~pytest_gpubench.store.base.Store.claim_gpus`), so two runs
or two xdist workers never benchmark on the same GPU at once. A lease expires unless
renewed (a heartbeat while the cell runs), so a dead run's GPUs come free by themselves.
Defined here, not in ``store/``, so ``cloud/`` reads it without importing the store
(as :class:`~.owned.OwnedSession`). ``Lease`` is the session pool's: these are ``GpuLease``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["GpuLease"]


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

