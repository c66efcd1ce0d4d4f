"""``--gpubench-resume [RUN_ID|last]``: finish a run that stopped or failed part-way.

Only the cells with no successful result in that run are run again, under the same
run id: their manifest rows are updated in place (``Manifest.restart_cell``), never
duplicated, and the cells that already succeeded are deselected. Sessions the
earlier attempt left running are released at start-up (``cleanup.py``) before any
cell runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from .cleanup import RunInfo
from .errors import UsageProblem
from .manifest import Manifest
from .processes import ProcessIdentity

FLAG = "--gpubench-resume"
#: How many run ids an unknown-run error lists.
SHOWN_RUNS = 10


class ResumePlan(BaseModel):
    """The run to resume and the cells it already finished successfully."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    #: Manifest cell ids (record keys) that ended ``success``: not run again.
    done: tuple[str, ...] = ()

    def header(self) -> str:
        """One line for the terminal header: what is resumed, what is skipped."""
        if not self.done:
            return f"gpubench: resuming run {self.run_id}: no cell succeeded yet, every selected cell runs"
        shown = ", ".join(self.done[:SHOWN_RUNS]) + (" ..." if len(self.done) > SHOWN_RUNS else "")
        return (f"gpubench: resuming run {self.run_id}: {len(self.done)} cell(s) already successful "
                f"are deselected: {shown}")


def plan_resume(manifest_path: Path, wanted: str, me: ProcessIdentity | None = None) -> ResumePlan:
    """Resolve ``wanted`` (a run id or ``last``) in the manifest; a problem is a ``UsageProblem``.

    Refuses a run that is still going on in another process.
    """
    if not Path(manifest_path).is_file():
        raise UsageProblem(f"{FLAG}: no manifest at {manifest_path}, so no run to resume "
                           "(pass the run's --gpubench-manifest PATH)")
    with Manifest(manifest_path, busy_timeout=10, retry_seconds=30) as manifest:
        known = manifest.run_ids()
        if not known:
            raise UsageProblem(f"{FLAG}: the manifest {manifest_path} has no runs yet")
        run_id = known[0] if wanted == "last" else wanted
        if run_id not in known:
            shown = ", ".join(known[:SHOWN_RUNS]) + (f" (and {len(known) - SHOWN_RUNS} more)"
                                                     if len(known) > SHOWN_RUNS else "")
            raise UsageProblem(f"{FLAG}: no run {wanted!r} in the manifest {manifest_path}; "
                               f"runs available, most recent first: {shown}")
        row = manifest.run(run_id)
        if row is not None:
            running = RunInfo.from_row(row).still_running(me)
            if running:
                raise UsageProblem(f"{FLAG}: {running}: wait for it to end or stop it, then resume")
        return ResumePlan(run_id=run_id, done=tuple(manifest.successful_cells(run_id)))


def still_to_run(keys: list[str | None], plan: ResumePlan) -> list[bool]:
    """For each item's record key (None: not a benchmark cell), whether it runs again."""
    done = set(plan.done)
    return [key is None or key not in done for key in keys]
