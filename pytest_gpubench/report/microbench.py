"""The report's GPU microbenchmarks: each measured figure, its datasheet peak and % of it,
beside the best LLM figure of the same GPU (docs/hardware.md, "GPU microbenchmarks").

* :func:`microbench_rows`: the store's figures of the report's runs, the latest run's per
  GPU, provider and figure, with peaks (:mod:`..measure.gpu_peaks`) and the GPU's best
  output tok/s among the report's results;
* :func:`microbench_table` and :func:`peak_sources`: what both renderers show.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..matrix import cells as microbench_spec
from ..measure.gpu_peaks import peaks_for, percent_of_peak
from ..store.base import Store
from .model import MicrobenchRow, Report, ResultRow
from .tables import Figure, Table, tps

__all__ = ["MICROBENCH_INTRO", "microbench_rows", "microbench_table", "peak_sources"]

MICROBENCH_INTRO = ("What each GPU itself measured with torch (microbench cells): device-to-device copy bandwidth "
                    "and dense matmul throughput per precision, the mean of the timed runs with its 95% confidence "
                    "interval, as a % of the datasheet peak (sources below), beside the best output tok/s the same "
                    "GPU reached in this report (docs/metrics.md).")


def microbench_rows(store: Store, run_ids: Sequence[str], results: list[ResultRow]) -> list[MicrobenchRow]:
    """The latest figure (``run_ids`` most recent first) of each GPU, provider and figure."""
    best: dict[str, ResultRow] = {}
    for row in results:
        held = best.get(row.gpu)
        if row.output_tokens_per_second is not None and (
                held is None or row.output_tokens_per_second > (held.output_tokens_per_second or 0.0)):
            best[row.gpu] = row
    chosen: dict[tuple[str, str, str], MicrobenchRow] = {}
    for run_id in run_ids:
        for record in store.microbench(run_id):
            key = (record.gpu_type or "", record.provider or "", record.label)
            if key in chosen:
                continue  # a more recent run measured it
            peaks = peaks_for(record.gpu_type or "")
            peak = peaks.peak(record.kind, record.precision) if peaks else None
            top = best.get(record.gpu_type or "")
            chosen[key] = MicrobenchRow(
                run_id=run_id, gpu=record.gpu_type or "", provider=record.provider or "", label=record.label,
                unit=record.unit or "", value=record.value, ci_low=record.ci_low, ci_high=record.ci_high,
                runs=record.n, skipped=record.skipped or "", peak=peak,
                percent_of_peak=percent_of_peak(record.value, peak),
                best_llm_tokens_per_second=top.output_tokens_per_second if top else None,
                best_llm=f"{top.model} on {top.provider}" if top else "")
    return sorted(chosen.values(), key=lambda r: (r.gpu, r.provider, _order(r.label)))


def _order(label: str) -> int:
    """Memory first, then the matmul precisions in :data:`~pytest_gpubench.matrix.cells.PRECISIONS`' order."""
    order = ("memory_bandwidth", *(f"matmul_{precision}" for precision in microbench_spec.PRECISIONS))
    return order.index(label) if label in order else len(order)


def _number(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.1f} {unit}"


def microbench_table(report: Report) -> Table:
    """One row per figure: measured (± CI), peak, % of peak, runs, and the GPU's best LLM figure."""
    body = []
    for row in report.microbench:
        if row.value is None:
            measured = Figure(f"skipped: {row.skipped}", None)
        else:
            half = (row.ci_high - row.ci_low) / 2 if row.ci_high is not None and row.ci_low is not None else None
            spread = f" ± {half:,.1f}" if half else ""
            measured = Figure(f"{row.value:,.1f}{spread} {row.unit}", row.value)
        percent = Figure("-" if row.percent_of_peak is None else f"{row.percent_of_peak:.0f}%", row.percent_of_peak)
        llm = Figure(tps(row.best_llm_tokens_per_second) + (f" ({row.best_llm})" if row.best_llm else ""),
                     row.best_llm_tokens_per_second)
        body.append((row.gpu, row.provider, row.label, measured, Figure(_number(row.peak, row.unit), row.peak),
                     percent, Figure(str(row.runs), float(row.runs)), llm))
    return Table(header=("GPU", "Provider", "Figure", "Measured (95% CI)", "Datasheet peak", "% of peak", "Runs",
                         "Best output tok/s on this GPU"), rows=body)


def peak_sources(report: Report) -> list[tuple[str, str]]:
    """``(GPU, source and note)`` of every peak the table used."""
    sources = []
    for gpu in sorted({row.gpu for row in report.microbench}):
        peaks = peaks_for(gpu)
        sources.append((gpu, f"{peaks.source} ({peaks.note})" if peaks else "no datasheet peak known"))
    return sources
