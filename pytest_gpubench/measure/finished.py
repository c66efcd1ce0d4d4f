"""What a finished cell hands to ``pytest_gpubench_cell_finished``: one frozen value.

Built once the cell is recorded (manifest, progress file, report properties), so a
dashboard sees exactly what the run keeps. ``figures`` are the report properties
without their ``gpubench_`` prefix: plain JSON values, named as docs/metrics.md
names them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..matrix.cells import Cell
from .results import BenchmarkResult

#: The prefix report properties carry in JUnit XML; ``figures`` go without it.
PROPERTY_PREFIX = "gpubench_"


class FinishedCell(BaseModel):
    """One cell's end: who it was, how it ended, and what it measured."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    run_id: str
    #: The cell's key in the manifest (its id, with the matrix file's name when two files share it).
    cell_key: str
    cell: Cell
    #: ``success``, ``partial``, ``failed`` or ``skipped``.
    status: str
    failure_stage: str | None = None
    error_message: str | None = None
    #: The GPU Shopper BenchmarkResult; None when nothing was measured.
    result: BenchmarkResult | None = None
    #: The cell's report properties (GPU, provider, session, cost, every figure), as plain JSON values.
    figures: dict[str, Any] = {}
    progress_file: str = ""


def figures_of(properties: dict[str, Any]) -> dict[str, Any]:
    """A cell's report properties without their ``gpubench_`` prefix."""
    return {name.removeprefix(PROPERTY_PREFIX): value for name, value in properties.items()}
