"""A run of one phase of a runners file (``--gpubench-runners``; matrix/runners.py, docs/runners.md).

Every process of the run knows the whole phase (:class:`PhaseRun`): each cell of it, once per
rerun, with the record key it is kept under and whether this host's runner takes it. Collection
builds items only for the cells taken (:func:`PhaseRun.items_of`), the others are deselected;
the controller records the run under the phase's name and registers every cell of the phase as
``pending`` at the start (:class:`PhaseHooks`), so ``gpubench status`` knows what is left
even of cells no machine has started.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from datetime import date
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..errors import MatrixError
from ..matrix.cells import Cell, load_cells
from ..matrix.runners import RunnerPlan, load_runners, plan_runner
from ..settings import Settings
from ..store.records import distinct_keys, matrix_key, row_id
from .matrix_scan import matrix_files, real_run
from .stash import run_context

#: This process's phase run, when the run has a runners file.
PHASE_KEY = pytest.StashKey["PhaseRun"]()


@dataclass(frozen=True)
class PhaseCell:
    """One run of one cell of the phase: its test id (``...-rerun2`` after the first), its record key."""

    test_id: str
    key: str
    cell: Cell
    taken: bool


@dataclass
class PhaseRun:
    """The phase this host runs: every cell of it, and what this host's runner takes."""

    plan: RunnerPlan
    cells: list[PhaseCell]
    _by_id: dict[tuple[str, str], PhaseCell] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, plan: RunnerPlan, collected: Iterable[Path]) -> PhaseRun:
        """The phase's cells from its matrix files (else the files pytest collects), in file order.

        A file that cannot be read is left out here: collection reports what is wrong with it.
        """
        files = [Path(p) for p in plan.spec.matrix] or list(collected)
        found: list[Cell] = []
        for path in files:
            try:
                found.extend(load_cells(path))
            except MatrixError:
                continue
        taken, _, _ = plan.split(found)
        takes = {id(cell) for cell in taken}
        runs = [(test_id, cell) for cell in found if plan.spec.holds(cell) for test_id in plan.test_ids(cell)]
        keys = distinct_keys([matrix_key(test_id) for test_id, _ in runs], [cell.source for _, cell in runs])
        cells = [PhaseCell(test_id, key, cell, id(cell) in takes) for (test_id, cell), key in zip(runs, keys)]
        run = cls(plan, cells)
        run._by_id = {(_where(c.cell.source), c.test_id): c for c in cells}
        return run

    @property
    def taken(self) -> list[PhaseCell]:
        return [c for c in self.cells if c.taken]

    def summary(self) -> str:
        """``runner gpu-box-a takes RTX 4090 on local: 6 of 10 cells of phase nightly``."""
        return self.plan.summary(len(self.taken), len(self.cells))

    def items_of(self, cells: Iterable[Cell]) -> tuple[list[PhaseCell], list[Cell]]:
        """A matrix file's cells as collection builds them: the runs this runner takes, and the
        cells it leaves (outside the phase, or left to other runners), which are deselected."""
        runs: list[PhaseCell] = []
        left: list[Cell] = []
        for cell in cells:
            mine = [self._by_id.get((_where(cell.source), test_id)) for test_id in self.plan.test_ids(cell)]
            if mine and all(run is not None and run.taken for run in mine):
                runs.extend(run for run in mine if run is not None)
            else:
                left.append(cell)
        return runs, left


def _where(source: str) -> str:
    return str(Path(source).resolve())


def start_phase(config: pytest.Config, settings: Settings, *, controller: bool, run_id_fixed: bool) -> Settings:
    """Plan this host's part of the phase, stash it, and (controller) name the run after the phase
    unless ``--gpubench-run-id`` or resume named it (``run_id_fixed``)."""
    if not settings.runners:
        given = "--gpubench-phase" if settings.phase else "--gpubench-runner"
        raise pytest.UsageError(f"{given} needs a runners file: --gpubench-runners FILE (docs/runners.md)")
    try:
        plan = plan_runner(load_runners(settings.runners), settings.runner or socket.gethostname(),
                           settings.phase)
    except MatrixError as exc:
        raise pytest.UsageError(str(exc)) from None
    phase = config.stash[PHASE_KEY] = PhaseRun.build(plan, matrix_files(config))
    if not controller:
        return settings
    config.pluginmanager.register(PhaseHooks(config), "gpubench-phases")
    if settings.run_id_given or settings.resume or run_id_fixed:
        return settings
    return settings.model_copy(update={"run_id": phase.plan.phase})


class PhaseHooks:
    """The controller's part: say what this runner takes, and register the whole phase."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.registered = False
        #: The warning that the phase ran before under this run id, if it did (:meth:`register`).
        self.already_done: str | None = None

    def pytest_report_header(self, config: pytest.Config) -> str:
        return f"gpubench: {config.stash[PHASE_KEY].summary()}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.config.option.verbose < 0:  # -q hides the header that says it
            terminalreporter.write_line(f"gpubench: {self.config.stash[PHASE_KEY].summary()}")
        if self.already_done:
            terminalreporter.write_line(self.already_done, yellow=True, bold=True)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.register()

    def register(self) -> None:
        """Every cell of the phase, taken here or not, as ``pending`` (adding one again changes nothing)."""
        config = self.config
        if self.registered or not real_run(config):
            return
        self.registered = True
        context = run_context(config)
        for run in config.stash[PHASE_KEY].cells:
            cell = run.cell
            context.store.add_cell(context.run_id, run.key, gpu_type=cell.gpu, provider=cell.provider,
                                   model=cell.model, matrix_file=cell.source)
        self.already_done = self._already_done()

    def _already_done(self) -> str | None:
        """What to say when every cell this runner takes ended in the run before this controller
        started (the phase was run before under the same run id): nothing will run."""
        from .claims import ENDED, ended_earlier  # not at plugin load: only a phase run needs claims

        context = run_context(self.config)
        settings, phase = context.settings, self.config.stash[PHASE_KEY]
        if settings.rerun or settings.resume or not phase.taken:
            return None
        records = [context.store.cell(row_id(context.run_id, run.key)) for run in phase.taken]
        if not all(r is not None and r.status in ENDED and ended_earlier(r, context.owner.since) for r in records):
            return None
        return (f"gpubench: every cell runner {phase.plan.runner} takes in phase {phase.plan.phase} already ended "
                f"in run {context.run_id}, before this controller started: nothing runs (each is reported "
                f"claimed). To run the phase again, name a new run: --gpubench-run-id "
                f"{phase.plan.phase}-{date.today().isoformat()} (or --gpubench-rerun to run this one again); "
                "docs/runners.md")
