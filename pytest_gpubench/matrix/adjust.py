"""A workload a user's hook returned for a cell: validated, and kept to the cell's load point.

``pytest_gpubench_adjust_workload`` may change how a cell is benchmarked (duration,
tokens, prompts, warm-up, runs) but not which cell it is: concurrency and rate are
the load point in the cell's id, manifest row and baseline, so changing them is an
error here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..errors import MatrixError, dotted
from .cells import Cell
from .workload import Workload


def with_workload(cell: Cell, returned: Any, source: str) -> Cell:
    """``cell`` running ``returned`` (a ``Workload`` or its fields as a dict); ``source``
    names who returned it in the error. None keeps the cell as it is."""
    if returned is None:
        return cell
    # No serializer warnings: a wrong value is what validation below reports, in its words.
    fields = returned.model_dump(warnings=False) if isinstance(returned, Workload) else returned
    if isinstance(returned, Workload):
        fields["prompts"] = returned.prompts  # as they are: a dump would drop a dataset's source
    try:
        # Validated again: model_copy(update=...) in the user's hook skips validation.
        workload = Workload.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{dotted(e['loc']) or 'workload'}: {e['msg']}" for e in exc.errors())
        raise MatrixError(cell.source, "workload",
                          f"{source} returned an invalid workload for {cell.cell_id}: {problems}") from None
    for axis in ("concurrency", "rate"):
        if getattr(workload, axis) != getattr(cell.workload, axis):
            raise MatrixError(cell.source, "workload",
                              f"{source} changed the {axis} of {cell.cell_id}: it is the cell's load point "
                              "(its id, its manifest row, its baseline); set it in the matrix instead")
    return cell.model_copy(update={"workload": workload})
