"""pytest hooks, and nothing else: options, configure, collection, reporting.

The logic lives in plain modules; each hook here hands over to one of them.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from pathlib import Path

import pytest

from . import fixtures
from .collect import MatrixFile, cells_for_marker, describe_failure
from .errors import MatrixError, UsageProblem
from .lifecycle import RunLifecycle
from .matrix import Cell, cell_selected
from .outcome import write_error_now
from .resume import ResumePlan, plan_resume, still_to_run
from .reuse_order import arrange_reuse_groups, prefer_loadgroup
from .sandbox_process import SandboxProcess
from .settings import OPTIONS, Settings, resolve
from .stash import (
    CELL_KEY,
    GROUP_KEY,
    NEXT_GROUP_KEY,
    RECORD_KEY,
    REPORTS_KEY,
    RESUME_KEY,
    RUN_CONTEXT_KEY,
    SANDBOX_KEY,
    SETTINGS_KEY,
    run_context,
)
from .terminal import TerminalHooks

FILES_HELP = "glob patterns of matrix files to collect (default: gpubench_*.yaml)"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpubench", "GPU benchmarks (pytest-gpubench)")
    for opt in OPTIONS:
        kwargs = {"dest": f"gpubench_{opt.dest}", "help": opt.help}
        if opt.action == "store_true":
            kwargs.update(action="store_true", default=None)
        else:
            kwargs.update(action=opt.action, default=None, metavar=opt.metavar)
            if opt.const is not None:
                kwargs.update(nargs="?", const=opt.const)
        group.addoption(opt.flag, **kwargs)
        if opt.ini:
            parser.addini(f"gpubench_{opt.dest}", opt.help, default=None)
    parser.addini("gpubench_files", FILES_HELP, type="args", default=["gpubench_*.yaml"])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpubench(matrix_file, gpu=None, provider=None, model=None): run this test once per "
        "cell of a matrix file, with the gpubench fixtures",
    )
    settings = _settings(config)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # The controller chose the run id and owns the sandbox: share them.
        settings = settings.model_copy(update={
            "run_id": workerinput["gpubench_run_id"], "api": workerinput["gpubench_api"],
        })
        if workerinput.get("gpubench_loadgroup"):
            config.option.loadgroup = True  # xdist then names grouped items after their group
        if workerinput.get("gpubench_resume"):
            config.stash[RESUME_KEY] = ResumePlan.model_validate(workerinput["gpubench_resume"])
    else:
        if settings.resume:
            settings = _resumed(config, settings)
        if settings.sandbox and not config.option.collectonly:
            sandbox = SandboxProcess.start(settings)
            config.stash[SANDBOX_KEY] = sandbox
            settings = settings.model_copy(update={"api": sandbox.url})
    config.stash[SETTINGS_KEY] = settings
    config.pluginmanager.register(fixtures, "gpubench-fixtures")
    # Before the terminal hooks: theirs run first, so the API is checked before start-up cleanup.
    config.pluginmanager.register(RunLifecycle(config), "gpubench-lifecycle")
    if workerinput is None:
        config.pluginmanager.register(TerminalHooks(config), "gpubench-terminal")
    if config.pluginmanager.hasplugin("xdist"):
        from ._xdist import XdistHooks

        config.pluginmanager.register(XdistHooks(), "gpubench-xdist")
        if workerinput is None:
            prefer_loadgroup(config)


def _resumed(config: pytest.Config, settings: Settings) -> Settings:
    """``--gpubench-resume``: record into that run; remember the cells it already finished."""
    try:
        plan = plan_resume(settings.manifest, settings.resume or "last")
    except UsageProblem as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[RESUME_KEY] = plan
    return settings.model_copy(update={"run_id": plan.run_id})


def _settings(config: pytest.Config) -> Settings:
    cli = {opt.dest: config.getoption(f"gpubench_{opt.dest}") for opt in OPTIONS}

    def ini(name: str) -> object:
        try:
            return config.getini(name)
        except ValueError:
            return None

    try:
        return resolve(cli, os.environ, ini)
    except UsageProblem as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MatrixFile | None:
    patterns = parent.config.getini("gpubench_files")
    if file_path.suffix in (".yaml", ".yml") and any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("gpubench")
    if marker is None:
        return
    try:
        cells = cells_for_marker(marker, metafunc.definition.path, metafunc.config.rootpath)
    except MatrixError as exc:
        raise pytest.UsageError(str(exc)) from None
    metafunc.parametrize("gpubench_cell", cells, ids=[c.cell_id for c in cells], indirect=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which names loadgroup items after their xdist_group
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    settings = config.stash[SETTINGS_KEY]
    selected, deselected = [], []
    for item in items:
        cell = _cell_of(item)
        if cell is None:
            selected.append(item)
            continue
        if cell_selected(cell, list(settings.gpu), list(settings.provider), list(settings.model)):
            selected.append(item)
        else:
            deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    _disambiguate_record_keys(items)
    plan = config.stash.get(RESUME_KEY, None)
    if plan is not None:  # --gpubench-resume: only the resumed run's cells that did not succeed run
        runs = still_to_run([item.stash.get(RECORD_KEY, None) for item in items], plan)
        if not all(runs):
            config.hook.pytest_deselected(items=[item for item, run in zip(items, runs, strict=True) if not run])
            items[:] = [item for item, run in zip(items, runs, strict=True) if run]
    arrange_reuse_groups(config, items)


def _disambiguate_record_keys(items: list[pytest.Item]) -> None:
    """Two matrix files may hold the same cell: their manifest rows must not merge.

    A key used by more than one item gets its matrix file's name appended
    (``RTX_4090-vastai-qwen2:7b@gpubench_quick``); unique keys stay plain.
    """
    keyed = [item for item in items if RECORD_KEY in item.stash]
    counts = Counter(item.stash[RECORD_KEY] for item in keyed)
    for item in keyed:
        key = item.stash[RECORD_KEY]
        if counts[key] > 1:
            item.stash[RECORD_KEY] = f"{key}@{Path(item.stash[CELL_KEY].source).stem}"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Record every cell that will run as ``pending`` (after -k and every other filter)."""
    config = session.config
    cells = [(item.stash[RECORD_KEY], item.stash[CELL_KEY]) for item in session.items if CELL_KEY in item.stash]
    if cells and not config.option.collectonly:
        context = run_context(config)
        for key, cell in cells:
            context.manifest.add_cell(context.run_id, key, gpu_type=cell.gpu, provider=cell.provider,
                                      model=cell.model, matrix_file=cell.source)


def _cell_of(item: pytest.Item) -> Cell | None:
    cell = item.stash.get(CELL_KEY, None)
    if cell is None:
        callspec = getattr(item, "callspec", None)
        cell = callspec.params.get("gpubench_cell") if callspec is not None else None
        if isinstance(cell, Cell):
            item.stash[CELL_KEY] = cell
            item.stash[RECORD_KEY] = f"{cell.cell_id}@{getattr(item, 'originalname', item.name)}"
    return cell if isinstance(cell, Cell) else None


@pytest.hookimpl(tryfirst=True)  # before the fixtures' teardown: a kept session needs to know
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if CELL_KEY in item.stash:
        item.stash[NEXT_GROUP_KEY] = nextitem.stash.get(GROUP_KEY, None) if nextitem is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if CELL_KEY in item.stash:
        error = call.excinfo.value if call.excinfo is not None else None
        item.stash.setdefault(REPORTS_KEY, {})[call.when] = (report, error)
        if report.failed and call.when != "teardown":
            write_error_now(item)
        if call.when == "setup" and error is not None:
            text = describe_failure(error, item)
            if text is not None:
                report.longrepr = text
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    context = config.stash.get(RUN_CONTEXT_KEY, None)
    if context is not None:
        context.close()
    sandbox = config.stash.get(SANDBOX_KEY, None)
    if sandbox is not None:
        sandbox.stop()
