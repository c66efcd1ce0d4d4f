"""Calls of the user hooks (:mod:`.hookspec`) where the fixtures need them: one function each.

Thin on purpose: the answers are checked and applied by plain modules.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ..cloud.offers import put_first
from ..cloud.provider import OfferChoice
from ..errors import MatrixError
from ..matrix.adjust import with_workload
from ..matrix.cells import Cell
from ..measure.finished import FinishedCell, figures_of


def select_offer(config: pytest.Config, cell: Cell, choice: OfferChoice) -> OfferChoice:
    """``choice`` with the offer a ``pytest_gpubench_select_offer`` picked first, if one did."""
    chosen = config.hook.pytest_gpubench_select_offer(cell=cell, eligible=list(choice.eligible),
                                                      chosen=choice.offer, config=config)
    if chosen is None:
        return choice
    eligible = put_first(choice.eligible, chosen, "pytest_gpubench_select_offer")
    return replace(choice, offer=eligible[0], eligible=eligible)


def adjust_workload(config: pytest.Config, cell: Cell) -> Cell:
    """``cell`` with the workload a ``pytest_gpubench_adjust_workload`` returned, if one did."""
    returned = config.hook.pytest_gpubench_adjust_workload(cell=cell, workload=cell.workload, config=config)
    try:
        return with_workload(cell, returned, "pytest_gpubench_adjust_workload")
    except MatrixError as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: the report shows one message, not two


def cell_finished(config: pytest.Config, recorder: Any, status: str, failure_stage: str | None,
                  error_message: str | None, properties: dict[str, Any]) -> None:
    """Tell every ``pytest_gpubench_cell_finished`` how the cell ``recorder`` recorded ended."""
    if not config.pluginmanager.hook.pytest_gpubench_cell_finished.get_hookimpls():
        return  # nobody listens: build nothing
    finished = FinishedCell(run_id=recorder.run_id, cell_key=recorder.record_key, cell=recorder.cell,
                            status=status, failure_stage=failure_stage, error_message=error_message,
                            result=recorder.result, figures=figures_of(properties),
                            progress_file=str(recorder.progress.path))
    config.hook.pytest_gpubench_cell_finished(finished=finished, config=config)
