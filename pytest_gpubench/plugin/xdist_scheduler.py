"""The one place that leans on pytest-xdist beyond its public hooks: the scheduler.

Everything else of the xdist glue (:mod:`.xdist`) uses documented means: the
``pytest_xdist_make_scheduler``, ``pytest_configure_node`` and ``pytest_testnodedown``
hooks, ``workerinput``, ``xdist_group`` marks and ``--dist loadgroup``. Two things
have no public way:

* **Groups the controller can see.** ``--dist loadgroup`` learns an item's group
  from the ``nodeid@group`` suffix xdist's worker writes into the item's node id;
  from pytest 9.2 on that write no longer takes (pytest-xdist#1386) and groups are
  silently spread over workers. Here the workers' groups come through
  :class:`~.xdist.GroupsChannel` instead, and :meth:`CellGroupScheduling.add_node_collection`
  (a method of xdist's ``Scheduling`` protocol) hands xdist the ids with the suffix
  its loadgroup scheduler documents. No worker-side renaming is needed.
* **A crashed cell runs once.** xdist's scope schedulers put a crashed worker's
  whole work unit back in the queue, the item that crashed included: it is
  reported crashed and then run again (for a cell: a second session rented,
  minutes more, the manifest row overwritten). :func:`_count_crashed_as_done`
  reads the scheduler's ``assigned_work`` for that: the only private name used.

``tests/plugin/test_xdist_contract.py`` drives this class through the ``Scheduling``
protocol with the installed xdist and fails, naming what changed, when either
behaviour breaks; pyproject.toml bounds the xdist versions it was checked with.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from xdist.scheduler import LoadGroupScheduling

#: The private scheduler attribute :func:`_count_crashed_as_done` reads:
#: ``{node: {scope: {nodeid: completed}}}``.
ASSIGNED_WORK = "assigned_work"


def with_group(nodeid: str, group: str | None) -> str:
    """``nodeid@group``, the form xdist's loadgroup scheduler groups by.

    An id that already carries a suffix (xdist renamed it on a pytest that lets it,
    joining every ``xdist_group`` of the item) is left as xdist made it.
    """
    if not group:
        return nodeid
    name = nodeid.rsplit("::", 1)[-1]
    if name.rfind("@") > name.rfind("]"):
        return nodeid
    return f"{nodeid}@{group}"


class CellGroupScheduling(LoadGroupScheduling):
    """``--dist loadgroup`` on the groups the workers decided, that never runs a crashed cell twice.

    ``groups_of(node)`` returns the ``{nodeid: group}`` a worker reported for its
    collection (empty when it reported none).
    """

    def __init__(self, config: Any, log: Any = None, *, groups_of: Any = None) -> None:
        super().__init__(config, log)
        self._groups_of = groups_of or (lambda node: {})

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        groups: Mapping[str, str] = self._groups_of(node)
        super().add_node_collection(node, [with_group(nodeid, groups.get(nodeid)) for nodeid in collection])

    def remove_node(self, node: Any) -> str | None:
        crashed = _count_crashed_as_done(self, node)
        requeued = super().remove_node(node)
        return crashed or requeued


def _count_crashed_as_done(scheduler: Any, node: Any) -> str | None:
    """The item ``node`` was running when it died, now counted as done so that xdist
    requeues only the rest of its unit; None when it ran nothing.

    Without ``assigned_work`` (an xdist this was not checked with) xdist's own rule
    holds, and a warning says what that costs.
    """
    assigned = getattr(scheduler, ASSIGNED_WORK, None)
    if not isinstance(assigned, dict):
        warnings.warn(f"pytest-gpubench: this pytest-xdist's scheduler has no {ASSIGNED_WORK}: a cell whose "
                      "worker crashed will run again on another worker", RuntimeWarning, stacklevel=2)
        return None
    for unit in assigned.get(node, {}).values():
        crashed = next((nodeid for nodeid, done in unit.items() if not done), None)
        if crashed is not None:
            unit[crashed] = True
            return crashed
    return None
