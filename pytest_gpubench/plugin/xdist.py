"""pytest-xdist glue, registered only when xdist is active.

The controller owns the run id and the sandbox; workers learn both through
``workerinput`` so the whole run shares one id and one emulated cloud. When a
worker dies, the controller releases the sessions it left behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

from ..matrix.overrides import apply_overrides
from ..matrix.cells import Cell, load_cells
from ..cloud.processes import ProcessIdentity
from ..cloud.reuse_split import SplitPolicy, split_groups
from .stash import RESUME_KEY, SETTINGS_KEY


class MatrixGroups:
    """The reuse group of a matrix item, from its node id (``path::cell_id``), for the controller,
    which collects nothing itself.

    Once the workers' collection is known (:meth:`split_for`), a group the workers
    split over more sessions (:mod:`.reuse_split`) is split here the same way: the
    decision depends only on the selected cells, the worker count and the settings.
    """

    def __init__(self, config: Any) -> None:
        self.root = Path(config.rootpath)
        self.settings = config.stash[SETTINGS_KEY]
        self._files: dict[str, dict[str, Cell]] = {}
        self._split: dict[str, str | None] = {}

    def cell_of(self, nodeid: str) -> Cell | None:
        """The cell (run overrides applied) a matrix item's node id names; None for other items."""
        path, _, name = nodeid.partition("::")
        if not name or not path.endswith((".yaml", ".yml")):
            return None
        if path not in self._files:
            try:
                cells = load_cells(self.root / path)
            except Exception:  # noqa: BLE001 - the workers report a bad file; here it is just not grouped
                cells = []
            self._files[path] = {cell.cell_id: apply_overrides(cell, self.settings) for cell in cells}
        # Before pytest 9.2 a grouped item's id carries its group: ``cell_id@group``.
        return self._files[path].get(name.split("@", 1)[0])

    def split_for(self, nodeids: list[str], workers: int) -> None:
        """Split groups as the ``workers`` workers do for this collection."""
        cells = [self.cell_of(nodeid) for nodeid in nodeids]
        split, _ = split_groups(cells, SplitPolicy.from_settings(self.settings, workers))
        self._split = {nodeid: cell.session_group for nodeid, cell in zip(nodeids, split, strict=True)
                       if cell is not None}

    def group_of(self, nodeid: str) -> str | None:
        if nodeid in self._split:
            group = self._split[nodeid]
        else:
            cell = self.cell_of(nodeid)
            group = cell.session_group if cell is not None else None
        return f"reuse:{group}" if group else None


class CellGroupScheduling(LoadGroupScheduling):
    """``--dist loadgroup`` that never runs a crashed cell twice.

    xdist's scope schedulers put a crashed worker's whole work unit back in the
    queue, the item that crashed included: it is reported as crashed and then run
    again (for a cell: a second session rented, minutes more, the manifest row
    overwritten). Here the crashed item counts as done before the rest of its unit
    (its reuse group's later cells) goes back to the queue.
    """

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._groups = MatrixGroups(config)

    def _split_scope(self, nodeid: str) -> str:
        # xdist names a grouped item `nodeid@group` on the worker, but from pytest 9.2
        # on that renaming no longer takes (nodes keep their id in `_id`): the group is
        # then found from the matrix file and the cell id, as the workers found it.
        if "@" not in nodeid.rsplit("::", 1)[-1]:
            group = self._groups.group_of(nodeid)
            if group is not None:
                return group
        return super()._split_scope(nodeid)

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self.registered_collections:
            collection = list(next(iter(self.registered_collections.values())))
            self._groups.split_for(collection, self.numnodes)
        super().schedule()

    def remove_node(self, node: Any) -> str | None:
        crashed = None
        for unit in self.assigned_work.get(node, {}).values():
            crashed = next((nodeid for nodeid, done in unit.items() if not done), None)
            if crashed is not None:
                unit[crashed] = True
                break
        super().remove_node(node)
        return crashed


class XdistHooks:
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: Any, log: Any) -> Any:
        if config.getvalue("dist") == "loadgroup":
            return CellGroupScheduling(config, log)
        return None

    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput["gpubench_run_id"] = settings.run_id
        node.workerinput["gpubench_api"] = settings.api
        # The controller owns the run: cleanup elsewhere checks that it is alive.
        node.workerinput["gpubench_owner"] = ProcessIdentity.current().model_dump()
        # Workers parse the command line again, so a --dist loadgroup chosen for them
        # (reuse_order.prefer_loadgroup) must be passed on.
        node.workerinput["gpubench_loadgroup"] = node.config.getoption("dist", None) == "loadgroup"
        plan = node.config.stash.get(RESUME_KEY, None)
        if plan is not None:
            node.workerinput["gpubench_resume"] = plan.model_dump(mode="json")

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker that died (crash, SIGKILL, pytest-timeout's thread method): release its sessions."""
        lifecycle = node.config.pluginmanager.get_plugin("gpubench-lifecycle")
        if error is not None and lifecycle is not None:
            worker = getattr(node, "workerinput", {}).get("workerid") or node.gateway.id
            lifecycle.worker_down(worker, str(error))
