"""``gpubench plan`` for people: aligned tables (like the run's summary), then the totals."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..cloud.budget import usd
from .plan import Plan, SplitPlan
from ..cloud.reuse_split import percent

CELL_COLUMNS = ("cell", "offer", "$/h", "setup", "pull", "bench", "time", "cost $", "session")
SESSION_COLUMNS = ("session", "group", "offer", "$/h", "cells", "setup", "time", "cost $")
SPLIT_COLUMNS = ("group", "cells", "sessions", "extra", "why not more")


#: Widest an offer id or a group name is shown in a column: longer ones wrap after a
#: ``-`` (TensorDock's ids run to 70 characters and would push the table off the screen).
WRAP_AT = 26


def render(plan: Plan) -> list[str]:
    """The plan as terminal lines; a ``GPUs`` column (each offer's count, priced whole) when any cell spans several."""
    rows = [_cell_row(c) for c in plan.cells]
    columns: tuple[str, ...] = CELL_COLUMNS
    if any(c.gpus > 1 for c in plan.cells):
        columns, rows = (*columns, "GPUs"), [(*row, str(c.gpus)) for row, c in zip(rows, plan.cells)]
    lines = _table(columns, rows, left=(0, 1, 8), wrap={1: WRAP_AT})
    flagged = [c for c in plan.cells if c.no_offer_reason]
    if flagged:
        lines += ["", "no eligible offer (a run skips these cells; --gpubench-fail-on-skip fails them):"]
        lines += [f"  {c.cell}: {c.no_offer_reason}" for c in flagged]
    if plan.sessions:
        lines += ["", "sessions to create:"]
        lines += ["  " + line for line in _table(SESSION_COLUMNS, [
            (f"#{s.session}", s.reuse_group or "-", s.offer_id, f"{s.price_per_hour:.3f}", str(len(s.cells)),
             duration(s.setup_seconds), duration(s.seconds), f"{s.cost_usd:.4f}")
            for s in plan.sessions], left=(0, 1, 2), wrap={1: WRAP_AT, 2: WRAP_AT})]
    if plan.split is not None and plan.split.groups:
        lines += ["", *_split_lines(plan.split)]
    totals = plan.totals
    without = f" ({totals.cells_without_offer} without an offer)" if totals.cells_without_offer else ""
    lines += ["", f"total: {totals.cells} cell(s){without}, {totals.sessions} session(s), "
                  f"{totals.gpu_hours:.2f} GPU-hours, {usd(totals.cost_usd)}"]
    wall = f"wall time: {duration(totals.wall_seconds)} with 1 worker"
    if totals.workers and totals.wall_seconds_workers is not None:
        longest = max(plan.groups, key=lambda g: g.seconds, default=None)
        wall += f"; about {duration(totals.wall_seconds_workers)} with -n {totals.workers}"
        if longest is not None:
            wall += f" (longest group {longest.name}: {duration(longest.seconds)})"
    lines.append(wall)
    if plan.split is not None and plan.split.groups:
        lines += _split_choice(plan)
    where = "the sandbox" if plan.sandbox else plan.api
    scale = f", default setup times x {plan.time_scale:g} (its clock)" if plan.sandbox else ""
    lines.append(f"offers: live inventory of {where}{scale}; stage times: {plan.history}, defaults otherwise "
                 "(gpubench plan --json shows each figure's source)")
    return lines


def _cell_row(cell) -> tuple[str, ...]:
    if cell.no_offer_reason:
        return (cell.cell, "-", "-", "-", "-", "-", "-", "-", "NO OFFER")
    where = f"#{cell.session} {'rents' if cell.rents_session else 'reuses'}"
    return (cell.cell, cell.offer_id or "-", f"{cell.price_per_hour:.3f}",
            duration(cell.setup_seconds) if cell.rents_session else "-", duration(cell.pull_seconds),
            duration(cell.benchmark_seconds), duration(cell.seconds), f"{cell.cost_usd:.4f}", where)


def _split_lines(split: SplitPlan) -> list[str]:
    """Each reuse group's sessions under ``-n N`` and why not more."""
    limit = "auto" if split.sessions_per_group is None else str(split.sessions_per_group)
    head = (f"reuse groups with -n {split.workers} (--gpubench-sessions-per-group {limit}, "
            f"--gpubench-split-cost {percent(split.split_cost)}):")
    rows = [(g.group, str(g.cells), str(g.sessions), f"+{percent(g.extra_share)}", g.why) for g in split.groups]
    return [head, *["  " + line for line in _table(SPLIT_COLUMNS, rows, left=(0, 4), wrap={0: WRAP_AT})]]


def _split_choice(plan: Plan) -> list[str]:
    """The choice made, against one session per group: sessions, cost and wall time of each."""
    split, totals = plan.split, plan.totals
    assert split is not None and totals.wall_seconds_workers is not None
    workers = f"with -n {split.workers}"
    if totals.sessions == split.unsplit_sessions:
        return [f"split: none, one session per reuse group ({workers}, see why above)"]
    extra = totals.cost_usd - split.unsplit_cost_usd
    longer = split.unsplit_wall_seconds_workers - totals.wall_seconds_workers
    return [f"split over {totals.sessions} sessions: {usd(totals.cost_usd)}, about "
            f"{duration(totals.wall_seconds_workers)} {workers}",
            f"one session per group: {split.unsplit_sessions} session(s), {usd(split.unsplit_cost_usd)} "
            f"({usd(extra)} less), about {duration(split.unsplit_wall_seconds_workers)} {workers} "
            f"({duration(longer)} longer)"]


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int],
           wrap: Mapping[int, int] | None = None) -> list[str]:
    """Aligned columns; a column in ``wrap`` is at most that wide, its longer texts wrapped
    over more lines (the row's other columns blank on those)."""
    wrap = wrap or {}
    lines: list[tuple[str, ...]] = []
    for row in [tuple(columns), *rows]:
        pieces = [wrap_text(text, wrap[i]) if i in wrap else [text] for i, text in enumerate(row)]
        for n in range(max(len(p) for p in pieces)):
            lines.append(tuple(p[n] if n < len(p) else "" for p in pieces))
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return ["  ".join(text.ljust(widths[i]) if i in left else text.rjust(widths[i])
                      for i, text in enumerate(line)).rstrip() for line in lines]


def wrap_text(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a ``-`` where it can
    be (an id stays readable and copyable piece by piece), else cut."""
    if len(text) <= width:
        return [text]
    parts = re.findall(r"[^-]*-|[^-]+$", text)
    lines = [""]
    for part in parts:
        while len(part) > width:  # a piece longer than a line: cut it
            if lines[-1]:
                lines.append("")
            lines[-1], part = part[:width], part[width:]
            lines.append("")
        if len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return [line for line in lines if line]


def duration(seconds: float) -> str:
    """``2.4s``, ``45s``, ``8m53s``, ``1h02m``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
