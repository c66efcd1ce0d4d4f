"""Matrix files become test items: one ``BenchFunction`` per GPU x provider x model cell.

Loaded once a run meets a matrix file (or a ``gpubench``-marked test), not at plugin load.
``gpubench plan`` collects through it too (:func:`collect_cells`: pytest's own collection,
in this process, keeping each item's cell).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..errors import CollectionProblem, GpubenchError, MatrixError, StageError
from ..errors import one_line
from ..matrix.selection import CellFilters, split_by_filters
from ..run.hints import UnknownGpuWarning, check_gpu_names
from ..matrix.cells import Cell, apply_overrides, load_cells
from ..cloud.registry import check_clouds
from .internals import fixture_closure
from .phases import PHASE_KEY
from ..settings import Settings
from .stash import CELL_FILTERS_KEY, CELL_KEY, RECORD_KEY, RECORDER_KEY, SETTINGS_KEY
from ..store.record_keys import matrix_key


def run_matrix_cell(request: pytest.FixtureRequest) -> None:
    """Run one matrix cell: every stage up to the benchmark, then the benchmark.

    Fixtures are requested here, in the test body, so a failing stage fails the
    test (rather than erroring its setup) and teardown still releases everything.
    A ``microbench:`` cell measures the GPU itself instead (no runtime, no model).
    """
    cell = request.node.stash.get(CELL_KEY, None)
    request.getfixturevalue("gpubench_microbench" if cell is not None and cell.microbench else "gpubench").run()


def matrix_items(matrix_file: pytest.File) -> Iterator[pytest.Item]:
    """The items of a matrix file (``plugin.MatrixFile.collect``): one per cell the filters keep,
    a :class:`FilteredCell` placeholder per cell they keep out."""
    try:
        cells = load_cells(matrix_file.path)
        check_clouds(cells)
    except MatrixError as exc:
        raise matrix_file.CollectError(str(exc)) from None
    typos, unknown = check_gpu_names(cells)  # a swapped-letters typo stops; a GPU we do not know warns
    if typos:
        raise matrix_file.CollectError("\n".join(f"{cell.source}: {text}" for cell, text in typos))
    for cell, text in unknown:  # shown as the matrix file's warning, not this module's
        warnings.warn_explicit(UnknownGpuWarning(text), UnknownGpuWarning, cell.source, 0)
    filters: CellFilters | None = matrix_file.config.stash.get(CELL_FILTERS_KEY, None)
    dropped: list[Cell] = []
    if filters is not None:  # --gpubench-gpu/provider/model: only the cells kept become real items
        cells, dropped = split_by_filters(cells, filters)
    runs = [(cell.cell_id, matrix_key(cell.cell_id), cell) for cell in cells]
    phase = matrix_file.config.stash.get(PHASE_KEY, None)
    if phase is not None:  # --gpubench-runners: the phase's cells this runner takes, once per rerun
        taken, left = phase.items_of(cells)
        runs = [(run.test_id, run.key, run.cell) for run in taken]
        dropped += left
    fixtureinfo = None
    for name, key, cell in runs:
        # Every cell runs the same function: its fixture closure is computed once per file.
        item = BenchFunction.from_parent(matrix_file, name=name, callobj=run_matrix_cell,
                                         fixtureinfo=fixtureinfo)
        fixtureinfo = fixture_closure(item)
        item.stash[CELL_KEY] = cell
        item.stash[RECORD_KEY] = key
        item.extra_keyword_matches.update(cell.keywords)
        yield item
    for cell in dropped:
        yield FilteredCell.from_parent(matrix_file, name=cell.cell_id)


class BenchFunction(pytest.Function):
    """One cell of a matrix file; its failures read as stage and message."""

    def reportinfo(self) -> tuple[Path, int, str]:
        # pytest needs a line number (skip locations use it); the file is YAML.
        cell = self.stash[CELL_KEY]
        return self.path, 0, f"{cell.gpu} | {cell.provider} | {cell.model}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        text = describe_failure(excinfo.value, self)
        # pytest's Function.repr_failure takes no style (a pytest-timeout failure lands here).
        return text if text is not None else super().repr_failure(excinfo)


class FilteredCell(pytest.Item):
    """A cell the ``--gpubench-gpu/provider/model`` filters keep out, as a light placeholder.

    pytest counts the items a file collects ("collected N items / M deselected"), so
    the cells a filter drops still appear, as these cheap nodes, and are deselected at
    once (``pytest_collection_modifyitems``, before any other plugin sees them): the
    counts read as with ``-k``, and no fixture closure or keyword set is built for them.
    """

    def runtest(self) -> None:  # pragma: no cover - deselected before any run
        raise RuntimeError(f"{self.nodeid} was filtered out and must not run")

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


def describe_failure(error: BaseException, item: pytest.Item) -> str | None:
    """Stage, one-paragraph message and where to read more; None for other errors.

    An error without a stage of its own (a bridge timeout) is told at the stage the
    cell was in, as the manifest records it.
    """
    if not isinstance(error, GpubenchError):
        return None
    lines = []
    recorder = item.stash.get(RECORDER_KEY, None)
    # Whatever the error quotes (instance output, an API's answer) reaches the terminal and JUnit
    # as one line with no escape sequence: the progress files' rule.
    text = one_line(str(error))
    if isinstance(error, StageError):
        lines.append(f"[{error.stage}] {text}")
    elif recorder is not None:
        lines.append(f"[{recorder.stage}] {text}")
    else:
        lines.append(text)
    if recorder is not None:
        lines.append(f"progress file: {recorder.progress.path}")
        if recorder.session_id:
            lines.append(f"session: {recorder.session_id} (offer {recorder.offer_id})")
    return "\n".join(lines)


def cells_for_marker(marker: pytest.Mark, test_path: Path, rootpath: Path) -> list[Cell]:
    """Cells named by ``@pytest.mark.gpubench(MATRIX_FILE, gpu=..., provider=..., model=...)``.

    The marker's own gpu/provider/model narrow the file; the command-line filters
    apply later, like ``-k``, in :func:`filters.split_by_filters`.
    """
    from ..matrix.cells import cell_selected

    if not marker.args:
        raise MatrixError(str(test_path), "gpubench marker",
                          "name a matrix file: @pytest.mark.gpubench('matrix/x.yaml')")
    unknown = set(marker.kwargs) - {"gpu", "provider", "model"}
    if unknown:
        raise MatrixError(str(test_path), "gpubench marker",
                          f"unknown argument(s) {sorted(unknown)}; allowed: gpu, provider, model")
    raw = Path(marker.args[0])
    candidates = [raw] if raw.is_absolute() else [test_path.parent / raw, rootpath / raw]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise MatrixError(str(raw), "", "matrix file not found (looked next to the test and in the rootdir)")

    def as_list(value: Any) -> list[str]:
        return [value] if isinstance(value, str) else list(value or [])

    cells = load_cells(path)
    check_clouds(cells)
    return [
        cell for cell in cells
        if cell_selected(cell, as_list(marker.kwargs.get("gpu")), as_list(marker.kwargs.get("provider")),
                         as_list(marker.kwargs.get("model")))
    ]


# --------------------------------------------------------------------------------------------------
# The cells ``gpubench plan`` prices: exactly the ones ``pytest`` would run.
#
# Rather than reading matrix files itself, the plan runs pytest's own collection in
# this process (``pytest.main([... "--collect-only"], plugins=[reader])``), quietly,
# so that paths, ``-k``, ``--gpu`` / ``--provider`` / ``--model``, ini options,
# ``GPUBENCH_*`` settings, Python tests on matrix cells and matrix errors behave as
# in a run. The reader takes each item's cell (with the run's overrides applied, as
# the ``gpubench_cell`` fixture does) and manifest key, in run order: after
# :func:`~pytest_gpubench.plugin.run_hooks.arrange_reuse_groups` has put each reuse
# group together, longest first. Collection touches no network (a sandbox is not
# started under ``--collect-only`` either).


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
