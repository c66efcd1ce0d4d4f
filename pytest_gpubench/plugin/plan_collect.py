"""The cells ``gpubench plan`` prices: exactly the ones ``pytest`` would run.

Rather than reading matrix files itself, the plan runs pytest's own collection in
this process (``pytest.main([... "--collect-only"], plugins=[reader])``), quietly,
so that paths, ``-k``, ``--gpu`` / ``--provider`` / ``--model``, ini options,
``GPUBENCH_*`` settings, Python tests on matrix cells and matrix errors behave as
in a run. The reader takes each item's cell (with the run's overrides applied, as
the ``gpubench_cell`` fixture does) and manifest key, in run order: after
:func:`~pytest_gpubench.plugin.run_hooks.arrange_reuse_groups` has put each reuse
group together, longest first. Collection touches no network (a sandbox is not
started under ``--collect-only`` either).
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field

import pytest

from ..matrix.cells import apply_overrides
from ..errors import CollectionProblem
from ..matrix.cells import Cell
from ..settings import Settings
from .stash import CELL_KEY, RECORD_KEY, SETTINGS_KEY


@dataclass
class Collected:
    """The run's settings and its cells (manifest key, effective cell) in run order."""

    settings: Settings
    cells: list[tuple[str, Cell]]


@dataclass(eq=False)  # pluggy keeps plugins in sets: hashable by identity
class _Reader:
    """The plugin object handed to ``pytest.main``: keeps what collection found."""

    errors: list[str] = field(default_factory=list)
    result: Collected | None = None

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(_one_line(str(report.longrepr)))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if SETTINGS_KEY not in session.config.stash:  # no cell anywhere: the plugin's run half never loaded
            # The gate by its registered name: importing hooks.py (which imports collection lazily)
            # from here would make an import cycle.
            session.config.pluginmanager.get_plugin("gpubench-gate").activate()
        settings = session.config.stash[SETTINGS_KEY]
        cells = [(item.stash[RECORD_KEY], apply_overrides(item.stash[CELL_KEY], settings))
                 for item in session.items if CELL_KEY in item.stash]
        self.result = Collected(settings, cells)


def collect_cells(paths: list[str], *, keyword: str | None = None, gpus: list[str] | None = None,
                  providers: list[str] | None = None, models: list[str] | None = None,
                  options: list[str] | None = None) -> Collected:
    """The cells ``pytest PATHS -k KEYWORD --gpu ... OPTIONS`` would run, in run order.

    ``options`` are more pytest options (``--gpubench-sandbox``, ...). Raises
    :class:`CollectionProblem` with pytest's own one-line message when collection
    fails; an empty selection is not an error here.
    """
    args = [*paths, "--collect-only", "-q", "-p", "no:cacheprovider"]
    if keyword:
        args += ["-k", keyword]
    for flag, values in (("--gpubench-gpu", gpus), ("--gpubench-provider", providers), ("--gpubench-model", models)):
        for value in values or []:
            args += [flag, value]
    args += options or []
    reader = _Reader()
    out, err = io.StringIO(), io.StringIO()
    # pytest's terminal writer takes sys.stdout when it is configured: it writes here.
    with redirect_stdout(out), redirect_stderr(err):
        code = pytest.main(args, plugins=[reader])
    if reader.errors:
        raise CollectionProblem(reader.errors[0] + (f" (and {len(reader.errors) - 1} more collection error(s))"
                                                    if len(reader.errors) > 1 else ""))
    if reader.result is None or code in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        raise CollectionProblem(_pytest_error(err.getvalue(), out.getvalue()) or f"pytest collection ended {code!r}")
    return reader.result


def _pytest_error(*texts: str) -> str:
    """pytest's ``ERROR: ...`` line (a usage error), else the last line it printed."""
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("ERROR:"):
            return line.removeprefix("ERROR:").strip()
    return lines[-1] if lines else ""


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
