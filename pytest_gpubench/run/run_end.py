"""Who records the end of a run several controllers share, and with which status.

Each controller (``pytest`` process) of a shared run ends on its own. The run's end is
recorded by the last of them: one that sees no cell of the run running under another
controller with a live lease. Its status is the worst of its own exit status and the
cells' outcomes, so a run whose earlier controller failed a cell does not read
``passed`` because the last one passed; a status an earlier controller recorded as
``failed`` is not overwritten (a run finished once may be started again: resume).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..cloud.processes import held_by, holder_alive

if TYPE_CHECKING:
    from ..store.base import Store


def others_running(store: Store, run_id: str, me: str) -> str | None:
    """A holder other than ``me`` (or its xdist workers) running a cell of ``run_id`` under a
    live lease (and not known dead), or None when this controller is the run's last."""
    now = time.time()
    for cell in store.cells(run_id):
        if (cell.status == "running" and cell.worker and not held_by(cell.worker, me)
                and cell.lease_expires_at is not None and cell.lease_expires_at > now
                and holder_alive(cell.worker) is not False):
            return cell.worker
    return None


def shared_run_status(store: Store, run_id: str, mine: str) -> str:
    """The run's end status when this controller is its last: ``mine`` (its own
    :func:`.outcome.run_status`), unless it is ``passed`` and either a cell of the run ended
    failed under any controller, or an earlier controller already recorded a worse end."""
    if mine != "passed":
        return mine
    if any(cell.status == "failed" for cell in store.cells(run_id)):
        return "failed"
    run = store.run(run_id)
    earlier = run.status if run is not None and run.finished_at else None
    return earlier if earlier not in (None, "running", "passed") else mine
