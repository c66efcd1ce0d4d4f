"""The HTML report's charts, drawn here as inline SVG: no script library, no fetch,
so the page works offline and looks the same in every browser.

* :func:`bar_chart`: horizontal bars, one per GPU and provider (tokens/s of a model);
* :func:`scatter_chart`: one point per result ($/M tokens against tokens/s), a colour
  per series (a provider), each point labelled (GPU, provider, model), with a legend.
  Costs spread over orders of magnitude (a 1.5B model on a cheap card against a 70B
  one on an H200), so the y axis turns logarithmic when the largest value is more
  than :data:`LOG_SPREAD` times the smallest;
* :func:`line_chart`: a latency-against-throughput curve per series over a load sweep
  (:mod:`.sweep`), and the frontiers (:mod:`.frontier_view`): each curve's non-dominated
  points joined, its dominated points drawn light and joined to nothing (``faint``).

A provider has the same colour in every chart of every report
(:func:`provider_color`). Axis titles sit outside the tick labels, however wide they
are. Every label is escaped; each bar and point carries a ``<title>`` (the
browser's own tooltip) with its figures.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["PALETTE", "PROVIDER_COLORS", "Bar", "Point", "bar_chart", "line_chart", "nice_ticks", "provider_color",
           "scatter_chart"]

#: Okabe-Ito's colour-blind safe palette, then a few more distinct ones.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F")
LOG_SPREAD = 20.0
_WIDTH, _LABEL_W, _VALUE_W, _ROW_H = 760, 240, 110, 24
#: Chart text is 12px; a character of a tick label is at most this wide (digits, '.', 'e').
_CHAR_W = 7.5
_TICK_GAP, _TITLE_GAP = 6, 10

#: The providers GPU Shopper rents from (internal/provider), each always in its colour.
PROVIDER_COLORS = {"vastai": "#0072B2", "tensordock": "#E69F00", "bluelobster": "#009E73",
                   "runpod": "#D55E00", "lambdalabs": "#CC79A7", "lambda": "#CC79A7"}
#: Colours for any other provider, chosen by a hash of its name (never one of the above).
_FALLBACK = ("#56B4E9", "#8C564B", "#7F7F7F", "#000000", "#B8860B", "#6A3D9A", "#1B9E77", "#E7298A")


def provider_color(provider: str) -> str:
    """The colour of ``provider`` in every report: fixed for the known ones, else by a
    stable hash of its normalised name (the same on every machine and run)."""
    key = re.sub(r"[^a-z0-9]", "", provider.lower())
    if key in PROVIDER_COLORS:
        return PROVIDER_COLORS[key]
    return _FALLBACK[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(_FALLBACK)]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str  # the value as shown at the bar's end
    title: str  # the tooltip
    color: str = PALETTE[0]
    muted: bool = False  # a partial or invalid figure: drawn light


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    series: str
    title: str
    label: str = ""  # drawn next to the point
    color: str = ""  # default: the chart's colour of its series


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Ticks from 0 to at least ``high`` at a 1, 2 or 5 step."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks, value = [], 0.0
    while True:
        ticks.append(round(value, 10))
        if value >= high:
            return ticks
        value += step


def _log_ticks(low: float, high: float) -> list[float]:
    """1, 2, 5 x powers of ten covering ``low``..``high``."""
    start, stop = math.floor(math.log10(low)), math.ceil(math.log10(high))
    candidates = [m * 10.0 ** e for e in range(start, stop + 1) for m in (1, 2, 5)]
    below = [t for t in candidates if t <= low]
    above = [t for t in candidates if t >= high]
    first, last = max(below), min(above)
    ticks = [t for t in candidates if first <= t <= last]
    if len(ticks) > 9:  # many decades: powers of ten only, and the ends
        ticks = sorted({first, last, *(t for t in ticks if math.log10(t).is_integer())})
    return ticks


def _number(value: float) -> str:
    return f"{value:g}" if value >= 0.01 or value == 0 else f"{value:.0e}"


def _attr(text: str) -> str:
    return escape(text, quote=True)


def _short(text: str, limit: int = 34) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text_width(text: str) -> float:
    return len(text) * _CHAR_W


def bar_chart(bars: Sequence[Bar], *, name: str, unit: str) -> str:
    """Horizontal bars, longest first as given; ``name`` labels the chart for readers and tests."""
    top = 6
    tick_y = 16  # tick labels' baseline below the plot
    title_y = tick_y + _TITLE_GAP + 12  # the axis title's baseline: a whole line below the ticks
    height = top + _ROW_H * len(bars) + title_y + 6
    plot_w = _WIDTH - _LABEL_W - _VALUE_W
    ticks = nice_ticks(max((b.value for b in bars), default=0.0))
    scale = plot_w / ticks[-1]
    parts = [f'<svg class="chart bar-chart" data-chart="{_attr(name)}" role="img" '
             f'aria-label="{_attr(name)}" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    base = top + _ROW_H * len(bars)
    for tick in ticks:
        x = _LABEL_W + tick * scale
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{base + tick_y}" text-anchor="middle">'
                     f'{_number(tick)}</text>')
    parts.append(f'<text class="axis-label" x="{_LABEL_W + plot_w / 2:.1f}" y="{base + title_y}" '
                 f'text-anchor="middle">{escape(unit)}</text>')
    for index, bar in enumerate(bars):
        y = top + index * _ROW_H
        width = max(bar.value * scale, 1.0)
        parts.append(
            f'<g class="bar-row"><title>{escape(bar.title)}</title>'
            f'<text class="label" x="{_LABEL_W - 8}" y="{y + _ROW_H / 2 + 4:.1f}" '
            f'text-anchor="end">{escape(_short(bar.label))}</text>'
            f'<rect class="bar{" muted" if bar.muted else ""}" x="{_LABEL_W}" y="{y + 4}" width="{width:.1f}" '
            f'height="{_ROW_H - 8}" fill="{_attr(bar.color)}" data-value="{bar.value:.6g}"/>'
            f'<text class="value" x="{_LABEL_W + width + 6:.1f}" y="{y + _ROW_H / 2 + 4:.1f}">'
            f'{escape(bar.text)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


class _Axes:
    """The plot area of an x-y chart and its scales; the left margin fits the widest y tick
    label with the rotated y title left of it, the x title sits a line below the x ticks."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, height: int, right: int,
                 log_y: bool | None = None) -> None:
        self.x_ticks = nice_ticks(max(xs, default=0.0))
        positive = [y for y in ys if y > 0]
        self.log = bool(positive) and (max(positive) / min(positive) > LOG_SPREAD if log_y is None else log_y)
        self.y_ticks = _log_ticks(min(positive), max(positive)) if self.log else nice_ticks(max(ys, default=0.0))
        widest = max((_text_width(_number(t)) for t in self.y_ticks), default=0.0)
        self.title_x = 14  # the rotated y title's centre line
        self.left = int(self.title_x + 8 + _TITLE_GAP + widest + _TICK_GAP)
        self.top, self.width, self.height = 16, _WIDTH, height
        self.tick_y, self.title_y = 16, 16 + _TITLE_GAP + 14
        self.plot_w = self.width - self.left - right
        self.plot_h = height - self.top - self.title_y - 8

    def x(self, value: float) -> float:
        return self.left + value / self.x_ticks[-1] * self.plot_w

    def y(self, value: float) -> float:
        if self.log:
            low, high = math.log10(self.y_ticks[0]), math.log10(self.y_ticks[-1])
            share = (math.log10(value) - low) / (high - low) if high > low else 0.5
        else:
            share = value / self.y_ticks[-1]
        return self.top + self.plot_h - share * self.plot_h

    def draw(self, x_label: str, y_label: str) -> list[str]:
        bottom = self.top + self.plot_h
        parts = []
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(f'<line class="grid" x1="{x:.1f}" y1="{self.top}" x2="{x:.1f}" y2="{bottom}"/>')
            parts.append(f'<text class="tick x-tick" x="{x:.1f}" y="{bottom + self.tick_y}" '
                         f'text-anchor="middle">{_number(tick)}</text>')
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(f'<line class="grid" x1="{self.left}" y1="{y:.1f}" x2="{self.left + self.plot_w}" '
                         f'y2="{y:.1f}"/>')
            parts.append(f'<text class="tick y-tick" x="{self.left - _TICK_GAP}" y="{y + 4:.1f}" '
                         f'text-anchor="end">{_number(tick)}</text>')
        parts.append(f'<text class="axis-label x-title" x="{self.left + self.plot_w / 2:.1f}" '
                     f'y="{bottom + self.title_y}" text-anchor="middle">{escape(x_label)}</text>')
        parts.append(f'<text class="axis-label y-title" transform="translate({self.title_x} '
                     f'{self.top + self.plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" '
                     f'dominant-baseline="central">{escape(y_label + (" (log scale)" if self.log else ""))}</text>')
        return parts


def _legend(series: Sequence[str], colors: dict[str, str], x: float, top: float) -> list[str]:
    parts = []
    for index, name in enumerate(series):
        y = top + 10 + index * 20
        parts.append(f'<g class="legend-item"><circle cx="{x + 20}" cy="{y}" r="5.5" fill="{colors[name]}"/>'
                     f'<text x="{x + 32}" y="{y + 4}">{escape(_short(name, 22))}</text></g>')
    return parts


def _place_labels(points: Sequence[tuple[float, float, str]], bounds: tuple[float, float, float, float],
                  ) -> list[tuple[float, float, str, bool]]:
    """A spot ``(x, y, anchor, leader)`` for each point's label that overlaps no other label
    and no point: beside the point if there is room, else further up or down with a
    leader line back to it (greedy, in the given order). When nothing fits, the
    label goes beside its point anyway."""
    left, top, right, bottom = bounds
    placed: list[tuple[float, float, float, float]] = []
    dots = [(px - 6, py - 6, px + 6, py + 6) for px, py, _ in points]
    spots = []
    for px, py, text in points:
        width, height = _text_width(text) * 0.85, 12.0  # labels are 10px text
        candidates = [(px + 8, py + 4, "start"), (px + 8, py - 8, "start"), (px + 8, py + 16, "start"),
                      (px - 8, py + 4, "end"), (px - 8, py - 8, "end"), (px - 8, py + 16, "end"),
                      (px, py - 12, "middle"), (px, py + 20, "middle")]
        candidates += [(px + side * 14, py + 4 + dy * sign, "start" if side > 0 else "end")
                       for dy in range(24, 157, 12) for sign in (-1, 1) for side in (1, -1)]
        boxes = [_label_box(x, y, anchor, width, height) for x, y, anchor in candidates]
        free = [box[0] >= left and box[2] <= right and box[1] >= top and box[3] <= bottom
                and not any(_overlap(box, other) for other in placed + dots) for box in boxes]
        number = free.index(True) if any(free) else 0
        placed.append(boxes[number])
        spots.append((*candidates[number], number >= 8))
    return spots


def _label_box(x: float, y: float, anchor: str, width: float, height: float) -> tuple[float, float, float, float]:
    x0 = x if anchor == "start" else x - width if anchor == "end" else x - width / 2
    return (x0, y - height + 2, x0 + width, y + 2)


def _label(point: Point, px: float, py: float, spot: tuple[float, float, str, bool]) -> str:
    """The label text at its spot, with a leader line to its point when it sits away from it."""
    lx, ly, anchor, leader = spot
    line = (f'<line class="leader" x1="{px:.1f}" y1="{py:.1f}" x2="{lx:.1f}" y2="{ly - 4:.1f}"/>'
            if leader else "")
    return (f'{line}<text class="point-label" x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">'
            f'{escape(point.label)}</text>')


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def scatter_chart(points: Sequence[Point], *, name: str, x_label: str, y_label: str,
                  colors: dict[str, str] | None = None) -> str:
    """Points coloured by series (``colors``, else the palette in sorted order), each with its
    label beside it, a legend of the series on the right."""
    right, height = 190, 440
    series = sorted({p.series for p in points})
    colors = colors or {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    axes = _Axes([p.x for p in points], [p.y for p in points], height=height, right=right)
    parts = [f'<svg class="chart scatter-chart" data-chart="{_attr(name)}" data-log-y="{str(axes.log).lower()}" '
             f'role="img" aria-label="{_attr(name)}" viewBox="0 0 {axes.width} {height}" width="{axes.width}" '
             f'height="{height}" xmlns="http://www.w3.org/2000/svg">']
    parts += axes.draw(x_label, y_label)
    shown = [p for p in points if p.y > 0]
    located = [(axes.x(p.x), axes.y(p.y), p.label) for p in shown]
    spots = _place_labels(located, (axes.left, axes.top, axes.left + axes.plot_w, axes.top + axes.plot_h))
    labels = [_label(point, px, py, spot)
              for point, (px, py, _), spot in zip(shown, located, spots, strict=True) if point.label]
    for point, (px, py, _) in zip(shown, located, strict=True):
        color = point.color or colors[point.series]
        parts.append(f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="5.5" fill="{_attr(color)}" '
                     f'data-series="{_attr(point.series)}"><title>{escape(point.title)}</title></circle>')
    parts += labels
    parts += _legend(series, colors, axes.left + axes.plot_w, axes.top)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(lines: dict[str, Sequence[Point]], *, name: str, x_label: str, y_label: str,
               colors: dict[str, str], faint: Sequence[Point] = (), log_y: bool | None = False) -> str:
    """One polyline per series through its points in the given order (a load sweep: c1, c2,
    c4 ...), each point labelled (its load), a legend on the right; linear axes from 0
    (``log_y=None``: a log y axis when the values spread more than :data:`LOG_SPREAD`).

    ``faint``: points drawn light and joined to nothing (a frontier's dominated points)."""
    right, height = 170, 360
    everything = [p for points in lines.values() for p in points] + list(faint)
    axes = _Axes([p.x for p in everything], [p.y for p in everything], height=height, right=right, log_y=log_y)
    parts = [f'<svg class="chart line-chart" data-chart="{_attr(name)}" role="img" aria-label="{_attr(name)}" '
             f'viewBox="0 0 {axes.width} {height}" width="{axes.width}" height="{height}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    parts += axes.draw(x_label, y_label)
    for point in faint:
        if point.y > 0 or not axes.log:
            parts.append(f'<circle class="point dominated" cx="{axes.x(point.x):.1f}" cy="{axes.y(point.y):.1f}" '
                         f'r="3.5" fill="{_attr(point.color or colors[point.series])}" fill-opacity="0.3" '
                         f'data-series="{_attr(point.series)}"><title>{escape(point.title)}</title></circle>')
    located_all = []
    for series, points in lines.items():
        located = [(axes.x(p.x), axes.y(p.y)) for p in points]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in located)
        parts.append(f'<polyline class="line" points="{path}" fill="none" stroke="{_attr(colors[series])}" '
                     f'stroke-width="2" data-series="{_attr(series)}"/>')
        located_all += [(x, y, p) for (x, y), p in zip(located, points, strict=True)]
    spots = _place_labels([(x, y, p.label) for x, y, p in located_all],
                          (axes.left, axes.top, axes.left + axes.plot_w, axes.top + axes.plot_h))
    for (x, y, point) in located_all:
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{_attr(colors[point.series])}" '
                     f'data-series="{_attr(point.series)}"><title>{escape(point.title)}</title></circle>')
    parts += [_label(point, x, y, spot) for (x, y, point), spot in zip(located_all, spots, strict=True)
              if point.label]
    parts += _legend(list(lines), colors, axes.left + axes.plot_w, axes.top)
    parts.append("</svg>")
    return "".join(parts)
