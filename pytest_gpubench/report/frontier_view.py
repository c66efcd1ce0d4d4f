"""The frontiers as both reports show them, as exports carry them and as PNG files for CI.

* :func:`target_table` and :func:`target_lines`: the cost-at-target table of a group and the
  headline lines ("at >= 20 tokens/s per user: cheapest ..., runner-up ... (+$0.05, +12%)");
* :func:`curve_points`: a group's chart data, the joined (non-dominated) points and the faint
  (dominated) ones, for throughput per GPU or $/M output tokens against interactivity;
* :func:`point_rows` and :func:`write_points`: every point of every curve as flat rows, the
  ``gpubench export --points`` output (JSON or CSV), columns :data:`POINT_COLUMNS`;
* :func:`write_pngs`: one PNG per chart drawn with matplotlib when it is installed (the
  ``charts`` extra), imported here only when called so that loading the plugin stays cheap.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import IO, Any

from ..measure.frontier import FrontierPoint
from . import tables as fmt
from .charts import PALETTE, Point
from .frontier import Curve, FrontierGroup, TargetAnswer
from .model import Report
from .tables import Figure, Table, per_million, tps

__all__ = ["COST_LABEL", "FRONTIER_INTRO", "INTERACTIVITY_LABEL", "NO_PNG", "NO_TARGETS", "POINT_COLUMNS",
           "TARGETS_INTRO", "THROUGHPUT_LABEL", "curve_points", "headlines", "point_rows", "setup_notes",
           "target_lines", "target_table", "write_pngs", "write_points"]

INTERACTIVITY_LABEL = "interactivity (tokens/s per user, 1000 / TPOT p50)"
THROUGHPUT_LABEL = "output tokens/s per GPU"
COST_LABEL = "billed $ per million output tokens"
FRONTIER_INTRO = ("For each model and workload, every GPU / provider / runtime measured at one or more loads: "
                  "throughput per GPU, and the billed $/M output tokens, against interactivity (the tokens/s one "
                  "user sees, 1000 / TPOT p50). Joined points are the frontier (no other point of the same curve "
                  "is both more interactive and better); light points are dominated. Costs are the billed price of "
                  "the measurement's session only; the setup minutes a session pays once are listed apart.")
TARGETS_INTRO = ("Cheapest at >= each target interactivity, read off each curve's frontier, linearly between "
                 "measured points and never beyond the most interactive one.")
NO_TARGETS = ("No target interactivity: set --target-interactivity 20,50 (or ini gpubench_target_interactivity), "
              "or an slo with tpot_ms in the matrix.")
NO_PNG = ("PNG charts: matplotlib is not installed; pip install 'pytest-gpubench[charts]' and run gpubench report "
          "again to get one PNG per chart beside index.html")


def _toks(value: float) -> str:
    return f"{value:g}" if value >= 10 else f"{value:.3g}"


def target_table(group: FrontierGroup) -> Table:
    """One row per target: the cheapest, its $/M tokens and throughput there, the runner-up and the margin."""
    rows = []
    for item in group.answers:
        cheapest, runner = item.cheapest, item.runner_up
        if cheapest is None:
            best = item.best_reached
            why = (f"not reached: best {_toks(best)} tok/s/user" if best is not None
                   else "no priced curve reaches it" if item.unpriced else "no curve")
            rows.append((Figure(f">= {_toks(item.target)}", item.target), item.source, why, Figure("-", None),
                         Figure("-", None), "-", Figure("-", None)))
            continue
        margin = item.margin
        rows.append((Figure(f">= {_toks(item.target)}", item.target), item.source, cheapest.label,
                     Figure(per_million(cheapest.cost_per_million_tokens), cheapest.cost_per_million_tokens),
                     Figure(tps(cheapest.output_tokens_per_second_per_gpu), cheapest.output_tokens_per_second_per_gpu),
                     f"{runner.label} ({per_million(runner.cost_per_million_tokens)})" if runner else "-",
                     Figure(_margin(item), margin)))
    return Table(("Target tok/s/user", "From", "Cheapest", "$/M tokens", "output tok/s per GPU", "Runner-up",
                  "Margin"), rows)


def _margin(item: TargetAnswer) -> str:
    if item.margin is None:
        return "-"
    share = item.margin_share
    return f"+{per_million(item.margin)}" + (f" (+{share:.0%})" if share is not None else "")


def target_lines(group: FrontierGroup) -> list[tuple[str, str]]:
    """The headline lines of a group: (lead, text), one per target."""
    lines = []
    for item in group.answers:
        lead = f"{group.name} at >= {_toks(item.target)} tokens/s per user"
        cheapest, runner = item.cheapest, item.runner_up
        if cheapest is None:
            best = item.best_reached
            lines.append((lead, f"not reached: best {_toks(best)} tok/s/user" if best is not None
                          else "no priced curve reaches it"))
            continue
        text = f"cheapest {cheapest.label} at {per_million(cheapest.cost_per_million_tokens)}/M output tokens"
        text += (f"; runner-up {runner.label} at {per_million(runner.cost_per_million_tokens)} ({_margin(item)})"
                 if runner else "; no runner-up reaches it")
        lines.append((lead, text))
    return lines


def headlines(report: Report) -> list[tuple[str, str]]:
    """The report's headline findings, the cost-at-target lines of every group after each model's line."""
    lines = fmt.headlines(report)
    answers = [line for group in report.frontiers for line in target_lines(group)]
    models = len(report.models)
    return lines[:models] + answers + lines[models:]


def setup_notes(group: FrontierGroup) -> list[str]:
    """What each curve's costs leave out: the setup minutes its session paid once, and their cost."""
    notes = []
    for curve in group.curves:
        if curve.setup_seconds is None:
            continue
        cost = curve.setup_cost
        notes.append(f"{curve.label}: setup {curve.setup_seconds / 60:.1f} min (provision, SSH, runtime setup, "
                     f"model pull), paid once per session" + (f": ${cost:.4f} at {curve.price_per_hour:.3f} $/h"
                                                              if cost is not None else ""))
    return notes


def _describe(curve: Curve, point: FrontierPoint) -> str:
    load = f"c{point.concurrency}" if point.concurrency else f"r{point.rate:g}/s" if point.rate else "one load"
    return (f"{curve.label} at {load}: {tps(point.output_tokens_per_second_per_gpu)} output tok/s per GPU, "
            f"{tps(point.tpot_interactivity)} tok/s per user, {per_million(point.cost_per_million_tokens)}/M tokens")


def _load(point: FrontierPoint) -> str:
    return f"c{point.concurrency}" if point.concurrency else f"r{point.rate:g}/s" if point.rate else ""


def curve_points(group: FrontierGroup, kind: str) -> tuple[dict[str, list[Point]], list[Point], dict[str, str]]:
    """(joined points by curve label, faint points, colours) of ``kind`` ``throughput`` or ``cost``."""
    lines: dict[str, list[Point]] = {}
    faint: list[Point] = []
    colors = {curve.label: PALETTE[index % len(PALETTE)] for index, curve in enumerate(group.curves)}
    for curve in group.curves:
        frontier = curve.throughput_frontier if kind == "throughput" else curve.cost_frontier
        value = (lambda p: p.output_tokens_per_second_per_gpu) if kind == "throughput" \
            else (lambda p: p.cost_per_million_tokens)
        kept = {id(point) for point in frontier}
        lines[curve.label] = [Point(x=p.tpot_interactivity or 0.0, y=value(p) or 0.0, series=curve.label,
                                    label=_load(p), title=_describe(curve, p)) for p in frontier]
        faint += [Point(x=p.tpot_interactivity, y=value(p) or 0.0, series=curve.label, title=_describe(curve, p))
                  for p in curve.points if id(p) not in kept and p.tpot_interactivity and value(p) is not None]
    return {label: points for label, points in lines.items() if points}, faint, colors


# ------------------------------------------------------------------- exports

#: The columns of ``gpubench export --points``: the curve's identity, then every FrontierPoint field.
POINT_COLUMNS = ("model", "workload", "gpu", "provider", "runtime", "on_frontier", "source",
                 *FrontierPoint.model_fields)


def point_rows(report: Report) -> list[dict[str, Any]]:
    """Every point of every curve of ``report``, with ``on_frontier`` (not dominated on throughput)."""
    rows = []
    for group in report.frontiers:
        for curve in group.curves:
            kept = {id(point) for point in curve.throughput_frontier}
            for point in curve.points:
                rows.append({"model": group.model, "workload": group.workload_label, "gpu": curve.gpu,
                             "provider": curve.provider, "runtime": curve.runtime,
                             "on_frontier": id(point) in kept, "source": curve.source,
                             **point.model_dump(mode="json")})
    return rows


def write_points(report: Report, fmt: str, out: IO[str]) -> int:
    """Write :func:`point_rows` to ``out`` as ``json`` (a list of objects) or ``csv``; returns how many."""
    rows = point_rows(report)
    if fmt == "json":
        json.dump(rows, out, indent=2)
        out.write("\n")
    else:
        writer = csv.DictWriter(out, fieldnames=POINT_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: "" if row.get(key) is None else row[key] for key in POINT_COLUMNS} for row in rows)
    return len(rows)


# ---------------------------------------------------------------------- PNG


def _file_name(group: FrontierGroup, kind: str, index: int) -> str:
    """``frontier-01-qwen2-7b-throughput.png``: numbered, so two models whose names read alike never share one."""
    slug = re.sub(r"[^a-z0-9]+", "-", group.model.lower()).strip("-")[:40] or "model"
    return f"frontier-{index:02d}-{slug}-{kind}.png"


def write_pngs(report: Report, directory: Path) -> list[Path] | None:
    """One PNG per frontier chart in ``directory`` (matplotlib, Agg backend); None when matplotlib is
    not installed. Only files named ``frontier-*.png`` in ``directory`` are written."""
    try:
        # The object API on the Agg canvas: no pyplot, no global backend switch, no window, files only.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as PlotFigure
    except ImportError:
        return None
    written = []
    for index, group in enumerate(report.frontiers, 1):
        for kind, label in (("throughput", THROUGHPUT_LABEL), ("cost", COST_LABEL)):
            lines, faint, colors = curve_points(group, kind)
            if not lines:
                continue
            figure = PlotFigure(figsize=(8, 5), dpi=120)
            FigureCanvasAgg(figure)
            axes = figure.subplots()
            for series, points in lines.items():
                axes.plot([p.x for p in points], [p.y for p in points], marker="o", color=colors[series],
                          label=series)
            for point in faint:
                axes.scatter([point.x], [point.y], color=colors[point.series], alpha=0.3)
            axes.set_xlabel(INTERACTIVITY_LABEL)
            axes.set_ylabel(label)
            axes.set_title(f"{group.name}: {label}")
            axes.set_xlim(left=0)
            if kind == "throughput":
                axes.set_ylim(bottom=0)
            axes.grid(True, alpha=0.3)
            axes.legend(fontsize="small")
            figure.tight_layout()
            path = directory / _file_name(group, kind, index)
            figure.savefig(path, format="png")
            written.append(path)
    return written
