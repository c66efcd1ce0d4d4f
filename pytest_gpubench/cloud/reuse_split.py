"""Split a reuse group over more sessions when ``pytest -n N`` workers would sit idle.

A reuse group (``Cell.session_group``: one GPU type on one provider) runs on one
session, one cell after another, on one worker. With ``-n 8`` and two groups, six
workers have nothing to do and the run takes as long as the longer group. Here a
group may be split into sub-groups, each its own ``xdist_group`` and its own
session (``RTX_4090-vastai/1``, ``RTX_4090-vastai/2``): every extra session pays
the setup again (provision, SSH, Ollama) and the pulls of its models, in exchange
for running at the same time as the others.

The rule, applied to the estimates below (a model's pull per GB,
the benchmark's duration x runs) and the default setup time of
``gpubench plan`` (:data:`DEFAULT_STAGE_SECONDS`; both on the run's clock):

* Only under ``--dist loadgroup`` with more than one worker, and only while the
  work units (sub-groups and cells alone) are fewer than the workers: no unit ever
  waits for another because of a split.
* Only where it shortens the run: the units that set the estimated wall time (the
  longest; all of them when several tie) are split one session further, together,
  as long as every one of them can be. Shorter groups are never split: that would
  cost more without ending the run sooner.
* A group gets at most ``--gpubench-sessions-per-group`` sessions (``auto``: one
  per cell) and its split may add at most ``--gpubench-split-cost`` percent
  (default 20) to its GPU time, which at one offer's price is its cost; and a
  split must save more wall time than the GPU time it adds.

A group's cells are dealt to its sub-groups longest first, each to the least
loaded one (as the plan estimates ``-n N``), so the sub-groups are balanced.
Everything depends only on the set of selected cells, the worker count and the
settings, never on their order: every xdist worker and the controller, each
deciding on its own, agree. Prices are not known at collection (it reads no
inventory), which is why the accepted extra cost is a share and not dollars;
``gpubench plan -n N`` prints the dollars and the wall time of the choice and of
not splitting.

**The estimates** (:func:`estimated_cell_seconds`, :func:`reservation_seconds`,
:func:`order_for_reuse`, ...): how long a reuse group's cells take and what their session
needs, plain arithmetic on cells. Collection orders and splits reuse groups with these,
so this module imports no SSH, HTTP or manifest code: ``pytest --collect-only`` of a large
matrix stays light. :mod:`~pytest_gpubench.run.session_pool` uses the same figures when it
rents and reserves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import Stage
from ..matrix.cells import Cell

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..settings import Settings

#: Seconds of a typical model pull and load on top of a cell's benchmark, per GB of
#: the model's VRAM need (seed 000: a 7B model pulls in about a minute).
PULL_SECONDS_PER_GB = 8.0
#: Typical seconds per setup stage on a real cloud (``gpubench plan``'s defaults, and what
#: the split below weighs a session's setup at). Seed 000's example run
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
    (``rate: sweep``) its most steps, the throughput probe included, x their duration; for a
    ``concurrency: sweep`` its most steps (its levels, or 1, 2, 4 ... up to the cap) x their duration."""
    sweep = cell.sweep
    if sweep is not None and cell.sweep_kind == "concurrency":
        return (sweep.duration or cell.workload.duration) * sweep.max_concurrency_steps
    if sweep is not None:
        return (sweep.duration or cell.workload.duration) * (sweep.steps + (sweep.max_rate is None))
    if cell.workload.trace is not None:  # a trace runs for its own span, on any clock
        return cell.workload.trace.window * planned_runs(cell, runs)
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


#: Relative tolerance when comparing estimated seconds (units that tie set the wall time together).
_TIE = 1e-9


@dataclass(frozen=True)
class SplitPolicy:
    """What a split may do: the workers there are, the sessions and extra cost allowed."""

    #: ``pytest -n`` workers under ``--dist loadgroup``; 1 never splits.
    workers: int = 1
    #: The most sessions per group (``--gpubench-sessions-per-group``); None: one per cell.
    limit: int | None = None
    #: The extra GPU time a split may add, a share of the group's time on one session.
    max_extra_share: float = 0.20
    #: ``--gpubench-runs``, as the estimates count runs.
    runs: int | None = None
    #: The run's clock: setups and pulls are waits on it, benchmarks run at real speed.
    time_scale: float = 1.0

    @classmethod
    def from_settings(cls, settings: Settings, workers: int) -> SplitPolicy:
        return cls(workers=max(workers, 1), limit=settings.sessions_per_group,
                   max_extra_share=settings.split_cost, runs=settings.runs, time_scale=settings.time_scale)

    @property
    def setup_seconds(self) -> float:
        """A new session's setup: seed 000's default stage times, on the run's clock."""
        return sum(DEFAULT_STAGE_SECONDS.values()) * self.time_scale

    def pull_seconds(self, cell: Cell) -> float:
        return PULL_SECONDS_PER_GB * cell.vram_gb * self.time_scale

    def bench_seconds(self, cell: Cell) -> float:
        return planned_benchmark_seconds(cell, self.runs)

    def session_seconds(self, cells: Sequence[Cell]) -> float:
        """One session for ``cells``: its setup, each model pulled once, every benchmark."""
        pulls = {cell.model_ref.lower(): self.pull_seconds(cell) for cell in cells}
        return self.setup_seconds + sum(pulls.values()) + sum(self.bench_seconds(cell) for cell in cells)


@dataclass(frozen=True)
class GroupSplit:
    """What was decided for one reuse group, and why not more sessions."""

    group: str
    cells: int
    sessions: int
    #: Estimated seconds of the group on one session, and of its longest sub-group as split.
    seconds: float
    longest_seconds: float
    #: The GPU time the split adds, a share of ``seconds`` (0 unsplit).
    extra_share: float
    #: Why it has no more sessions than this.
    why: str


def percent(share: float) -> str:
    """``12.5%``, ``20%``: a share as people write it."""
    return f"{share * 100:.1f}".removesuffix(".0") + "%"


def _key(cell: Cell) -> tuple[str, str, str]:
    """A cell's identity for tie-breaking, the same in every process whatever the order."""
    return cell.cell_id, cell.matrix_name, Path(cell.source).name


def partition(cells: Sequence[Cell], parts: int, policy: SplitPolicy) -> list[int]:
    """Each cell's sub-group (0-based): longest cell first, each to the least loaded
    sub-group (the lower number on a tie). Sub-group 0 gets the longest cell."""
    seconds = [policy.pull_seconds(c) + policy.bench_seconds(c) for c in cells]
    loads = [0.0] * parts
    found = [0] * len(cells)
    for index in sorted(range(len(cells)), key=lambda i: (-seconds[i], _key(cells[i]))):
        target = min(range(parts), key=lambda j: (loads[j], j))
        found[index] = target
        loads[target] += seconds[index]
    return found


def sub_groups(cells: Sequence[Cell], parts: int, policy: SplitPolicy) -> list[list[Cell]]:
    """``cells`` dealt into ``parts`` sub-groups, each keeping the cells' order."""
    found = partition(cells, parts, policy)
    return [[cell for cell, part in zip(cells, found, strict=True) if part == j] for j in range(parts)]


class _Group:
    """One reuse group being split: its cells and the estimates for a number of sessions."""

    def __init__(self, name: str, cells: list[Cell], policy: SplitPolicy) -> None:
        self.name, self.cells, self.policy = name, sorted(cells, key=_key), policy
        self.sessions = 1
        self.why: str | None = None
        self.whole = policy.session_seconds(self.cells)

    def units(self, sessions: int) -> list[float]:
        return [self.policy.session_seconds(part) for part in sub_groups(self.cells, sessions, self.policy)]

    def blocked(self, sessions: int) -> tuple[str, str] | None:
        """Why the group may not go to ``sessions`` sessions (a kind: ``cells``, ``limit``,
        ``cost`` or ``gain``, and the words); None if it may."""
        policy = self.policy
        if sessions > len(self.cells):
            return "cells", "one session per cell already"
        if policy.limit is not None and sessions > policy.limit:
            return "limit", f"at the limit of {policy.limit} session(s) per group (--gpubench-sessions-per-group)"
        now, then = self.units(self.sessions), self.units(sessions)
        added = sum(then) - sum(now)
        share = (sum(then) - self.whole) / self.whole if self.whole > 0 else 0.0
        if share > policy.max_extra_share * (1 + _TIE):
            return "cost", (f"{sessions} sessions would add {percent(share)} to its GPU time, more than the "
                            f"{percent(policy.max_extra_share)} accepted (--gpubench-split-cost)")
        saved = max(now) - max(then)
        if saved <= added:
            return "gain", f"{sessions} sessions would save {saved:.0f} s of wall time for {added:.0f} s more GPU time"
        return None

    def next_split(self, room: int, workers: int) -> tuple[int | None, str]:
        """The fewest sessions beyond the present that pass every rule, at most ``room`` more;
        or None and why not. (Four equal cells gain nothing on three sessions but do on four.)"""
        first: str | None = None
        for sessions in range(self.sessions + 1, len(self.cells) + 2):
            found = self.blocked(sessions)
            if found is not None and found[0] in ("cells", "limit"):
                return None, first or found[1]
            if sessions > self.sessions + room:
                return None, first or f"no idle worker left (-n {workers})"
            if found is None:
                return sessions, ""
            kind, why = found
            if kind == "cost":  # more sessions only cost more
                return None, why
            first = first or why
        return None, first or "one session per cell already"


def split_groups(cells: Sequence[Cell | None], policy: SplitPolicy) -> tuple[list[Cell | None], list[GroupSplit]]:
    """``cells`` with ``session_part`` set where their group is split, and each group's decision.

    ``None`` entries (tests that are not matrix cells) stay as they are and count
    for nothing. Groups of one cell and ``reuse: cell`` cells are units of their own.
    """
    if policy.workers <= 1:  # nothing runs beside a group: no decision to make (and no cost at collection)
        return [cell if cell is None or cell.session_part is None else cell.model_copy(update={"session_part": None})
                for cell in cells], []
    members: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell is not None and cell.session_group is not None:
            members.setdefault(cell.reuse_group, []).append(cell)
    groups = [_Group(name, found, policy) for name, found in sorted(members.items()) if len(found) > 1]
    lone = [policy.session_seconds([cell]) for cell in cells if cell is not None
            and (cell.session_group is None or len(members[cell.reuse_group]) == 1)]
    if groups:
        _split(groups, lone, policy.workers)

    parts: dict[tuple[str, tuple[str, str, str]], int] = {}
    decisions: list[GroupSplit] = []
    for group in groups:
        units = group.units(group.sessions)
        decisions.append(GroupSplit(group.name, len(group.cells), group.sessions, group.whole, max(units),
                                    (sum(units) - group.whole) / group.whole if group.whole > 0 else 0.0,
                                    str(group.why)))
        if group.sessions > 1:
            for cell, part in zip(group.cells, partition(group.cells, group.sessions, policy), strict=True):
                parts[(group.name, _key(cell))] = part + 1
    result: list[Cell | None] = []
    for cell in cells:
        part = parts.get((cell.reuse_group, _key(cell))) if cell is not None and cell.session_group else None
        result.append(cell if cell is None or cell.session_part == part
                      else cell.model_copy(update={"session_part": part}))
    return result, decisions


def _split(groups: list[_Group], lone: list[float], workers: int) -> None:
    """Split the units that set the wall time, together, while workers are idle and it pays."""
    while True:
        longest = {group.name: max(group.units(group.sessions)) for group in groups}
        wall = max([*longest.values(), *lone])
        if any(seconds >= wall * (1 - _TIE) for seconds in lone):
            reason = "a cell alone sets the wall time: splitting would not end the run sooner"
            break
        slowest = [group for group in groups if longest[group.name] >= wall * (1 - _TIE)]
        room = workers - sum(group.sessions for group in groups) - len(lone)
        steps: list[tuple[_Group, int]] = []
        stuck: list[_Group] = []
        for group in slowest:
            sessions, why = group.next_split(room, workers)
            if sessions is None:
                group.why = why
                stuck.append(group)
            else:
                steps.append((group, sessions))
                room -= sessions - group.sessions
        if stuck:
            names = ", ".join(group.name for group in stuck)
            verb = "sets" if len(stuck) == 1 else "set"
            reason = f"splitting it would not end the run sooner: {names} {verb} the wall time"
            break
        for group, sessions in steps:
            group.sessions = sessions
    for group in groups:
        group.why = group.why or reason
