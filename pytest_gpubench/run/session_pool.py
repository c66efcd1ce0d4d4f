"""Pay once per GPU: the cells of one reuse group run one after another on one session.

Renting is the slow, expensive part of a cell: provisioning, waiting for SSH and
installing Ollama take minutes that are billed whether or not a model runs. Cells
that share a GPU type and provider (``Cell.session_group``) therefore share one
session: the first rents it, the next ones find it in this process's
:class:`SessionPool` and only pull their model. Between cells the session is
re-checked (the API must still report it ``running``; Ollama must answer; the disk
must hold the next model, or earlier models are removed: :func:`make_room`) and it is released as
soon as the group's last cell on this worker is done, or a cell's failure says the
session itself is gone.

Money stays honest: the session's provisioning attempt (the first cell's row of
the ``attempts`` table) carries the whole bill, so a run's spend is unchanged;
each cell's ``cost_usd`` is its share, the time it held the session (the first
cell's share includes the setup).

Order matters too: :func:`~pytest_gpubench.cloud.reuse_split.order_for_reuse` puts a group's cells next to each other,
longest group first, so that under ``pytest-xdist --dist loadgroup`` (each group
an ``xdist_group``) the longest groups start first and the run ends sooner. When
workers would idle, :mod:`.reuse_split` splits a group over more sessions first:
each sub-group (``RTX_4090-vastai/2``) is then a group here, sized, reserved and
budgeted for its own cells.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..aio import run as run_async
from ..errors import Stage
from ..matrix.cells import Cell
from ..cloud.offers import unfit
from ..cloud.provider import Constraints
from .record import CellOutcome, CellRecorder
from ..remote.sysinfo import free_disk_bytes
from ..runtimes.base import Runtime

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only
    from ..remote.sysinfo import SystemInfo
    from .cell_benchmark import GpuSession
    from .provisioning import Provisioning
    from .run_context import RunContext

#: Failures that say the session itself is unusable: its later cells rent a new one.
SESSION_STAGES = frozenset({Stage.PROVISION, Stage.SSH_WAIT, Stage.SSH_CONNECT})
SESSION_FAILURES = frozenset({"InstanceLost", "interrupted"})
#: Statuses of a session that has ended.
GONE_STATUSES = frozenset({"stopped", "failed", "not_found"})


@dataclass
class Lease:
    """One rented session and what is known to be on it."""

    group: str
    provisioning: Provisioning
    gpu_session: GpuSession
    #: Cells that held it so far (the first rented it).
    turns: int = 1
    #: Models pulled on it, oldest first, and the one the last cell ran.
    models: list[str] = field(default_factory=list)
    last_model: str | None = None
    #: A cell's runtime started the model server on it (``Runtime.started_here``), with
    #: this many parallel requests (``Runtime.num_parallel``; None: unknown).
    runtime_started_here: bool = False
    runtime_num_parallel: int | None = None
    #: What system detection found at the first connection (the machine stays the same).
    system: SystemInfo | None = None
    released: bool = False

    @property
    def session_id(self) -> str:
        return self.gpu_session.session.id

    def unfit_for(self, wanted: Constraints) -> str | None:
        """Why the session's offer does not satisfy another cell's constraints; None if it does."""
        return unfit(self.gpu_session.offer.offer, wanted)


class SessionPool:
    """This process's reusable sessions, by reuse group.

    ``members`` is each group's cells in run order (record key, cell), from
    collection: what a new session is sized, reserved and budgeted for.
    """

    def __init__(self, run: RunContext, members: dict[str, list[tuple[str, Cell]]] | None = None) -> None:
        self.run = run
        self.members = members or {}
        self.leases: dict[str, Lease] = {}

    # ------------------------------------------------------------------ finding one

    def lease_for(self, cell: Cell, wanted: Constraints, recorder: CellRecorder) -> Lease | None:
        """The group's session if it can serve ``cell`` now; one that cannot is released."""
        group = cell.session_group
        lease = self.leases.get(group) if group else None
        if lease is None:
            return None
        unusable = lease.unfit_for(wanted) or self._status_problem(lease)
        if unusable:
            self.release(lease, recorder, f"not reused: {unusable}")
            return None
        return lease

    def _status_problem(self, lease: Lease) -> str | None:
        """What is wrong with the session per the API (not ``running``, or no answer); None if fine."""
        provider, timeout = lease.provisioning.provider, self.run.settings.stage_timeout(Stage.CLEANUP)
        try:
            session = run_async(provider.get_session(lease.session_id, Stage.INVENTORY), timeout + 10)
        except Exception as exc:  # noqa: BLE001 - any doubt: rent a new one rather than fail the cell
            return f"its status could not be read ({exc})"
        if session.status != "running":
            reason = f": {session.error}" if getattr(session, "error", None) else ""
            return f"the API reports it {session.status}{reason}"
        return None

    def remaining(self, record_key: str, cell: Cell) -> list[Cell]:
        """The cells a session rented for ``cell`` is expected to serve: its group's from
        ``record_key`` on, in run order (just ``cell`` without reuse)."""
        members = self.members.get(cell.session_group or "", [])
        keys = [key for key, _ in members]
        if record_key not in keys:
            return [cell]
        return [cell] + [member for _, member in members[keys.index(record_key) + 1:]]

    # ------------------------------------------------------------------ holding one

    def open(self, cell: Cell, provisioning: Provisioning, gpu_session: GpuSession) -> Lease:
        """Register the session ``cell`` just rented for its group."""
        lease = Lease(str(cell.session_group), provisioning, gpu_session)
        self.leases[lease.group] = lease
        return lease

    def adopt(self, lease: Lease, recorder: CellRecorder) -> None:
        """``recorder``'s cell goes on with the group's session."""
        lease.turns += 1
        session = lease.gpu_session.session
        recorder.session_adopted(lease.provisioning.recorder.record_key, session, lease.gpu_session.offer.offer,
                                 consumer=lease.provisioning.attempts[-1].consumer_id, turn=lease.turns)

    def hand_back(self, lease: Lease, recorder: CellRecorder, outcome: CellOutcome, next_group: str | None) -> None:
        """The cell is done with the session: keep it for the next cell of its group, or release it."""
        reason = self._release_reason(lease, outcome, next_group)
        if reason is None:
            recorder.session_handed_back()
            recorder.progress.status("SESSION_KEPT", session_id=lease.session_id, group=lease.group)
        else:
            self.release(lease, recorder, reason)

    def _release_reason(self, lease: Lease, outcome: CellOutcome, next_group: str | None) -> str | None:
        if lease.released:
            return "already released"
        if next_group != lease.group:
            return "the group's last cell here"
        if outcome.failure_reason in SESSION_FAILURES or outcome.failure_stage in SESSION_STAGES:
            return f"this cell lost it at {outcome.failure_stage}"
        return self._status_problem(lease)

    # ------------------------------------------------------------------ ending one

    def release(self, lease: Lease, recorder: CellRecorder | None, why: str) -> None:
        """Release the session (never raises); every cell row that used it is marked released."""
        if lease.released:
            return
        lease.released = True
        if self.leases.get(lease.group) is lease:
            del self.leases[lease.group]
        progress = recorder.progress if recorder is not None else None
        if progress is not None:
            progress.status("SESSION_RELEASE", session_id=lease.session_id, cells=lease.turns, why=why)
        provisioning = lease.provisioning
        provisioning.release_all(progress=progress)
        status = provisioning.recorder.session_status
        if recorder is not None and recorder is not provisioning.recorder:
            recorder.session_released(status, None)
        if status in GONE_STATUSES:
            try:
                self.run.store.end_shared_session(lease.session_id, session_status=status,
                                                  released_by="teardown")
            except Exception as exc:  # noqa: BLE001 - the release itself is done; only the bookkeeping failed
                if progress is not None:
                    progress.error(Stage.CLEANUP, f"recording the release of {lease.session_id} failed: {exc}")
        if lease.gpu_session.key_file is not None:
            lease.gpu_session.key_file.remove()

    def close(self) -> None:
        """End of the run in this process: release whatever is still held."""
        for lease in list(self.leases.values()):
            self.release(lease, None, "the run is over")


# --------------------------------------------------------------------------------------------------
# A runtime on a reused session: the next cell's model gets the GPU and the disk.
#
# Cells of one reuse group run one after another on one session
# (:class:`SessionPool`); what the runtime of each must do
# about the models earlier cells left there is here, in terms of the
# :class:`~pytest_gpubench.runtimes.base.Runtime` protocol.


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
