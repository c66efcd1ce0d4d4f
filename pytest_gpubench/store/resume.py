"""``--gpubench-resume [RUN_ID|last]``: finish a run that stopped or failed part-way.

The resumed run's selection is what its manifest recorded: exactly its cells with no
successful result run again, under the same run id. Their manifest rows are updated
in place (``Store.restart_cell``), never duplicated; the cells that already
succeeded are deselected, and so are the cells the run never selected (a run started
with ``-k "3090 or A100"`` resumes without its RTX 4090 cells, whatever the new
command line collects). Filters on the resuming command line narrow it further.
Sessions the earlier attempt left running are released at start-up (``cleanup.py``)
before any cell runs.

A run that recorded no cell at all (it stopped before its collection ended) has no
known selection: then every cell selected now runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..ids import ID_RULE, is_id, shown_id
from ..settings import MAX_RUN_ID
from ..errors import UnknownRun, UsageProblem
from .run_choice import SHOWN_RUNS, resolve_run
from .opening import open_store, store_exists
from .records import RunInfo
from .redaction import redact
from ..cloud.processes import ProcessIdentity

FLAG = "--gpubench-resume"


class ResumePlan(BaseModel):
    """The run to resume: the cells it selected and those it already finished successfully."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    #: Manifest cell ids (record keys) that ended ``success``: not run again.
    done: tuple[str, ...] = ()
    #: Every cell id the run recorded (its selection); empty when it recorded none.
    cells: tuple[str, ...] = ()

    def header(self) -> str:
        """One line for the terminal header: what is resumed, what is skipped."""
        if not self.cells:
            return (f"gpubench: resuming run {self.run_id}: it recorded no cells, "
                    "so every cell selected now runs")
        left = len(self.cells) - len(self.done)
        head = (f"gpubench: resuming run {self.run_id}: {left} of its {len(self.cells)} cell(s) "
                "still to run; cells it did not select are deselected")
        if not self.done:
            return head
        shown = ", ".join(self.done[:SHOWN_RUNS]) + (" ..." if len(self.done) > SHOWN_RUNS else "")
        return f"{head}; {len(self.done)} cell(s) already successful are deselected: {shown}"


def plan_resume(manifest_path: Path, wanted: str, me: ProcessIdentity | None = None) -> ResumePlan:
    """Resolve ``wanted`` (a run id or ``last``) in the manifest; a problem is a ``UsageProblem``.

    Refuses a run that is still going on in another process.
    """
    if not store_exists(manifest_path):
        raise UsageProblem(f"{FLAG}: no manifest at {redact(manifest_path)}, so no run to resume "
                           "(pass the run's --gpubench-manifest PATH)")
    with open_store(manifest_path, busy_timeout=10, retry_seconds=30) as store:
        try:
            run_id = resolve_run(store, wanted)
        except UnknownRun as exc:
            raise UsageProblem(f"{FLAG}: {exc.message}") from None
        if not is_id(run_id, MAX_RUN_ID):  # a row of a shared store: it would name the progress folder
            raise UsageProblem(f"{FLAG}: the store's run id {shown_id(run_id)} is not a run id (1-{MAX_RUN_ID} "
                               f"{ID_RULE}): it cannot be resumed")
        run = store.run(run_id)
        if run is not None:
            running = RunInfo.of(run).still_running(me)
            if running:
                raise UsageProblem(f"{FLAG}: {running}: wait for it to end or stop it, then resume")
        cells = store.cells(run_id)
        return ResumePlan(run_id=run_id, done=tuple(c.cell_id for c in cells if c.status == "success"),
                          cells=tuple(c.cell_id for c in cells))


def still_to_run(keys: list[str | None], plan: ResumePlan) -> list[bool]:
    """For each item's record key (None: not a benchmark cell), whether it runs again:
    a cell of the resumed run that did not succeed (any cell, if the run recorded none)."""
    done, selected = set(plan.done), set(plan.cells)
    return [key is None or (key not in done and (not selected or key in selected)) for key in keys]
