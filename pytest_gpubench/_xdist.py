"""pytest-xdist glue, registered only when xdist is active.

The controller owns the run id and the sandbox; workers learn both through
``workerinput`` so the whole run shares one id and one emulated cloud. When a
worker dies, the controller releases the sessions it left behind.
"""

from __future__ import annotations

from typing import Any

from .processes import ProcessIdentity
from .stash import RESUME_KEY, SETTINGS_KEY


class XdistHooks:
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
