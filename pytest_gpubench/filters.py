"""Where ``--gpubench-gpu``/``--gpubench-provider``/``--gpubench-model`` select cells.

One function decides, :func:`split_by_filters`, for matrix files (before their
items are built, so a filter that keeps 10% of a big matrix builds 10% of its
items) and for Python tests parametrized by the ``gpubench`` marker (at
``pytest_collection_modifyitems``). What the filters keep out is tallied in a
:class:`FilterTally` on ``config.stash[FILTER_TALLY_KEY]``: pytest is told they are
deselected (so its counts stay those of ``-k``), and a run whose filters match
nothing can say which values exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .selection import cell_selected


@dataclass
class FilterTally:
    """Every cell the filters looked at in this process, and how many they kept out."""

    filters: dict[str, tuple[str, ...]]
    #: Each cell considered, kept or not (GPU, provider, model are what a message would list).
    seen: list[Any] = field(default_factory=list)
    dropped: int = 0

    @property
    def active(self) -> bool:
        return any(self.filters.values())


def tally_for(settings: Any) -> FilterTally:
    """A tally of ``settings``' filters (``--gpubench-gpu`` etc.), nothing seen yet."""
    return FilterTally({"gpu": tuple(settings.gpu), "provider": tuple(settings.provider),
                        "model": tuple(settings.model)})


def split_by_filters(cells: Iterable[Any], tally: FilterTally) -> tuple[list[Any], list[Any]]:
    """``(kept, dropped)``: the cells the filters select, in order, and the others.

    Within one filter any value may match; an empty filter keeps everything
    (:func:`selection.cell_selected` has the matching rules). The tally records both.
    """
    cells = list(cells)
    tally.seen.extend(cells)
    if not tally.active:
        return cells, []
    gpus, providers, models = (tally.filters[k] for k in ("gpu", "provider", "model"))
    kept: list[Any] = []
    dropped: list[Any] = []
    for cell in cells:
        (kept if cell_selected(cell, gpus, providers, models) else dropped).append(cell)
    tally.dropped += len(dropped)
    return kept, dropped


def values_seen(tally: FilterTally, name: str) -> Sequence[str]:
    """The distinct GPUs (``name="gpu"``), providers or models of the cells seen, in order."""
    return list(dict.fromkeys(getattr(cell, name) for cell in tally.seen))
