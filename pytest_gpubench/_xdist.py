"""pytest-xdist glue, registered only when xdist is active.

The controller owns the run id and the sandbox; workers learn both through
``workerinput`` so the whole run shares one id and one emulated cloud.
"""

from __future__ import annotations

from typing import Any

from .stash import SETTINGS_KEY


class XdistHooks:
    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput["gpubench_run_id"] = settings.run_id
        node.workerinput["gpubench_api"] = settings.api
