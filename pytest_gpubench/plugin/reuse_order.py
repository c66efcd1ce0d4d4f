"""Collection-time side of session reuse: run order and xdist groups.

Kept out of ``plugin.py`` so the hooks stay thin; the rules themselves (which cells
share, which group is longest) are in :mod:`pytest_gpubench.run.session_pool`.
"""

from __future__ import annotations

import pytest

from ..matrix.cells import apply_overrides
from ..cloud.reuse_estimates import order_for_reuse
from ..cloud.reuse_split import SplitPolicy, split_groups
from .stash import CELL_KEY, GROUP_KEY, RECORD_KEY, REUSE_GROUPS_KEY, SETTINGS_KEY


def arrange_reuse_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each reuse group's cells together, longest group first, and mark them.

    Under ``pytest -n N`` with idle workers, a group may first be split over more
    sessions (:mod:`.reuse_split`): each sub-group is a group here.

    Only the positions matrix cells hold are reordered (other tests stay where
    they are). Each grouped cell gets ``xdist_group(<group>)`` so that
    ``--dist loadgroup`` keeps its group on one worker, and the groups' members go
    to ``config.stash`` for the session pool, which sizes a session for them.
    """
    settings = config.stash[SETTINGS_KEY]
    slots = [i for i, item in enumerate(items) if CELL_KEY in item.stash]
    cells = [apply_overrides(items[i].stash[CELL_KEY], settings) for i in slots]
    # Under -n, a group may be split over more sessions so that idle workers share it
    # (reuse_split.py); the controller's scheduler decides the same from the same cells.
    split, _ = split_groups(cells, SplitPolicy.from_settings(settings, loadgroup_workers(config)))
    for i, (before, after) in enumerate(zip(cells, split, strict=True)):
        if after is not None and after.session_part != before.session_part:
            stash = items[slots[i]].stash
            stash[CELL_KEY] = stash[CELL_KEY].model_copy(update={"session_part": after.session_part})
            cells[i] = after
    order = order_for_reuse(cells, settings.runs)
    arranged = [items[slots[i]] for i in order]
    members: dict[str, list] = {}
    for slot, item, cell in zip(slots, arranged, [cells[i] for i in order], strict=True):
        items[slot] = item
        group = cell.session_group
        item.stash[GROUP_KEY] = group
        if group is not None:
            members.setdefault(group, []).append((item.stash[RECORD_KEY], cell))
    marks: dict[str, pytest.MarkDecorator] = {}  # one per group: 10,000 cells need not build 10,000 marks
    for item in arranged:
        group = item.stash[GROUP_KEY]
        if group is not None and len(members[group]) > 1:
            if group not in marks:
                marks[group] = pytest.mark.xdist_group(group)
            item.add_marker(marks[group])
    config.stash[REUSE_GROUPS_KEY] = members


def loadgroup_workers(config: pytest.Config) -> int:
    """The xdist workers sharing this run's groups: ``-n N`` on a worker under
    ``--dist loadgroup``, else 1 (no xdist, or another mode that does not keep groups)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or not workerinput.get("gpubench_loadgroup"):
        return 1
    return int(workerinput.get("workercount") or 1)
