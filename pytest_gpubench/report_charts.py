"""The HTML report's charts, drawn here as inline SVG: no script library, no fetch,
so the page works offline and looks the same in every browser.

* :func:`bar_chart`: horizontal bars, one per GPU and provider (tokens/s of a model);
* :func:`scatter_chart`: one point per result ($/M tokens against tokens/s), a colour
  per model, with a legend. Costs spread over orders of magnitude (a 1.5B model on
  a cheap card against a 70B one on an H200), so the y axis turns logarithmic when
  the largest value is more than :data:`LOG_SPREAD` times the smallest.

Every label is escaped; each bar and point carries a ``<title>`` (the browser's own
tooltip) with its figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["PALETTE", "Bar", "Point", "bar_chart", "nice_ticks", "scatter_chart"]

#: Okabe-Ito's colour-blind safe palette, then a few more distinct ones.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F")
LOG_SPREAD = 20.0
_WIDTH, _LABEL_W, _VALUE_W, _ROW_H = 760, 240, 110, 24


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


def bar_chart(bars: Sequence[Bar], *, name: str, unit: str) -> str:
    """Horizontal bars, longest first as given; ``name`` labels the chart for readers and tests."""
    top, axis_h = 6, 28
    height = top + _ROW_H * len(bars) + axis_h
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
        parts.append(f'<text class="tick" x="{x:.1f}" y="{base + 16}" text-anchor="middle">{_number(tick)}</text>')
    parts.append(f'<text class="axis-label" x="{_LABEL_W + plot_w:.1f}" y="{base + 27}" '
                 f'text-anchor="end">{escape(unit)}</text>')
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


def scatter_chart(points: Sequence[Point], *, name: str, x_label: str, y_label: str) -> str:
    """Points coloured by series (sorted names), a legend on the right."""
    left, right, top, bottom = 70, 190, 16, 52
    width, height = _WIDTH, 420
    plot_w, plot_h = width - left - right, height - top - bottom
    series = sorted({p.series for p in points})
    colors = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    x_ticks = nice_ticks(max((p.x for p in points), default=0.0))
    ys = [p.y for p in points if p.y > 0]
    log = bool(ys) and min(ys) > 0 and max(ys) / min(ys) > LOG_SPREAD
    if log:
        y_ticks = _log_ticks(min(ys), max(ys))
        low, high = math.log10(y_ticks[0]), math.log10(y_ticks[-1])

        def y_of(value: float) -> float:
            share = (math.log10(value) - low) / (high - low) if high > low else 0.5
            return top + plot_h - share * plot_h
    else:
        y_ticks = nice_ticks(max(ys, default=0.0))

        def y_of(value: float) -> float:
            return top + plot_h - value / y_ticks[-1] * plot_h

    def x_of(value: float) -> float:
        return left + value / x_ticks[-1] * plot_w

    parts = [f'<svg class="chart scatter-chart" data-chart="{_attr(name)}" data-log-y="{str(log).lower()}" '
             f'role="img" aria-label="{_attr(name)}" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for tick in x_ticks:
        x = x_of(tick)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 16}" '
                     f'text-anchor="middle">{_number(tick)}</text>')
    for tick in y_ticks:
        y = y_of(tick)
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
    parts.append(f'<text class="axis-label" x="{left + plot_w / 2:.1f}" y="{height - 10}" '
                 f'text-anchor="middle">{escape(x_label)}</text>')
    parts.append(f'<text class="axis-label" transform="translate(16 {top + plot_h / 2:.1f}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_label + (" (log scale)" if log else ""))}</text>')
    for point in points:
        if point.y <= 0:
            continue
        parts.append(f'<circle class="point" cx="{x_of(point.x):.1f}" cy="{y_of(point.y):.1f}" r="5.5" '
                     f'fill="{colors[point.series]}" data-series="{_attr(point.series)}">'
                     f'<title>{escape(point.title)}</title></circle>')
    for index, name_ in enumerate(series):
        y = top + 10 + index * 20
        parts.append(f'<g class="legend-item"><circle cx="{left + plot_w + 20}" cy="{y}" r="5.5" '
                     f'fill="{colors[name_]}"/><text x="{left + plot_w + 32}" y="{y + 4}">'
                     f'{escape(_short(name_, 22))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
