"""pytest hooks, and nothing else: options, configure, collection, reporting.

This module is what the ``pytest11`` entry point loads in every pytest run of an
environment where pytest-gpubench is installed, so it imports only light modules
(the option table, stash keys, the matrix-file scan). The rest of the plugin
(settings, fixtures, the run's lifecycle, terminal and xdist hooks, and everything
they import) is loaded by :class:`Gate` the first time the run needs it:

* at configure, when the command line names matrix files (or directories holding
  some) or uses a ``--gpubench-*`` option, or when this is an xdist worker of such
  a run;
* else during collection, when a matrix file or a ``gpubench``-marked test turns up;
* else, on an xdist controller, when the first cell's report arrives.

``--help``, ``--version`` and ``--markers`` never load it; the other modes that
only show something (``--collect-only``, ``--fixtures``, ``--setup-plan``) load
what collection needs, and nothing that writes (``matrix_scan.real_run``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .matrix_scan import is_matrix_file, only_shows_options, real_run, runs_matrix_files
from ..options import OPTIONS, new_run_id
from .stash import CELL_KEY, GROUP_KEY, NEXT_GROUP_KEY, REPORTS_KEY, RUN_CONTEXT_KEY, SANDBOX_KEY

FILES_HELP = "glob patterns of matrix files to collect (default: gpubench_*.yaml)"
MARKER = ("gpubench(matrix_file, gpu=None, provider=None, model=None): run this test once per "
          "cell of a matrix file, with the gpubench fixtures")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The hooks users implement (docs/hooks.md)."""
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpubench", "GPU benchmarks (pytest-gpubench)")
    for opt in OPTIONS:
        kwargs: dict[str, Any] = {"dest": f"gpubench_{opt.dest}", "help": opt.argparse_help}
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


class Gate:
    """Loads the plugin's machinery (:func:`plugin_run.start`) once, when the run needs it."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.active = False
        self.session: pytest.Session | None = None
        #: The run id an xdist controller that is not active yet gives its workers, so
        #: that cells found only by them (marked Python tests) still share one run.
        self.run_id: str | None = None

    def needed_at_start(self) -> bool:
        config = self.config
        if only_shows_options(config):
            return False
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:
            return bool(workerinput.get("gpubench_active"))
        given = any(config.getoption(f"gpubench_{opt.dest}") not in (None, False, []) for opt in OPTIONS)
        return given or runs_matrix_files(config) or self._distributes_to_a_sandbox()

    def _distributes_to_a_sandbox(self) -> bool:
        """An xdist controller whose environment or ini asks for the sandbox: it must start it
        before its workers do anything, even if only they find cells (marked Python tests)."""
        if self.config.getoption("dist", "no") == "no" and not self.config.getoption("numprocesses", None):
            return False
        wanted = os.environ.get("GPUBENCH_SANDBOX", "") or self.config.getini("gpubench_sandbox") or ""
        return str(wanted).strip().lower() in {"1", "true", "yes", "on"}

    def activate(self) -> None:
        if self.active:
            return
        self.active = True
        from .run_hooks import start

        start(self.config, self)

    # ------------------------------------------------------------------ hooks

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: workers of an active run load the plugin at once; else they
        load it lazily, as this process does, on one run id."""
        if self.active:
            node.workerinput["gpubench_active"] = True
        else:
            if self.run_id is None:
                self.run_id = os.environ.get("GPUBENCH_RUN_ID") or new_run_id()
            node.workerinput["gpubench_run_id"] = self.run_id

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """xdist controller: a cell's report is the first sign of cells (marked Python tests)."""
        if self.active or report.when != "teardown":
            return
        if any(name == "gpubench_status" for name, _ in report.user_properties):
            self.activate()
            terminal = self.config.pluginmanager.get_plugin("gpubench-terminal")
            if terminal is not None:  # registered just now: this report is the first of its table
                terminal.pytest_runtest_logreport(report)


GATE_KEY = pytest.StashKey[Gate]()


@pytest.hookimpl(wrapper=True)  # around xdist's own, which turns "-n N" alone into --dist load
def pytest_cmdline_main(config: pytest.Config):
    """``-n N`` without a ``--dist`` of the user's, in a run with cells: ``--dist loadgroup``.

    ``--dist load`` would spread a reuse group over workers, each renting its own
    session. Before xdist reads the mode, an unset one is still xdist's default
    ``no``: a mode the user chose (``--dist load`` too) is never changed.
    """
    if (config.getoption("numprocesses", None) and config.getoption("dist", "no") == "no"
            and not config.getoption("distload", False) and Gate(config).needed_at_start()):
        config.option.dist = "loadgroup"
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    gate = config.stash[GATE_KEY] = Gate(config)
    config.pluginmanager.register(gate, "gpubench-gate")
    if gate.needed_at_start():
        gate.activate()


def _gate(config: pytest.Config) -> Gate | None:
    return config.stash.get(GATE_KEY, None)


class MatrixFile(pytest.File):
    """A ``gpubench_*.yaml`` matrix file.

    pytest asks every plugin about every file of a directory it visits, also when
    the command line names one test module there: only a matrix file that is
    collected loads the plugin's machinery (and ``collect.matrix_items`` builds its cells).
    """

    def collect(self) -> Any:
        gate = _gate(self.config)
        if gate is not None:
            gate.activate()
        from .collect import matrix_items

        return matrix_items(self)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MatrixFile | None:
    if is_matrix_file(file_path.name, parent.config.getini("gpubench_files")):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


def _marked(obj: object) -> bool:
    """Whether ``obj`` carries the ``gpubench`` mark. ``pytestmark`` may be one mark or a
    list of them, and a module may hold objects whose attribute access raises."""
    try:
        marks = getattr(obj, "pytestmark", None)
    except Exception:  # noqa: BLE001 - any object may sit in a test module: not ours to judge
        return False
    if not isinstance(marks, (list, tuple)):
        marks = [marks] if marks is not None else []
    return any(getattr(mark, "name", None) == "gpubench" for mark in marks)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    """A ``gpubench``-marked test (or class, or module): load the fixtures before pytest
    computes its fixture closure."""
    gate = _gate(collector.config)
    if gate is None or gate.active:
        return
    owners = [obj, getattr(collector, "obj", None)]
    if isinstance(collector, pytest.Class):
        owners.append(getattr(collector.parent, "obj", None))
    if any(_marked(owner) for owner in owners):
        gate.activate()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("gpubench")
    if marker is None:
        return
    gate = _gate(metafunc.config)
    if gate is not None:
        gate.activate()
    from .collect import cells_for_marker
    from ..errors import MatrixError

    try:
        cells = cells_for_marker(marker, metafunc.definition.path, metafunc.config.rootpath)
    except MatrixError as exc:
        raise pytest.UsageError(str(exc)) from None
    metafunc.parametrize("gpubench_cell", cells, ids=[c.cell_id for c in cells], indirect=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which names loadgroup items after their xdist_group
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    gate = _gate(config)
    if gate is not None and gate.active:
        from .run_hooks import arrange_items

        arrange_items(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Record every cell that will run as ``pending`` (after -k and every other filter)."""
    gate = _gate(session.config)
    if gate is not None and gate.active and real_run(session.config):
        from .run_hooks import record_pending

        record_pending(session)


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
            from .fixtures import write_error_now  # the ERROR line before pytest writes the cell's letter

            write_error_now(item)
        if call.when == "setup" and error is not None:
            from .collect import describe_failure

            text = describe_failure(error, item)
            if text is not None:
                report.longrepr = text
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """A cell another controller of the run holds or ran: its own category, "3 passed, 2 claimed"
    (``plugin.claims``; the name is spelled here so that this light module imports nothing)."""
    if any(name == "gpubench_claimed_by" for name, _ in getattr(report, "user_properties", ()) or ()):
        return ("claimed", "c", "CLAIMED") if report.when == "setup" else ("", "", "")
    return None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The filters selected nothing: say which values exist (also under ``--collect-only``)."""
    gate = _gate(config)
    if (gate is None or not gate.active or exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED
            or hasattr(config, "workerinput")):
        return
    from .matrix_scan import filter_hint_lines

    for line in filter_hint_lines(config):
        terminalreporter.write_line(f"gpubench: {line}", yellow=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    context = config.stash.get(RUN_CONTEXT_KEY, None)
    if context is not None:
        context.close()
    sandbox = config.stash.get(SANDBOX_KEY, None)
    if sandbox is not None:
        sandbox.stop()
