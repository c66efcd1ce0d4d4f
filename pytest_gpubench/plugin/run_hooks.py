"""What a run with matrix cells loads: settings, fixtures, lifecycle, terminal and xdist hooks.

:func:`start` is called by ``plugin.Gate`` once the run turns out to have cells
(or uses a ``--gpubench-*`` option); :func:`arrange_items` and :func:`record_pending`
are the heavy halves of the plugin's collection hooks; :func:`arrange_reuse_groups` (run
order and xdist groups for session reuse) is the half of :func:`arrange_items` that orders cells.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..errors import UsageProblem
from ..matrix.selection import CellFilters, split_by_filters
from ..matrix.cells import Cell, apply_overrides
from ..cloud.reuse_split import SplitPolicy, order_for_reuse, split_groups
from .matrix_scan import real_run
from ..settings import OPTIONS, GpubenchDeprecationWarning, Settings, resolve
from ..store.records import distinct_keys, marked_test_key
from .stash import (CELL_FILTERS_KEY, CELL_KEY, GROUP_KEY, RECORD_KEY, RESUME_KEY, REUSE_GROUPS_KEY, SANDBOX_KEY,
                    SETTINGS_KEY, run_context)

# The fixtures, the lifecycle, the terminal and xdist hooks and resume import what a
# real run needs (SSH, HTTP, the manifest); they are imported where used, so that
# --collect-only of a matrix does not load them.


def start(config: pytest.Config, gate: Any) -> None:
    """Resolve the settings and register the plugins a run with cells needs.

    In the modes that only show something (``matrix_scan.real_run``) that is the
    fixtures alone (none at all for ``--collect-only``): no sandbox, no lifecycle (it cleans up and records the run's
    end), no terminal hooks (they check the API and write the run's end).
    """
    settings = _settings(config)
    workerinput = getattr(config, "workerinput", None)
    shows_only = not real_run(config)
    if workerinput is not None:
        # The controller chose the run id (and owns the sandbox, when it is active): share them.
        update = {"run_id": workerinput["gpubench_run_id"]} if workerinput.get("gpubench_run_id") else {}
        if workerinput.get("gpubench_api"):
            update["api"] = workerinput["gpubench_api"]
        if workerinput.get("gpubench_api_token"):  # the sandbox's token: in no environment
            update["api_token"] = workerinput["gpubench_api_token"]
        settings = settings.model_copy(update=update)
        if workerinput.get("gpubench_groups"):  # the controller's scheduler learns the groups from this worker
            from .xdist import GROUPS_INPUT, WorkerGroups

            config.pluginmanager.register(WorkerGroups(Path(workerinput[GROUPS_INPUT])), "gpubench-xdist-groups")
        if workerinput.get("gpubench_resume"):
            from ..store.opening import ResumePlan

            config.stash[RESUME_KEY] = ResumePlan.model_validate(workerinput["gpubench_resume"])
    if settings.runners or settings.phase or settings.runner:  # a phase of a runners file (phases.py)
        from .phases import start_phase

        settings = start_phase(config, settings, controller=workerinput is None,
                               run_id_fixed=workerinput is not None or gate.run_id is not None)
    if workerinput is None:
        if gate.run_id is not None:  # this controller's workers already run under this id
            settings = settings.model_copy(update={"run_id": gate.run_id})
        if not shows_only and not config.option.collectonly:
            _check_store(settings)  # before a sandbox starts or anything is written
        if settings.resume:
            settings = _resumed(config, settings)
        if settings.sandbox and not shows_only:
            from ..sandbox.process import SandboxProcess

            sandbox = SandboxProcess.start(settings)
            config.stash[SANDBOX_KEY] = sandbox
            settings = settings.model_copy(update={"api": sandbox.url, "api_token": sandbox.token})
    config.stash[SETTINGS_KEY] = settings
    config.stash[CELL_FILTERS_KEY] = CellFilters.of(settings)
    if config.option.collectonly:
        return  # nothing runs and no fixture is shown: the fixtures' imports can wait for a run
    from . import fixtures
    from .lifecycle import RunLifecycle
    from .terminal import TerminalHooks

    config.pluginmanager.register(fixtures, "gpubench-fixtures")
    if shows_only:
        return
    # Before the terminal hooks: theirs run first, so the API is checked before start-up cleanup.
    config.pluginmanager.register(RunLifecycle(config), "gpubench-lifecycle")
    from .claims import ClaimHooks

    config.pluginmanager.register(ClaimHooks(config), "gpubench-claims")
    if workerinput is None:
        terminal = TerminalHooks(config)
        config.pluginmanager.register(terminal, "gpubench-terminal")
        if gate.session is not None:  # found during collection: the session has started without it
            terminal.pytest_sessionstart(gate.session)
            phases = config.pluginmanager.get_plugin("gpubench-phases")
            if phases is not None:
                phases.register()
        if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no":
            from .xdist import XdistHooks

            config.pluginmanager.register(XdistHooks(), "gpubench-xdist")


def _resumed(config: pytest.Config, settings: Settings) -> Settings:
    """``--gpubench-resume``: record into that run; remember the cells it already finished."""
    from ..store.opening import plan_resume
    from ..store.opening import LAST

    try:
        plan = plan_resume(settings.store_location, settings.resume or LAST)
    except UsageProblem as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[RESUME_KEY] = plan
    return settings.model_copy(update={"run_id": plan.run_id})


def _check_store(settings: Settings) -> None:
    """A store location that cannot be opened (a URL) is a usage error before anything runs."""
    from ..store.opening import store_exists

    try:
        store_exists(settings.store_location)
    except UsageProblem as exc:
        raise pytest.UsageError(str(exc)) from None


def _settings(config: pytest.Config) -> Settings:
    cli = {opt.dest: config.getoption(f"gpubench_{opt.dest}") for opt in OPTIONS}

    def ini(name: str) -> object:
        try:
            return config.getini(name)
        except ValueError:
            return None

    def warn(note: str) -> None:
        # Once, from the controller (or the only process): an xdist worker resolves the same options.
        if getattr(config, "workerinput", None) is None:
            config.issue_config_time_warning(GpubenchDeprecationWarning(note), stacklevel=2)

    try:
        return resolve(cli, os.environ, ini, warn=warn)
    except UsageProblem as exc:
        raise pytest.UsageError(str(exc)) from None


def arrange_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Filter, name and order the cells among ``items`` (``pytest_collection_modifyitems``).

    Matrix files applied ``--gpubench-gpu/provider/model`` as they collected (the
    cells they kept out are ``FilteredCell`` placeholders, deselected here); Python
    tests on cells are filtered here, by the same :func:`filters.split_by_filters`.
    """
    from .collect import FilteredCell

    filters = config.stash[CELL_FILTERS_KEY]
    selected: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    marked: list[pytest.Item] = []
    for item in items:
        if isinstance(item, FilteredCell):
            deselected.append(item)
        elif CELL_KEY not in item.stash and _cell_of(item) is not None:
            marked.append(item)
            selected.append(item)
        else:
            selected.append(item)
    if marked:
        _, dropped = split_by_filters([item.stash[CELL_KEY] for item in marked], filters)
        if dropped:
            out = {id(cell) for cell in dropped}
            gone = {id(item) for item in marked if id(item.stash[CELL_KEY]) in out}
            deselected += [item for item in marked if id(item) in gone]
            selected = [item for item in selected if id(item) not in gone]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    _disambiguate_record_keys(items)
    plan = config.stash.get(RESUME_KEY, None)
    if plan is not None:  # --gpubench-resume: cells that already succeeded do not run again
        from ..store.opening import still_to_run

        runs = still_to_run([item.stash.get(RECORD_KEY, None) for item in items], plan)
        if not all(runs):
            config.hook.pytest_deselected(items=[item for item, run in zip(items, runs, strict=True) if not run])
            items[:] = [item for item, run in zip(items, runs, strict=True) if run]
    arrange_reuse_groups(config, items)
    if config.option.collectonly and config.option.verbose >= 0:
        _group_by_file(items)


def _group_by_file(items: list[pytest.Item]) -> None:
    """``--collect-only``'s tree: each matrix file once, its cells in run order.

    Reuse groups span files (one session serves a GPU's cells from every file), so
    the run order interleaves files, and pytest's tree would repeat a file each time
    it comes back. The listing keeps the run order within a file.
    """
    first: dict[Any, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.parent, index)
    items.sort(key=lambda item: first[item.parent])  # stable: run order within each file


def _disambiguate_record_keys(items: list[pytest.Item]) -> None:
    """Two matrix files may hold the same cell: their manifest rows must not merge
    (:func:`~..store.records.distinct_keys`)."""
    keyed = [item for item in items if RECORD_KEY in item.stash]
    keys = distinct_keys([item.stash[RECORD_KEY] for item in keyed],
                         [item.stash[CELL_KEY].source for item in keyed])
    for item, key in zip(keyed, keys, strict=True):
        item.stash[RECORD_KEY] = key


def record_pending(session: pytest.Session) -> None:
    """Record every cell that will run as ``pending`` (a real run only: see ``plugin``)."""
    cells = [(item.stash[RECORD_KEY], item.stash[CELL_KEY]) for item in session.items if CELL_KEY in item.stash]
    if cells:
        context = run_context(session.config)
        for key, cell in cells:
            context.store.add_cell(context.run_id, key, gpu_type=cell.gpu, provider=cell.provider,
                                   model=cell.model, matrix_file=cell.source)


def _cell_of(item: pytest.Item) -> Cell | None:
    """The cell of a Python test parametrized by the ``gpubench`` marker (stashed on first look)."""
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("gpubench_cell") if callspec is not None else None
    if isinstance(cell, Cell):
        item.stash[CELL_KEY] = cell
        item.stash[RECORD_KEY] = marked_test_key(cell.cell_id, getattr(item, "originalname", item.name))
        return cell
    return None


# --------------------------------------------------------------------------------------------------
# Collection-time side of session reuse: run order and xdist groups.
#
# Kept out of ``hooks.py`` so the hooks stay thin; the rules themselves (which cells
# share, which group is longest) are in :mod:`pytest_gpubench.run.session_pool`.


def arrange_reuse_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each reuse group's cells together, longest group first, and mark them.

    Under ``pytest -n N`` with idle workers, a group may first be split over more
    sessions (:mod:`.reuse_split`): each sub-group is a group here.

    Only the positions matrix cells hold are reordered (other tests stay where
    they are). Each grouped cell gets ``xdist_group(<group>)`` so that
    ``--dist loadgroup`` keeps its group on one worker, and the groups' members go
    to ``config.stash`` for the session pool, which sizes a session for them.
    """
    settings = config.stash[SETTINGS_KEY]
    slots = [i for i, item in enumerate(items) if CELL_KEY in item.stash]
    cells = [apply_overrides(items[i].stash[CELL_KEY], settings) for i in slots]
    # Under -n, a group may be split over more sessions so that idle workers share it
    # (reuse_split.py); the controller's scheduler decides the same from the same cells.
    split, _ = split_groups(cells, SplitPolicy.from_settings(settings, loadgroup_workers(config)))
    for i, (before, after) in enumerate(zip(cells, split, strict=True)):
        if after is not None and after.session_part != before.session_part:
            stash = items[slots[i]].stash
            stash[CELL_KEY] = stash[CELL_KEY].model_copy(update={"session_part": after.session_part})
            cells[i] = after
    order = order_for_reuse(cells, settings.runs)
    arranged = [items[slots[i]] for i in order]
    members: dict[str, list] = {}
    for slot, item, cell in zip(slots, arranged, [cells[i] for i in order], strict=True):
        items[slot] = item
        group = cell.session_group
        item.stash[GROUP_KEY] = group
        if group is not None:
            members.setdefault(group, []).append((item.stash[RECORD_KEY], cell))
    marks: dict[str, pytest.MarkDecorator] = {}  # one per group: 10,000 cells need not build 10,000 marks
    for item in arranged:
        group = item.stash[GROUP_KEY]
        if group is not None and len(members[group]) > 1:
            if group not in marks:
                marks[group] = pytest.mark.xdist_group(group)
            item.add_marker(marks[group])
    config.stash[REUSE_GROUPS_KEY] = members


def loadgroup_workers(config: pytest.Config) -> int:
    """The xdist workers sharing this run's groups: ``-n N`` on a worker under
    ``--dist loadgroup``, else 1 (no xdist, or another mode that does not keep groups)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or not workerinput.get("gpubench_loadgroup"):
        return 1
    return int(workerinput.get("workercount") or 1)
