"""The one adapter to pytest's and pytest-xdist's private names: nothing else touches one.

Everything else of the plugin uses documented means (hooks, ``stash``, ``workerinput``,
``pytest.TestReport``, ``xdist_group`` marks, ``--dist loadgroup``). Four things have no
public way; each is one named function or class here, and :data:`PRIVATE_NAMES` lists
every private name this module touches:

* :func:`teardown_for`: pytest's ``Session._setupstate.teardown_exact``; missing, the run
  stops with :class:`~pytest_gpubench.errors.InternalsChanged` (no safe fallback).
* :func:`fixture_closure`: pytest's ``Function._fixtureinfo``; missing, each matrix item
  computes its own closure (slower collection, the same items).
* :func:`report_as`: xdist's worker loop, ``WorkerInteractor`` (found by class name), and its
  ``item_index``; missing on a worker, it stops with ``InternalsChanged`` (no safe fallback).
* :class:`CellGroupScheduling` / :func:`count_crashed_as_done`: xdist's scheduler's
  ``assigned_work``; missing, xdist's own rule holds (a crashed cell runs again) and a
  warning says so.

**Versions.** Each name was read in the sources of pytest 8.0.0, 8.4.0, 9.0.0, 9.1.1 and main
(Aug 2026) and of pytest-xdist 3.5.0 to 3.8.0 and main (Aug 2026); pyproject.toml bounds the
dependencies to those lines (``pytest>=8,<10``, ``pytest-xdist>=3.5,<4``).
``tests/plugin/test_internals_contract.py`` drives each function with the installed
versions (pytest 9.0.3 and pytest-xdist 3.8.0 when written) and fails, naming what
changed, when a release moves a name; it also checks that the installed versions sit
inside those bounds. ``tests/unit/test_private_names.py`` fails when a module other than
this one (and ``matrix/prototype.py``, pydantic's adapter) touches one of these names or
imports ``_pytest`` or an ``xdist`` module.

**The xdist scheduler.** ``--dist loadgroup`` learns an item's group from the
``nodeid@group`` suffix xdist's worker writes into the item's node id; from pytest 9.2 on
that write no longer takes (pytest-xdist#1386) and groups are silently spread over
workers. Here the workers' groups come through :class:`~.xdist.GroupsChannel` instead, and
:meth:`CellGroupScheduling.add_node_collection` (a method of xdist's ``Scheduling``
protocol) hands xdist the ids with the suffix its loadgroup scheduler documents. And xdist's
scope schedulers put a crashed worker's whole work unit back in the queue, the item that
crashed included: it is reported crashed and then run again (for a cell: a second session
rented, minutes more, the manifest row overwritten); :func:`count_crashed_as_done` prevents
that.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

from ..errors import InternalsChanged

#: Every private name of pytest or pytest-xdist this module touches, and whose it is.
#: ``tests/unit/test_private_names.py`` keeps them out of every other module.
PRIVATE_NAMES: dict[str, str] = {
    "_setupstate": "pytest: Session._setupstate, the SetupState whose teardown_exact(nextitem) pytest calls",
    "_fixtureinfo": "pytest: Function._fixtureinfo, the item's fixture closure",
    "WorkerInteractor": "pytest-xdist: xdist.remote.WorkerInteractor, the worker's loop (run as __channelexec__)",
    "item_index": "pytest-xdist: WorkerInteractor.item_index, the index its reports are sent under",
    "assigned_work": "pytest-xdist: LoadScopeScheduling.assigned_work, {node: {scope: {nodeid: done}}}",
}

#: The private scheduler attribute :func:`count_crashed_as_done` reads.
ASSIGNED_WORK = "assigned_work"
#: xdist's worker loop, registered unnamed as a plugin on each worker. xdist runs its module
#: through execnet as ``__channelexec__``, so the class is found by its name, not imported.
WORKER_INTERACTOR = "WorkerInteractor"
ITEM_INDEX = "item_index"


# ------------------------------------------------------------------------------ pytest

def teardown_for(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Tear down what ``item``'s predecessors set up that ``nextitem`` does not share, as
    pytest does after each item it runs (``item.session._setupstate.teardown_exact(nextitem)``).

    For an item answered without pytest's protocol (a cell claimed elsewhere): the previous
    item's kept fixtures are still on the stack, and ``SetupState.setup`` of the next item
    asserts that what it does not share is gone. Checked with pytest 8.0 to 9.x (private since
    pytest 7's ``SetupState``). No safe fallback: without it the next item errors in setup, so
    a pytest without the name stops the run with :class:`InternalsChanged`.
    """
    setupstate = getattr(item.session, "_setupstate", None)
    teardown_exact = getattr(setupstate, "teardown_exact", None)
    if teardown_exact is None:
        raise InternalsChanged(f"pytest-gpubench: pytest {pytest.__version__} has no Session._setupstate."
                               "teardown_exact, which answering an item without running it needs; "
                               "use a pytest within the bounds of pytest-gpubench's requirements")
    teardown_exact(nextitem)


def fixture_closure(item: pytest.Function) -> Any:
    """``item``'s fixture closure (``item._fixtureinfo``, a ``FuncFixtureInfo``), to hand to the
    next ``pytest.Function.from_parent(..., fixtureinfo=...)`` of the same function.

    pytest computes a closure per function it collects; a matrix file's items all run one
    function, so computing it once per file saves a closure per cell. Checked with pytest
    8.0 to 9.x. None when the name is missing: each item computes its own (slower to collect,
    the same items).
    """
    return getattr(item, "_fixtureinfo", None)


# ------------------------------------------------------------------------------ pytest-xdist

def report_as(config: pytest.Config, session: pytest.Session, item: pytest.Item) -> None:
    """On an xdist worker: send ``item``'s reports under its own index; elsewhere nothing.

    xdist's worker (``xdist.remote.WorkerInteractor``) tags each report with ``item_index``,
    the index of the item its loop ran last, and asserts that the report is that item's; an
    item run after its loop (a put-aside cell) sets it first. Checked with pytest-xdist 3.5
    to 3.8. No safe fallback: without it xdist's own assertion ends the worker, so a worker
    without the name stops with :class:`InternalsChanged` saying why.
    """
    if not hasattr(config, "workerinput"):
        return
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == WORKER_INTERACTOR and hasattr(plugin, ITEM_INDEX):
            setattr(plugin, ITEM_INDEX, session.items.index(item))
            return
    raise InternalsChanged(f"pytest-gpubench: this pytest-xdist's worker has no {WORKER_INTERACTOR}."
                           f"{ITEM_INDEX}, which running a put-aside cell after the worker's loop needs; "
                           "use a pytest-xdist within the bounds of pytest-gpubench's requirements")


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
    collection (empty when it reported none). Subclasses xdist's ``LoadGroupScheduling``
    (importable from ``xdist.scheduler``) and overrides two methods of its documented
    ``Scheduling`` protocol.
    """

    def __init__(self, config: Any, log: Any = None, *, groups_of: Any = None) -> None:
        super().__init__(config, log)
        self._groups_of = groups_of or (lambda node: {})

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        groups: Mapping[str, str] = self._groups_of(node)
        super().add_node_collection(node, [with_group(nodeid, groups.get(nodeid)) for nodeid in collection])

    def remove_node(self, node: Any) -> str | None:
        crashed = count_crashed_as_done(self, node)
        requeued = super().remove_node(node)
        return crashed or requeued


def count_crashed_as_done(scheduler: Any, node: Any) -> str | None:
    """The item ``node`` was running when it died, now counted as done so that xdist
    requeues only the rest of its unit; None when it ran nothing.

    Reads the scheduler's private ``assigned_work`` (checked with pytest-xdist 3.5 to 3.8).
    Without it (an xdist this was not checked with) xdist's own rule holds, and a warning
    says what that costs.
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
