"""Where ``--gpubench-gpu``/``--gpubench-provider``/``--gpubench-model`` select cells.

One function decides, :func:`split_by_filters`, for matrix files (before their
items are built, so a filter that keeps 10% of a big matrix builds 10% of its
items) and for Python tests parametrized by the ``gpubench`` marker (at
``pytest_collection_modifyitems``). The run's filters are a :class:`CellFilters` on
``config.stash[CELL_FILTERS_KEY]``; what they keep out is deselected, so pytest's
counts read as with ``-k``. When they keep nothing, ``plugin.matrix_scan.filter_hint_lines``
says which values exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .selection import cell_selected


@dataclass(frozen=True)
class CellFilters:
    """The run's filters: within one, any value may match; an empty one keeps everything."""

    gpus: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Any) -> CellFilters:
        """The filters ``settings`` hold (``--gpubench-gpu`` etc.)."""
        return cls(tuple(settings.gpu), tuple(settings.provider), tuple(settings.model))

    @property
    def active(self) -> bool:
        return bool(self.gpus or self.providers or self.models)


def split_by_filters(cells: Iterable[Any], filters: CellFilters) -> tuple[list[Any], list[Any]]:
    """``(kept, dropped)``: the cells the filters select, in order, and the others
    (:func:`selection.cell_selected` has the matching rules)."""
    cells = list(cells)
    if not filters.active:
        return cells, []
    kept: list[Any] = []
    dropped: list[Any] = []
    for cell in cells:
        (kept if cell_selected(cell, filters.gpus, filters.providers, filters.models) else dropped).append(cell)
    return kept, dropped
