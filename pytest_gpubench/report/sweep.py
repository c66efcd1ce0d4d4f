"""The report's latency views: a percentile table per cell, load sweeps and saturation sweeps.

* :func:`percentile_table`: TTFT, TPOT, ITL and end-to-end latency at p50/p95/p99
  of one result, the figures :mod:`.figures` reads from its details.
* :func:`sweeps`: the GPU x model pairs measured at more than one load (a
  ``concurrency: [1, 4, 8]`` or ``rate`` sweep), one line per provider (and kind of
  load) through its loads in order; :func:`sweep_table` lists them and the HTML
  report draws each as a latency-against-throughput chart.

The saturation sweeps (``rate: sweep`` cells, docs/workloads.md):

* :func:`saturated`: the results that carry a sweep, highest ``max_rate_meeting_slo``
  first (the "Saturation" leaderboard);
* :func:`saturation_table`: one answer row per such cell: the rate, the output
  throughput and $/M tokens there, the goal and the SLO;
* :func:`steps_table`: a cell's steps, the probe first, then by offered rate; the
  HTML report draws them as a latency-against-throughput line (:func:`step_points`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from .model import Report, ResultRow
from .tables import Figure, Table, ms, per_million, tps

__all__ = ["PERCENTILES", "SATURATION_INTRO", "Sweep", "ms_figure", "percentile_table", "saturated", "saturation_table",
           "step_points", "steps_table", "sweep_table", "sweeps"]

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


# -------------------------------------------------------- saturation sweeps

SATURATION_INTRO = ("Cells with a saturation sweep (`rate: sweep`), highest max_rate_meeting_slo first: the "
                    "highest offered request rate whose goodput_share met the goal under the SLO, and the output "
                    "throughput and $/M tokens measured at that rate (docs/metrics.md).")


def saturated(report: Report) -> list[ResultRow]:
    """Results with a sweep, by ``max_rate_meeting_slo`` (None last), then GPU, provider, model."""
    rows = [row for row in report.results if row.saturation is not None]
    return sorted(rows, key=lambda r: (-(r.figures.get("max_rate_meeting_slo") or -1.0), r.gpu, r.provider, r.model))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rate(value: Any) -> Figure:
    number = _number(value)
    return Figure(f"{number:g}" if number is not None else "-", number)


def _share(value: Any) -> Figure:
    number = _number(value)
    return Figure(f"{number:.1%}" if number is not None else "-", number)


def _slo_text(slo: Any) -> str:
    if not isinstance(slo, dict):
        return "-"
    return " ".join(f"{key}<={value:g}" for key, value in slo.items() if _number(value) is not None) or "-"


def saturation_table(rows: list[ResultRow]) -> Table:
    """The answer of each sweep: ``max rate/s`` (max_rate_meeting_slo), and the figures at that rate."""
    body = []
    for row in rows:
        sweep = row.saturation or {}
        output = _number(sweep.get("output_tokens_per_second"))
        cost = _number(sweep.get("cost_per_million_tokens"))
        body.append((row.machine, row.model, _rate(sweep.get("max_rate_meeting_slo")),
                     Figure(tps(output), output),
                     Figure(per_million(cost), cost), f"goodput_share >= {sweep.get('goal', 0):g}",
                     _slo_text(sweep.get("slo")), str(len(sweep.get("steps") or [])),
                     str(sweep.get("stop_reason") or "-")))
    return Table(("GPU / provider (/ runtime)", "Model", "max rate/s", "output tok/s", "$/M tokens", "goal", "SLO", "steps",
                  "stopped"), body)


def _steps(row: ResultRow) -> list[dict[str, Any]]:
    steps = [s for s in (row.saturation or {}).get("steps") or [] if isinstance(s, dict)]
    return sorted(steps, key=lambda s: (s.get("kind") != "probe", _number(s.get("rate")) or 0.0))


def steps_table(row: ResultRow) -> Table:
    """Every step of one sweep: offered and achieved rate, goodput, throughput, TTFT and TPOT."""
    body = []
    for step in _steps(row):
        load = f"c{step.get('concurrency')}" if step.get("kind") == "probe" else _rate(step.get("rate")).text
        met = {True: "yes", False: "no"}.get(step.get("met"), "-")
        output = _number(step.get("output_tokens_per_second"))
        achieved = _number(step.get("request_throughput_rps"))
        achieved_text = f"{achieved:.2f}" if achieved is not None else "-"
        body.append((str(step.get("kind", "")), load, Figure(achieved_text, achieved),
                     _share(step.get("goodput_share")), Figure(tps(output), output),
                     ms_figure(step.get("ttft_p50_ms")), ms_figure(step.get("ttft_p95_ms")),
                     ms_figure(step.get("tpot_p50_ms")), ms_figure(step.get("tpot_p95_ms")), met))
    return Table(("Step", "Offered", "achieved req/s", "goodput", "output tok/s", "TTFT p50 ms", "TTFT p95 ms",
                  "TPOT p50 ms", "TPOT p95 ms", "met goal"), body)


def step_points(row: ResultRow) -> list[tuple[float, float, str, str]]:
    """The rate steps as (output tok/s, TTFT p95 ms, label, title), lowest offered rate first."""
    points = []
    for step in _steps(row):
        rate, output, ttft = _number(step.get("rate")), _number(step.get("output_tokens_per_second")), \
            _number(step.get("ttft_p95_ms"))
        if step.get("kind") != "rate" or rate is None or output is None or ttft is None:
            continue
        share = _share(step.get("goodput_share")).text
        points.append((output, ttft, f"r{rate:g}/s",
                       f"{rate:g} req/s offered: {tps(output)} output tok/s, TTFT p95 {ms(ttft)} ms, goodput {share}"))
    return points
