"""``gpubench report --compare``: two runs, or two stores, side by side.

Each side is read as :func:`.gather.build_report` reads a store (the latest successful result of
each cell among the side's runs). A cell is the same on both sides when its GPU, provider, model,
runtime and load agree and the two results measured the same workload: their fingerprints agree
on everything but the server's version and launch arguments
(:func:`~pytest_gpubench.measure.compare.workload_differs`), which is what such a comparison is
for ("did the new vLLM make us faster") and is shown beside the cell. For each headline figure
(:data:`~pytest_gpubench.measure.compare.COMPARED`) the delta B - A, absolute and in percent of A,
and whether it is beyond the runs' own spread: the 95% confidence intervals of the two means over
repeated runs (``runs: N``) overlap ("within noise") or not ("faster, beyond the spread"). Per-run
values are the result's ``details["runs"]`` (output tok/s, TTFT p50; $/M tokens from them and the
price) and, for the other latency percentiles, its stored requests grouped by run. Cells measured
on one side only, or with another workload, are listed as such. docs/report.md, "Comparing two runs".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..figures import FIGURES, cost_per_million_tokens
from ..measure.compare import (COMPARED, FigureDelta, Fingerprint, figure_delta, server_changes, spread_of,
                               stored_fingerprint, workload_differs)
from ..measure.metrics import detailed_metrics
from ..measure.repeats import RUN_STRIDE
from ..remote.readings import RequestRecord
from ..store.base import Store
from ..store.records import ResultRecord
from . import tables as fmt
from .model import ResultRow

__all__ = ["CellComparison", "Incomparable", "RunComparison", "compare_sides", "comparison_intro",
           "comparison_table", "comparison_text", "one_sided_lines"]

#: Figures whose per-run values are read from the stored requests, grouped by run.
_FROM_REQUESTS = ("ttft_p95_ms", "tpot_p50_ms")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class CellComparison(_Frozen):
    """One cell measured on both sides: its figures' deltas."""

    cell: str
    runs_a: int
    runs_b: int
    #: What changed in the server (``runtime vllm 0.6.3 -> vllm 0.7.0``); "" when nothing did.
    server_change: str = ""
    figures: list[FigureDelta]


class Incomparable(_Frozen):
    """A cell on both sides whose results measured another workload, and why."""

    cell: str
    why: str


class RunComparison(_Frozen):
    """Side A (before) against side B (after)."""

    a: str
    b: str
    cells: list[CellComparison]
    only_a: list[str] = []
    only_b: list[str] = []
    incomparable: list[Incomparable] = []

    def nothing_in_common(self) -> str:
        """The message when no cell can be compared: what each side has."""
        def listed(names: list[str]) -> str:
            return "; ".join(names[:6]) + (f" (and {len(names) - 6} more)" if len(names) > 6 else "") or "none"

        a_cells = self.only_a + [i.cell for i in self.incomparable]
        b_cells = self.only_b + [i.cell for i in self.incomparable]
        why = "".join(f"; {i.cell}: {i.why}" for i in self.incomparable[:3])
        return (f"nothing in common to compare between {self.a} and {self.b}: {self.a} has "
                f"{len(a_cells)} measured cell(s) ({listed(a_cells)}), {self.b} has {len(b_cells)} "
                f"({listed(b_cells)}){why}")


class _Side:
    """One side's measured cells, with what a comparison needs of each."""

    def __init__(self, store: Store, rows: Sequence[ResultRow]) -> None:
        self.store = store
        self.rows = {row.key: row for row in rows}

    def record(self, row: ResultRow) -> ResultRecord | None:
        return self.store.result(row.benchmark_id)

    def per_run(self, row: ResultRow, record: ResultRecord | None) -> tuple[int, dict[str, list[float | None]]]:
        """How many runs the result summarises, and the compared figures' values per run."""
        details = record.details if record else {}
        runs = [run for run in details.get("runs") or [] if isinstance(run, dict)]
        stats = details.get("run_statistics") or {}
        count = max(len(runs), int(stats.get("n") or 0), 1)
        if count < 2 or not runs:
            return count, {}
        output = [_positive(run.get("output_tokens_per_second")) for run in runs]
        values: dict[str, list[float | None]] = {
            "output_tokens_per_second": output,
            "ttft_p50_ms": [_positive(run.get("ttft_p50_ms")) for run in runs],
        }
        if row.price_per_hour:
            values["cost_per_million_tokens"] = [cost_per_million_tokens(row.price_per_hour, tps) if tps else None
                                                 for tps in output]
        if record is not None:
            values.update(_from_requests(self.store.requests(record.id), runs))
        return count, values


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _from_requests(records: list[RequestRecord], runs: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """TTFT p95 and TPOT p50 of each run, from its own requests (request indexes of run k start at
    k x RUN_STRIDE, measure/repeats.py) over its own measured duration."""
    if not records:
        return {}
    grouped: dict[int, list[RequestRecord]] = {}
    for record in records:
        grouped.setdefault(record.index // RUN_STRIDE, []).append(record)
    values: dict[str, list[float | None]] = {name: [] for name in _FROM_REQUESTS}
    for run in runs:
        index, duration = run.get("run_index"), run.get("duration_seconds")
        own = grouped.get(index) if isinstance(index, int) else None
        metrics = detailed_metrics(own, float(duration)) if own and _positive(duration) else None
        for name in _FROM_REQUESTS:
            values[name].append(getattr(metrics, name, None) if metrics else None)
    return values


def _cell_name(row: ResultRow) -> str:
    return f"{row.model} on {row.label}"


def _fingerprint(record: ResultRecord | None) -> Fingerprint | None:
    return stored_fingerprint({"benchmark": {"details": record.details}}) if record else None


def compare_sides(store_a: Store, rows_a: Sequence[ResultRow], store_b: Store, rows_b: Sequence[ResultRow], *,
                  label_a: str, label_b: str) -> RunComparison:
    """Compare side A's measured cells (``rows_a``, a :class:`~.model.Report`'s ``results`` of
    ``store_a``) with side B's; ``label_a``/``label_b`` name the sides in every text."""
    a, b = _Side(store_a, rows_a), _Side(store_b, rows_b)
    cells, incomparable = [], []
    for key in sorted(a.rows.keys() & b.rows.keys()):
        row_a, row_b = a.rows[key], b.rows[key]
        record_a, record_b = a.record(row_a), b.record(row_b)
        print_a, print_b = _fingerprint(record_a), _fingerprint(record_b)
        why = workload_differs(print_a, print_b)
        if why:
            incomparable.append(Incomparable(cell=_cell_name(row_b), why=why))
            continue
        runs_a, values_a = a.per_run(row_a, record_a)
        runs_b, values_b = b.per_run(row_b, record_b)
        figures = []
        for name in COMPARED:
            if name not in FIGURES:
                continue  # a figure this version does not register
            value_a, value_b = row_a.figures.get(name), row_b.figures.get(name)
            if value_a is None and value_b is None:
                continue
            figures.append(figure_delta(name, value_a, value_b, runs_a=runs_a, runs_b=runs_b,
                                        spread_a=spread_of(values_a.get(name, ())),
                                        spread_b=spread_of(values_b.get(name, ()))))
        cells.append(CellComparison(cell=_cell_name(row_b), runs_a=runs_a, runs_b=runs_b,
                                    server_change=server_changes(print_a, print_b), figures=figures))
    return RunComparison(
        a=label_a, b=label_b, cells=cells, incomparable=incomparable,
        only_a=[_cell_name(a.rows[key]) for key in sorted(a.rows.keys() - b.rows.keys())],
        only_b=[_cell_name(b.rows[key]) for key in sorted(b.rows.keys() - a.rows.keys())])


# ------------------------------------------------------------------ rendering


def comparison_intro(comparison: RunComparison) -> str:
    """The sentence above the table: what A and B are and how a verdict is reached."""
    return (f"A = {comparison.a}, B = {comparison.b}. Delta = B - A (and in percent of A). A delta is beyond the "
            "spread when the 95% confidence intervals of the two means over repeated runs (shown in brackets) do "
            "not overlap; without repeats on both sides the spread is unknown.")


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return FIGURES[name].pattern.format(value) if "{:" in FIGURES[name].pattern else f"{value:g}"


def _with_spread(name: str, value: float | None, spread: Any) -> fmt.Figure:
    text = _value(name, value)
    if spread is not None:
        text += f" [{_value(name, spread.low)}-{_value(name, spread.high)}]"
    return fmt.Figure(text, value)


def comparison_table(comparison: RunComparison) -> fmt.Table:
    """One row per cell and compared figure, the same in Markdown and HTML."""
    rows: list[tuple[fmt.Value, ...]] = []
    for cell in comparison.cells:
        name = cell.cell + (f" ({cell.server_change})" if cell.server_change else "")
        for delta in cell.figures:
            change = fmt.Figure(_signed(delta.figure, delta.delta), delta.delta)
            percent = fmt.Figure("-" if delta.delta_pct is None else f"{delta.delta_pct:+.1f}%", delta.delta_pct)
            rows.append((name, FIGURES[delta.figure].header, f"{cell.runs_a} / {cell.runs_b}",
                         _with_spread(delta.figure, delta.a, delta.spread_a),
                         _with_spread(delta.figure, delta.b, delta.spread_b), change, percent, delta.verdict))
    return fmt.Table(header=("cell", "figure", "runs A / B", "A", "B", "delta", "delta %", "verdict"), rows=rows)


def _signed(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    text = _value(name, abs(value))
    return ("+" if value >= 0 else "-") + text


def one_sided_lines(comparison: RunComparison) -> list[str]:
    """The cells that could not be compared, one line each."""
    return ([f"only in A: {cell}" for cell in comparison.only_a]
            + [f"only in B: {cell}" for cell in comparison.only_b]
            + [f"not comparable: {item.cell}: {item.why}" for item in comparison.incomparable])


def comparison_text(comparison: RunComparison) -> str:
    """What the terminal shows: the section as a plain-text table (Markdown's without its escapes)."""
    table = comparison_table(comparison)
    widths = [max([len(title), *(len(str(row[i])) for row in table.rows)]) for i, title in enumerate(table.header)]

    def line(values) -> str:
        return "  ".join(str(value).ljust(width) for value, width in zip(values, widths, strict=True)).rstrip()

    lines = [f"Comparison: {comparison_intro(comparison)}", ""]
    if table.rows:
        lines += [line(table.header), line("-" * width for width in widths), *map(line, table.rows), ""]
    return "\n".join(lines + one_sided_lines(comparison)).rstrip()
