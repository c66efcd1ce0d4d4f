"""Which store a location names, opened: the one door every reader and writer comes through.

The plugin, ``gpubench`` commands, resume and plan estimates open their store here,
never a concrete class. A location is one of:

* a SQLite file path (the embedded default, the manifest);
* ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``postgres://``): one database
  many machines share (:mod:`.postgres_store`, the ``[postgresql]`` extra);
* ``git+URL`` (``git+file:///srv/results.git``, ``git+ssh://...``): seed 002's results
  repository, for teams without a database (:mod:`.git_store`), with a SQLite manifest
  beside it for everything the repository does not hold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..cloud.processes import ProcessIdentity
from ..errors import UnknownRun, UsageProblem
from ..ids import ID_RULE, is_id, shown_id
from ..errors import redact
from ..settings import MAX_RUN_ID
from .base import Store
from .records import RunInfo

__all__ = ["LAST", "POSTGRES_SCHEMES", "SHOWN_RUNS", "StoreKind", "open_store", "redact", "resolve_run",
           "store_exists", "store_kind"]

#: ``scheme://...`` (or ``scheme:/...``, what ``Path`` makes of it): a location that names
#: a server, not a file. Two letters at least, so ``C:/...`` stays a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
POSTGRES_SCHEMES = ("postgresql", "postgres")
_SUPPORTED = ("a SQLite file path (for example reports/manifest.db), postgresql://USER@HOST/DB, "
              "or git+URL of a results repository (git+file:///srv/results.git)")

StoreKind = str  # "sqlite" | "postgresql" | "git"


def store_kind(location: str | Path) -> StoreKind:
    """``sqlite``, ``postgresql`` or ``git``; another URL scheme is a ``UsageProblem`` naming what is supported."""
    found = _URL.match(str(location))
    if not found:
        return "sqlite"
    scheme = found[1].lower()
    if scheme in POSTGRES_SCHEMES:
        return "postgresql"
    if scheme.startswith("git+"):
        return "git"
    raise UsageProblem(f"store {found[1]}://...: not a store this version knows; a store is {_SUPPORTED}")


def open_store(location: str | Path, *, read_only: bool = False, **options: Any) -> Store:
    """The store at ``location``, created as needed.

    ``options`` tune the SQLite file (``busy_timeout``, ``retry_seconds``: see
    :class:`~.manifest.Manifest`); the other stores take what applies to them and
    ignore the rest. ``read_only``: for a command that only reads (report, export, status,
    browse, plan): a SQLite file is opened ``mode=ro`` and must already be a current manifest
    (else :class:`~pytest_gpubench.errors.NotAManifest` or
    :class:`~pytest_gpubench.errors.MigrationNeeded`, the file unchanged). A server store
    (PostgreSQL, git) keeps its own rules: it is reached as for writing.
    """
    kind = store_kind(location)
    if kind == "postgresql":
        from .postgres_store import PostgresStore  # psycopg is loaded only for such a store

        return PostgresStore.open(str(location), **options)
    if kind == "git":
        from .git_store import GitStore

        return GitStore.open(str(location), **options)
    from .sqlite_store import SqliteStore  # sqlite-utils is loaded only when a store is opened

    return SqliteStore.open(Path(location), read_only=read_only, **options)


def store_exists(location: str | Path) -> bool:
    """Whether ``location`` already holds a store: looking must never create one.

    A server store (PostgreSQL, git) is there when it answers; it is reached, not
    created, and a store that cannot be reached raises its problem (with the URL's
    password hidden), not "missing".
    """
    kind = store_kind(location)
    if kind == "postgresql":
        from .postgres_store import PostgresStore

        return PostgresStore.exists(str(location))
    if kind == "git":
        from .git_store import GitStore

        return GitStore.exists(str(location))
    return Path(location).is_file()


# --------------------------------------------------------------------------------------------------
# Which run a person means: a run id, or ``last`` for the most recent one.
#
# The one resolution of a run name, for every way in that takes one
# (``gpubench export/upload/report --run``, ``--gpubench-resume``): it asks only the
# :class:`~.base.Store` protocol, and says what went wrong in one wording.

if TYPE_CHECKING:
    from .base import Store


#: The name of the most recent run.
LAST = "last"
#: How many run ids an unknown-run error lists.
SHOWN_RUNS = 10


def resolve_run(store: Store, wanted: str) -> str:
    """The run id ``wanted`` names in ``store``: the most recent run for :data:`LAST`,
    else ``wanted`` itself if the store knows it.

    Raises :class:`~pytest_gpubench.errors.UnknownRun` when the store has no runs,
    or none of that id (naming the most recent ones).
    """
    known = store.run_ids()
    if not known:
        raise UnknownRun(wanted, f"the manifest {store.location} has no runs yet")
    if wanted == LAST:
        return known[0]
    if wanted not in known:
        shown = ", ".join(known[:SHOWN_RUNS]) + (f" (and {len(known) - SHOWN_RUNS} more)"
                                                 if len(known) > SHOWN_RUNS else "")
        raise UnknownRun(wanted, f"no run {wanted!r} in the manifest {store.location}; "
                                 f"runs available, most recent first: {shown}")
    return wanted


# --------------------------------------------------------------------------------------------------
# ``--gpubench-resume [RUN_ID|last]``: finish a run that stopped or failed part-way.
#
# The resumed run's selection is what its manifest recorded: exactly its cells with no
# successful result run again, under the same run id. Their manifest rows are updated
# in place (``Store.restart_cell``), never duplicated; the cells that already
# succeeded are deselected, and so are the cells the run never selected (a run started
# with ``-k "3090 or A100"`` resumes without its RTX 4090 cells, whatever the new
# command line collects). Filters on the resuming command line narrow it further.
# Sessions the earlier attempt left running are released at start-up (``cleanup.py``)
# before any cell runs.
#
# A run that recorded no cell at all (it stopped before its collection ended) has no
# known selection: then every cell selected now runs.

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
