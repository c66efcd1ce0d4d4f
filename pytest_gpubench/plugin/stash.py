"""``config.stash`` / ``item.stash`` keys, and the run context's one creator.

Imported by the plugin at load: the types named here are imported only for type
checkers, and the run context's modules only when one is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the key types, named in strings: nothing heavy is imported at load
    from ..run.session_pool import Lease  # noqa: F401
    from ..matrix.cells import Cell  # noqa: F401
    from ..matrix.selection import CellFilters  # noqa: F401
    from ..settings import Settings  # noqa: F401
    from ..store.resume import ResumePlan  # noqa: F401
    from ..run.record import CellRecorder  # noqa: F401
    from ..run.run_context import RunContext
    from ..sandbox.process import SandboxProcess  # noqa: F401

SETTINGS_KEY = pytest.StashKey["Settings"]()
RUN_CONTEXT_KEY = pytest.StashKey["RunContext"]()
#: The matrix cell of an item (matrix items and marker-parametrized tests).
CELL_KEY = pytest.StashKey["Cell"]()
#: The manifest key of an item: the cell id, plus the test name for Python tests.
RECORD_KEY = pytest.StashKey[str]()
RECORDER_KEY = pytest.StashKey["CellRecorder"]()
#: ``{"setup": (report, exception), "call": ...}`` as the phases finish.
REPORTS_KEY = pytest.StashKey["dict[str, tuple[pytest.TestReport, BaseException | None]]"]()
#: The sandbox process this (controller) process started, if any.
SANDBOX_KEY = pytest.StashKey["SandboxProcess"]()
#: ``--gpubench-resume``: the run resumed and its cells already successful (resume.ResumePlan).
RESUME_KEY = pytest.StashKey["ResumePlan"]()
#: Session reuse: an item's reuse group (None: a session of its own), the group of the
#: item that runs after it on this process, and the session lease it runs on.
GROUP_KEY = pytest.StashKey["str | None"]()
NEXT_GROUP_KEY = pytest.StashKey["str | None"]()
LEASE_KEY = pytest.StashKey["Lease"]()
#: ``{group: [(record key, cell), ...]}`` in run order, from collection.
REUSE_GROUPS_KEY = pytest.StashKey["dict[str, list[tuple[str, Cell]]]"]()
#: The run's --gpubench-gpu/provider/model filters (``filters.CellFilters``).
CELL_FILTERS_KEY = pytest.StashKey["CellFilters"]()
#: Whether the command line names matrix files (``matrix_scan.runs_matrix_files``), found once.
MATRIX_ARGS_KEY = pytest.StashKey[bool]()


def run_context(config: pytest.Config) -> RunContext:
    """This process's ``RunContext``, created on first use."""
    context = config.stash.get(RUN_CONTEXT_KEY, None)
    if context is None:
        from ..cloud.processes import ProcessIdentity
        from ..run.run_context import RunContext

        workerinput = getattr(config, "workerinput", {})
        # A worker's run is owned by its controller: that is the process cleanup checks.
        owner = workerinput.get("gpubench_owner")
        identity = ProcessIdentity.model_validate(owner) if owner else ProcessIdentity.current()
        # Its claims' holder: host:pid of the controller, /gwN for an xdist worker.
        worker = identity.holder(workerinput.get("workerid"))
        context = RunContext(config.stash[SETTINGS_KEY], worker=worker,
                             argv=list(config.invocation_params.args), owner=identity)
        config.stash[RUN_CONTEXT_KEY] = context
    return context
