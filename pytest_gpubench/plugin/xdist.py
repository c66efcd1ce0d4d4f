"""pytest-xdist glue through its public hooks, registered only when xdist distributes.

The controller owns the run id and the sandbox; workers learn both through
``workerinput`` so the whole run shares one id and one emulated cloud. Workers
report the reuse groups they decided (:class:`GroupsChannel`) to the controller's
scheduler (:mod:`.internals`, the one adapter to pytest's and xdist's internals). When a
worker dies, the controller releases the sessions it left behind.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ..cloud.processes import ProcessIdentity
from .stash import GROUP_KEY, RESUME_KEY, REUSE_GROUPS_KEY, SETTINGS_KEY

#: The ``workerinput`` key naming the file a worker writes its groups to.
GROUPS_INPUT = "gpubench_groups"


class GroupsChannel:
    """Workers tell the controller which cells share a session, through files.

    xdist passes the controller nothing but node ids from a worker's collection;
    each worker writes ``{nodeid: group}`` of its grouped cells to a JSON file in a
    temporary folder of the controller's before xdist sends that collection, so
    the scheduler finds the groups when the ids arrive. The controller decides
    nothing itself: the groups (split over sessions or not) are the workers'.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gpubench-groups-"))

    def path_for(self, worker: str) -> Path:
        return self.folder / f"{worker}.json"

    def groups_of(self, node: Any) -> dict[str, str]:
        """What the worker ``node`` reported; empty when it reported nothing (no cells)."""
        path = getattr(node, "workerinput", {}).get(GROUPS_INPUT)
        if not path or not Path(path).is_file():
            return {}
        return json.loads(Path(path).read_text())

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class WorkerGroups:
    """On a worker: write the grouped cells of the collection for the controller."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(tryfirst=True)  # before xdist's, which sends the collection to the controller
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        members = session.config.stash.get(REUSE_GROUPS_KEY, {})
        groups = {item.nodeid: item.stash[GROUP_KEY] for item in session.items
                  if item.stash.get(GROUP_KEY, None) is not None and len(members.get(item.stash[GROUP_KEY], ())) > 1}
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(groups))
        partial.replace(self.path)


class XdistHooks:
    def __init__(self) -> None:
        self.groups = GroupsChannel()

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: Any, log: Any) -> Any:
        if config.getvalue("dist") == "loadgroup":
            from .internals import CellGroupScheduling

            return CellGroupScheduling(config, log, groups_of=self.groups.groups_of)
        return None

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        dist = config.getoption("dist", "no")
        if dist in ("no", "loadgroup"):
            return None
        return (f"gpubench: --dist {dist} does not keep a reuse group on one worker: its cells may each rent "
                "a session (--dist loadgroup, the default with -n, keeps them together)")

    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput["gpubench_run_id"] = settings.run_id
        node.workerinput["gpubench_api"] = settings.api
        if settings.sandbox and settings.api_token:  # drawn by this process for its sandbox (sandbox/process.py)
            node.workerinput["gpubench_api_token"] = settings.api_token
        # The controller owns the run: cleanup elsewhere checks that it is alive.
        node.workerinput["gpubench_owner"] = ProcessIdentity.current().model_dump()
        # Workers parse the command line again, without the --dist loadgroup chosen
        # for them (hooks.pytest_cmdline_main): splitting groups needs to know it.
        node.workerinput["gpubench_loadgroup"] = node.config.getoption("dist", None) == "loadgroup"
        node.workerinput[GROUPS_INPUT] = str(self.groups.path_for(node.workerinput["workerid"]))
        plan = node.config.stash.get(RESUME_KEY, None)
        if plan is not None:
            node.workerinput["gpubench_resume"] = plan.model_dump(mode="json")

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker that died (crash, SIGKILL, pytest-timeout's thread method): release its sessions."""
        lifecycle = node.config.pluginmanager.get_plugin("gpubench-lifecycle")
        if error is not None and lifecycle is not None:
            worker = getattr(node, "workerinput", {}).get("workerid") or node.gateway.id
            lifecycle.worker_down(worker, str(error))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.groups.remove()
