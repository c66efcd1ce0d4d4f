"""The report's latency views: a percentile table per cell, and load sweeps.

* :func:`percentile_table`: TTFT, TPOT, ITL and end-to-end latency at p50/p95/p99
  of one result, the figures :mod:`.figures` reads from its details.
* :func:`sweeps`: the GPU x model pairs measured at more than one load (a
  ``concurrency: [1, 4, 8]`` or ``rate`` sweep), one line per provider (and kind of
  load) through its loads in order; :func:`sweep_table` lists them and the HTML
  report draws each as a latency-against-throughput chart.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .model import Report, ResultRow
from .tables import Figure, Table, ms, tps

__all__ = ["PERCENTILES", "Sweep", "ms_figure", "percentile_table", "sweep_table", "sweeps"]

#: The rows of a percentile table: (label, figure name prefix in :mod:`.figures`).
PERCENTILES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("e2e latency", "e2e"))
_LEVELS = ("p50", "p95", "p99")


def ms_figure(value: object) -> Figure:
    """A latency in ms as a table figure: whole ms from 10 ms up, one decimal below (``-``: not measured)."""
    number = float(value) if isinstance(value, (int, float)) else None
    text = ms(number) if number is None or number >= 10 else f"{number:.1f}"
    return Figure(text, number)


def percentile_table(row: ResultRow) -> Table:
    """Rows TTFT, TPOT, ITL, e2e latency; columns p50, p95, p99, in ms (``-`` not measured)."""
    return Table(("Latency", *(f"{level} ms" for level in _LEVELS)),
                 [(label, *(ms_figure(row.figures.get(f"{prefix}_{level}_ms")) for level in _LEVELS))
                  for label, prefix in PERCENTILES])


class Sweep(BaseModel):
    """One GPU and model at several loads: ``lines`` maps a series (a provider, marked
    ``rate`` for open-loop cells) to its results, lowest load first."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    model: str
    lines: dict[str, list[ResultRow]]

    @property
    def name(self) -> str:
        return f"{self.gpu} / {self.model}"


def _load_order(row: ResultRow) -> tuple[int, float]:
    return (0, float(row.concurrency or 1)) if row.rate is None else (1, row.rate)


def sweeps(report: Report) -> list[Sweep]:
    """Every GPU x model with a series measured at two loads or more, sorted by GPU then model."""
    groups: dict[tuple[str, str], dict[str, list[ResultRow]]] = {}
    for row in report.results:
        series = row.provider + (f" / {row.served_by}" if row.served_by else "") + (" (rate)" if row.rate is not None else "")
        groups.setdefault((row.gpu, row.model), {}).setdefault(series, []).append(row)
    found = []
    for (gpu, model), lines in sorted(groups.items()):
        if max(len(rows) for rows in lines.values()) < 2:
            continue
        found.append(Sweep(gpu=gpu, model=model,
                           lines={series: sorted(rows, key=_load_order) for series, rows in sorted(lines.items())}))
    return found


def sweep_table(sweep: Sweep) -> Table:
    """A row per load of each series: throughput and latency side by side."""
    rows = []
    for series, results in sweep.lines.items():
        for r in results:
            rows.append((series, r.load, Figure(tps(r.output_tokens_per_second), r.output_tokens_per_second),
                         Figure(tps(r.decode_tokens_per_second), r.decode_tokens_per_second),
                         ms_figure(r.figures.get("ttft_p50_ms")), ms_figure(r.figures.get("e2e_p50_ms")),
                         ms_figure(r.figures.get("e2e_p99_ms"))))
    return Table(("Provider", "Load", "output tok/s", "decode tok/s", "TTFT p50 ms", "e2e p50 ms", "e2e p99 ms"),
                 rows)
