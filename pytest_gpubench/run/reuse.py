"""A runtime on a reused session: the next cell's model gets the GPU and the disk.

Cells of one reuse group run one after another on one session
(:mod:`pytest_gpubench.run.session_pool`); what the runtime of each must do
about the models earlier cells left there is here, in terms of the
:class:`~pytest_gpubench.runtimes.base.Runtime` protocol.
"""

from __future__ import annotations

from collections.abc import Callable

from .session_pool import Lease
from ..matrix.cells import Cell
from ..remote.sysinfo import free_disk_bytes
from ..runtimes.base import Runtime

GB = 1_000_000_000


async def make_room(runtime: Runtime, lease: Lease, cell: Cell, status: Callable[..., None],
                    timeout: float) -> None:
    """Before the next cell's model on a reused session: the GPU to itself, and disk for it.

    Models of earlier cells are unloaded from GPU memory (they would share the card
    and the memory readings). When the disk cannot hold the new model (its VRAM need,
    an upper bound of its download), models pulled earlier are removed, oldest first,
    until it can; if it still cannot, the pull goes ahead and the runtime says why it fails.
    ``status`` writes a progress line (``MODEL_REMOVED``, ``DISK_LOW``).
    """
    wanted = runtime.canonical_model(cell.model)
    for name in await runtime.loaded_models():
        if runtime.canonical_model(name) != wanted:
            await runtime.unload(name)
    if wanted in {runtime.canonical_model(model) for model in lease.models}:
        return
    need = cell.vram_gb * GB
    free = await free_disk_bytes(runtime.conn, timeout)
    for old in list(lease.models):
        if free is None or free >= need:
            break
        await runtime.remove(old)
        lease.models.remove(old)
        status("MODEL_REMOVED", model=old, free_gb=round(free / GB, 1), needed_gb=cell.vram_gb)
        free = await free_disk_bytes(runtime.conn, timeout)
    if free is not None and free < need:
        status("DISK_LOW", free_gb=round(free / GB, 1), needed_gb=cell.vram_gb)


def note_model(lease: Lease, runtime: Runtime, model: str) -> None:
    """Remember what a cell left on the session: its model, and the server it may have started."""
    if runtime.canonical_model(model) not in {runtime.canonical_model(m) for m in lease.models}:
        lease.models.append(model)
    lease.last_model = model
    if runtime.started_here:
        lease.runtime_started_here, lease.runtime_num_parallel = True, runtime.num_parallel


def take_over_server(lease: Lease | None, runtime: Runtime) -> bool:
    """``runtime`` takes over the server an earlier cell's runtime started on the session
    (:func:`note_model`): it may restart and stop it, with the same parallelism. True
    then, and installing is done already; False on a fresh session or a server found running.
    """
    if lease is None or not lease.runtime_started_here:
        return False
    runtime.started_here, runtime.num_parallel = True, lease.runtime_num_parallel
    return True
