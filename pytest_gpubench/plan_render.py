"""``gpubench plan`` for people: aligned tables (like the run's summary), then the totals."""

from __future__ import annotations

from collections.abc import Sequence

from .budget import usd
from .plan import Plan

CELL_COLUMNS = ("cell", "offer", "$/h", "setup", "pull", "bench", "time", "cost $", "session")
SESSION_COLUMNS = ("session", "group", "offer", "$/h", "cells", "setup", "time", "cost $")


def render(plan: Plan) -> list[str]:
    """The plan as terminal lines."""
    lines = _table(CELL_COLUMNS, [_cell_row(c) for c in plan.cells], left=(0, 1, 8))
    flagged = [c for c in plan.cells if c.no_offer_reason]
    if flagged:
        lines += ["", "no eligible offer (a run skips these cells; --gpubench-fail-on-skip fails them):"]
        lines += [f"  {c.cell}: {c.no_offer_reason}" for c in flagged]
    if plan.sessions:
        lines += ["", "sessions to create:"]
        lines += ["  " + line for line in _table(SESSION_COLUMNS, [
            (f"#{s.session}", s.reuse_group or "-", s.offer_id, f"{s.price_per_hour:.3f}", str(len(s.cells)),
             duration(s.setup_seconds), duration(s.seconds), f"{s.cost_usd:.4f}")
            for s in plan.sessions], left=(0, 1, 2))]
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


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int]) -> list[str]:
    table = [tuple(columns), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return ["  ".join(text.ljust(widths[i]) if i in left else text.rjust(widths[i])
                      for i, text in enumerate(row)).rstrip() for row in table]


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
