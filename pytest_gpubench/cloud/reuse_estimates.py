"""How long a reuse group's cells take and what their session needs: plain arithmetic on cells.

Collection orders and splits reuse groups with these, so this module imports no SSH,
HTTP or manifest code: ``pytest --collect-only`` of a large matrix stays light.
:mod:`.session_pool` uses the same figures when it rents and reserves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..errors import Stage
from ..matrix.cells import Cell

#: Seconds of a typical model pull and load on top of a cell's benchmark, per GB of
#: the model's VRAM need (seed 000: a 7B model pulls in about a minute).
PULL_SECONDS_PER_GB = 8.0
#: Typical seconds per setup stage on a real cloud (``gpubench plan``'s defaults, and what
#: :mod:`.reuse_split` weighs a session's setup at). Seed 000's example run
#: (progress file in its "Output File Example") times most of them:
#: ``INVENTORY_QUERY`` 10:00:05 -> ``PROVISIONING`` 10:00:06 -> ``SSH_READY`` 10:02:30
#: -> ``OLLAMA_INSTALLED`` 10:03:00 (connect and install together: 30 s).
DEFAULT_STAGE_SECONDS: Mapping[Stage, float] = {
    Stage.PROVISION: 5.0,  # the create call: 1 s in seed 000, rounded up for API retries
    Stage.SSH_WAIT: 144.0,  # seed 000: 2 min 24 s from create to SSH ready
    Stage.SSH_CONNECT: 5.0,  # connect, check, nvidia-smi: the 5 s seed 000's 30 s leaves to it
    Stage.RUNTIME_SETUP: 25.0,  # seed 000: the rest of those 30 s
}
#: A session's disk holds the image and system (GPU Shopper's disk estimate: 10 GB
#: Docker image + 5 GB OS) besides the models.
SYSTEM_DISK_GB = 15
#: Room beyond the largest model of a session: logs, checkpoints, a partial download.
DISK_MARGIN_GB = 5
#: What GPU Shopper's Vast.ai provider gives a session that asks for no size.
DEFAULT_DISK_GB = 50
def planned_runs(cell: Cell, runs: int | None = None) -> int:
    """Runs to plan for: ``--gpubench-runs``, else the matrix's count, else its maximum."""
    return max(runs or cell.runs.count or cell.runs.max, 1)


def planned_benchmark_seconds(cell: Cell, runs: int | None = None) -> float:
    """A cell's benchmark length to plan for: ``duration`` x its runs; for a saturation sweep
    (``rate: sweep``) its most steps, the throughput probe included, x their duration."""
    sweep = cell.sweep
    if sweep is not None:
        return (sweep.duration or cell.workload.duration) * (sweep.steps + (sweep.max_rate is None))
    return cell.workload.duration * planned_runs(cell, runs)


def estimated_cell_seconds(cell: Cell, runs: int | None = None, time_scale: float = 1.0) -> float:
    """A cell's expected time on a session it did not rent: its model's pull (a wait, on the
    run's clock), then its benchmark (real time)."""
    return PULL_SECONDS_PER_GB * cell.vram_gb * time_scale + planned_benchmark_seconds(cell, runs)


def order_for_reuse(cells: Sequence[Cell | None], runs: int | None = None) -> list[int]:
    """Indexes of ``cells`` in run order: each reuse group together, longest group first.

    ``None`` entries (tests that are not matrix cells) and ``reuse: cell`` cells are
    groups of their own. Ties keep the order of first appearance, and a group's cells
    keep theirs, so the order is the same in every xdist worker.
    """
    groups: dict[object, list[int]] = {}
    for index, cell in enumerate(cells):
        key = cell.session_group if cell is not None and cell.session_group else ("single", index)
        groups.setdefault(key, []).append(index)

    def length(members: list[int]) -> float:
        return sum(estimated_cell_seconds(cells[i], runs) for i in members if cells[i] is not None)

    ordered = sorted(groups.values(), key=lambda members: (-length(members), members[0]))
    return [index for members in ordered for index in members]


def disk_gb_for(cells: Iterable[Cell]) -> int:
    """Disk to ask for: the system, the largest model of the session's cells and a margin.

    Models pulled earlier are removed when the next one would not fit, so the
    largest one, not their sum, sets the size (as GPU Shopper's own benchmark runner
    asks for 64 GB for a 70B model).
    """
    largest = max((cell.vram_gb for cell in cells), default=0)
    return max(DEFAULT_DISK_GB, SYSTEM_DISK_GB + largest + DISK_MARGIN_GB)


def reservation_seconds(cells: Sequence[Cell], runs: int | None = None) -> float:
    """Benchmark seconds of ``cells`` back to back, plus the pulls of all but the first
    (the first's setup is in the stage budget the reservation adds)."""
    if not cells:
        return 0.0
    first, rest = cells[0], cells[1:]
    return planned_benchmark_seconds(first, runs) + sum(estimated_cell_seconds(c, runs) for c in rest)
