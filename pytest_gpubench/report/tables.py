"""Figures as text and the report's tables, the same in the Markdown and the HTML
report: fixed decimals, so that two reports of the same data are byte for byte the
same and diff well."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from ..cloud.budget import usd
from ..measure.microbench import peaks_for
from .model import FailureGroup, MachineRow, ModelTable, Report, ResultRow

__all__ = [
    "FIGURES", "HARDWARE_INTRO", "MARKS", "MICROBENCH_INTRO", "NO_HARDWARE", "Figure", "Table", "cost_leaderboards",
    "facts", "failure_table", "gpu_label", "hardware_table", "has_loads", "head_to_head_table", "headlines",
    "invalid_notes", "microbench_table", "model_table", "money", "ms", "peak_sources", "per_million", "picks", "price",
    "spend_notes", "spend_table", "tokens_leaderboards", "tps", "tps_marked", "when", "where",
]

#: What each column is (docs/report.md, docs/metrics.md): shown under the tables.
FIGURES = (
    ("output tok/s", "output_tokens_per_second, output throughput: output tokens of the successful measured "
                     "requests / the measured duration, for the whole machine (docs/metrics.md); the ranking figure"),
    ("decode tok/s", "decode_tokens_per_second, the per-request mean decode rate: one stream's speed (the GPU "
                     "Shopper result's avg_tokens_per_second); at concurrency N output throughput is up to N "
                     "times higher"),
    ("$/M tokens", "the headline cost_per_million_tokens: $/h / (output tok/s x 3600) x 1e6"),
    ("$/h", "the offer's price per hour when the session was rented"),
    ("TTFT p50", "median time to first token, in ms, of the successful measured requests"),
    ("TTFT, TPOT, ITL, e2e p50/p95/p99", "the latency percentiles of each cell, in ms: time to first token, "
                                         "time per output token, inter-token latency, end-to-end request latency"),
    ("J/token", "joules_per_output_token: the cell's GPUs' mean power while measured requests ran / output "
                "tok/s (docs/metrics.md, Energy); - where the GPU reported no power"),
    ("Accuracy", "accuracy: the share of the workload's problems with exact answers the model answered right, "
                 "asked after the load (docs/metrics.md, Accuracy); - where the workload asked none"),
    ("requests, errors", "measured requests (warm-up excluded) and the failed ones among them"),
    ("tok/s/user", "interactivity, tpot_interactivity: 1000 / TPOT p50, the tokens/s one user sees (the frontiers' "
                   "x axis and the cost-at-target targets)"),
    ("output tok/s per GPU", "output_tokens_per_second_per_gpu: output throughput / the GPUs the server spanned"),
    ("spend", "price x session lifetime of every session rented, each once (the attempts table); "
              "with session reuse a session is billed once however many cells ran on it"),
)
MARKS = (
    ("(partial)", "the benchmark was interrupted; the figures cover what was measured"),
    ("!", "not a valid GPU figure (the model did not fit in GPU memory, the prompt was truncated, or "
          "token counts disagree): see the reasons in the per-model tables"),
    ("†", "an imported result with no token total or duration: the per-stream rate stands in for "
          "output throughput, and $/M tokens is computed from it"),
)


def tps(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def tps_marked(row: ResultRow) -> str:
    """The ranking figure, with ``!`` (not a valid GPU figure) and ``†`` (per-stream stand-in)."""
    return (tps(row.output_tokens_per_second) + (" !" if row.valid is False else "")
            + (" †" if row.per_stream_only else ""))


def ms(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def price(value: float | None) -> str:
    return f"${value:.3f}" if value is not None else "-"


def per_million(value: float | None) -> str:
    """``$0.18``; four decimals below a dime (sandbox and small models get there)."""
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 0.1 else f"${value:.4f}"


def money(value: float) -> str:
    """Spend, as the run summary and the budget line print it."""
    return usd(value)


def gpu_label(row: ResultRow) -> str:
    """The GPU, marked when its result is partial."""
    return row.gpu + (" (partial)" if row.status == "partial" else "")


def has_runtimes(rows: list[ResultRow]) -> bool:
    """Whether a table needs a runtime column: some result was served by another server than Ollama."""
    return any(row.served_by for row in rows)


def has_loads(rows: list[ResultRow]) -> bool:
    """Whether a table needs a load column: some result ran at another load than concurrency 1."""
    return any(row.load != "c1" for row in rows)


# ------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Figure:
    """A number in a table: its text, and the value a sortable table sorts it by (None: unknown)."""

    text: str
    value: float | None

    def __str__(self) -> str:
        return self.text


Value = str | Figure


@dataclass(frozen=True)
class Table:
    """A table both reports show; cells are text or :class:`Figure`."""

    header: tuple[str, ...]
    rows: list[tuple[Value, ...]]


def _fig(text: str, value: float | None) -> Figure:
    return Figure(text, value)


def _by_model(rows: list[ResultRow]) -> list[tuple[str, list[ResultRow]]]:
    """``rows`` split by model (in order of the models' names), each keeping its order: a ranking
    compares one model's results only (a 1.5B model is no rival of a 7B one)."""
    return [(model, [r for r in rows if r.model == model]) for model in sorted({r.model for r in rows})]


def tokens_leaderboards(report: Report) -> list[tuple[str, list[ResultRow], Table]]:
    """(model, its rows, its table) per model: ranked by output throughput within the model."""
    loads, runtimes = has_loads(report.results), has_runtimes(report.results)
    return [(model, rows, Table(
        ("Rank", "GPU", "Provider", *(["Runtime"] if runtimes else []), *(["Load"] if loads else []),
         "output tok/s", "$/h", "$/M tokens", "Location"),
        [(_fig(str(rank), rank), gpu_label(r), r.provider, *([r.runtime] if runtimes else []),
          *([r.load] if loads else []),
          _fig(tps_marked(r), r.output_tokens_per_second), _fig(price(r.price_per_hour), r.price_per_hour),
          _fig(per_million(r.cost_per_million_tokens), r.cost_per_million_tokens), r.location or "-")
         for rank, r in enumerate(rows, 1)])) for model, rows in _by_model(report.by_tokens)]


def cost_leaderboards(report: Report) -> list[tuple[str, list[ResultRow], Table]]:
    """(model, its rows, its table) per model: ranked by $/M tokens within the model, cheapest first."""
    loads, runtimes = has_loads(report.results), has_runtimes(report.results)
    return [(model, rows, Table(
        ("Rank", "GPU", "Provider", *(["Runtime"] if runtimes else []), *(["Load"] if loads else []),
         "$/M tokens", "output tok/s", "$/h", "Location"),
        [(_fig(str(rank), rank), gpu_label(r), r.provider, *([r.runtime] if runtimes else []),
          *([r.load] if loads else []),
          _fig(per_million(r.cost_per_million_tokens), r.cost_per_million_tokens),
          _fig(tps_marked(r), r.output_tokens_per_second), _fig(price(r.price_per_hour), r.price_per_hour),
          r.location or "-")
         for rank, r in enumerate(rows, 1)])) for model, rows in _by_model(report.by_cost)]


def model_table(table: ModelTable) -> Table:
    loads, runtimes = has_loads(table.rows), has_runtimes(table.rows)
    # Energy where any GPU of the table reported its power; "-" for a cell whose GPU did not (never 0).
    energy = any(r.figures.get("joules_per_output_token") is not None for r in table.rows)
    # Accuracy where any cell of the table asked its problems (workload `accuracy:`).
    accuracy = any(r.figures.get("accuracy") is not None for r in table.rows)
    return Table(
        ("GPU", "Provider", *(["Runtime"] if runtimes else []), *(["Load"] if loads else []), "output tok/s",
         "decode tok/s", "TTFT p50 ms", "$/h", "$/M tokens", *(["J/token"] if energy else []),
         *(["Accuracy"] if accuracy else []), "Requests", "Errors"),
        [(gpu_label(r), r.provider, *([r.runtime] if runtimes else []), *([r.load] if loads else []),
          _fig(tps_marked(r), r.output_tokens_per_second),
          _fig(tps(r.decode_tokens_per_second), r.decode_tokens_per_second),
          _fig(ms(r.ttft_p50_ms), r.ttft_p50_ms), _fig(price(r.price_per_hour), r.price_per_hour),
          _fig(per_million(r.cost_per_million_tokens), r.cost_per_million_tokens),
          *([_fig(joules(r.figures.get("joules_per_output_token")), r.figures.get("joules_per_output_token"))]
            if energy else []),
          *([_fig(share(r.figures.get("accuracy")), r.figures.get("accuracy"))] if accuracy else []),
          _fig(str(r.requests), r.requests), _fig(str(r.errors), r.errors))
         for r in table.rows])


def share(value: float | None) -> str:
    """A fraction 0-1 as a percentage (``80.0%``); "-" where it was not measured."""
    return f"{value:.1%}" if value is not None else "-"


def joules(value: float | None) -> str:
    """Energy per output token; "-": the GPU reported no power (docs/metrics.md, "Energy")."""
    return f"{value:.3f}" if value is not None else "-"


def head_to_head_table(report: Report) -> Table:
    loads = any(m.load != "c1" for m in report.matchups)
    runtimes = has_runtimes([r for m in report.matchups for r in m.entries])
    return Table(
        ("GPU", "Model", *(["Runtime"] if runtimes else []), *(["Load"] if loads else []),
         "output tok/s by provider", "$/h by provider", "$/M tokens by provider", "Faster", "Cheaper"),
        [(m.gpu, m.model, *([m.runtime] if runtimes else []), *([m.load] if loads else []),
          ", ".join(f"{r.provider} {tps_marked(r)}" for r in m.entries),
          ", ".join(f"{r.provider} {price(r.price_per_hour)}" for r in m.entries),
          ", ".join(f"{r.provider} {per_million(r.cost_per_million_tokens)}" for r in m.entries),
          m.faster, m.cheaper or "-") for m in report.matchups])


def failure_table(groups: list[FailureGroup], what: str = "Message") -> Table:
    return Table(("Stage", "Count", what, "Cells"),
                 [(g.stage, _fig(str(g.count), g.count), g.message, "; ".join(g.cells)) for g in groups])


def spend_table(report: Report) -> Table:
    rows: list[tuple[Value, ...]] = [
        (run.run_id, when(run.started_at), run.status or "-", _fig(str(run.cells), run.cells),
         _fig(str(run.sessions), run.sessions), _fig(money(run.spent_usd), run.spent_usd),
         _fig(money(run.cells_cost_usd), run.cells_cost_usd)) for run in report.runs]
    cells_cost = sum(run.cells_cost_usd for run in report.runs)
    rows.append(("Total", "", "", _fig(str(report.cells), report.cells), _fig(str(report.sessions), report.sessions),
                 _fig(money(report.spent_usd), report.spent_usd), _fig(money(cells_cost), cells_cost)))
    return Table(("Run", "Started", "Status", "Cells", "Sessions", "Spend", "Cells' cost"), rows)


# ------------------------------------------------------------------ sentences


def when(text: str) -> str:
    """``2026-11-22 08:47 UTC`` from a stored ISO timestamp ('' stays '')."""
    if not text:
        return ""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def where(row: ResultRow) -> str:
    """``RTX 4090 on vastai`` (``with vllm`` for another runtime than Ollama, ``at c8`` for another
    load than concurrency 1)."""
    return (f"{row.gpu} on {row.provider}" + (f" with {row.served_by}" if row.served_by else "")
            + ("" if row.load == "c1" else f" at {row.load}"))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def facts(report: Report) -> list[tuple[str, str]]:
    """The report's header lines: (label, plain text)."""
    models = sorted({row.model for row in report.results})
    statuses = ", ".join(f"{n} {status}" for status, n in report.statuses.items()) or "none"
    data = (f"{_plural(len(report.results), 'result')} from {report.runs_combined} of "
            f"{_plural(len(report.run_ids), 'run')}")
    if report.data_until:
        data += f", cells finished up to {when(report.data_until)}"
    return [
        ("Data", data),
        ("GPUs", f"{len(report.gpus)} ({', '.join(report.gpus) or 'none'})"),
        ("Models", f"{len(models)} ({', '.join(models) or 'none'})"),
        ("Providers", ", ".join(report.providers) or "none"),
        ("Cells", f"{report.cells} ({statuses})"),
        ("Total spend", f"{money(report.spent_usd)} across {_plural(report.sessions, 'session')}"),
    ]


def headlines(report: Report) -> list[tuple[str, str]]:
    """The headline findings: (bold lead, plain text)."""
    lines = []
    for table in report.models:
        text = f"fastest {where(table.fastest)} ({tps_marked(table.fastest)} output tok/s)"
        if table.cheapest is not None:
            text += (f"; cheapest {where(table.cheapest)} "
                     f"({per_million(table.cheapest.cost_per_million_tokens)}/M tokens)")
        lines.append((table.model, text))
    if report.best_value is not None:
        best = report.best_value
        lines.append(("Best value", f"{best.gpu} on {best.provider}, the lowest $/M tokens on "
                                    f"{best.cheapest_on} of the {_plural(best.models, 'model')} it ran"))
    statuses = report.statuses
    ran = sum(n for status, n in statuses.items() if status in ("success", "partial", "failed"))
    other = [f"{statuses[s]} {s}" for s in ("skipped", "pending", "running") if statuses.get(s)]
    lines.append(("Cells", f"{ran} ran: {statuses.get('success', 0)} succeeded, {statuses.get('partial', 0)} "
                           f"partial, {statuses.get('failed', 0)} failed" + "".join(f"; {o}" for o in other)))
    lines.append(("Total spend", f"{money(report.spent_usd)} across {_plural(report.sessions, 'session')}"))
    for wins in report.provider_wins:
        lines.append((wins.provider, f"in head-to-heads faster in {wins.faster} of {wins.matchups}, "
                                     f"cheaper in {wins.cheaper} of {wins.matchups}"))
    if report.runs_combined > 1 or report.replaced:
        lines.append(("Runs combined", f"{report.runs_combined}: the latest successful result of each cell; "
                                       f"{_plural(report.replaced, 'earlier result')} of the same cells left out"))
    if not report.results:
        lines.append(("Results", "none to rank yet"))
    return lines


def invalid_notes(table: ModelTable) -> list[str]:
    return [f"{where(row)}: {row.invalid_because or 'not a valid GPU figure'}"
            for row in table.rows if row.valid is False]


def picks(table: ModelTable) -> list[tuple[str, str]]:
    found = [("Fastest", f"{where(table.fastest)} ({tps_marked(table.fastest)} output tok/s)")]
    if table.cheapest is not None:
        found.append(("Cheapest", f"{where(table.cheapest)} "
                                  f"({per_million(table.cheapest.cost_per_million_tokens)}/M tokens)"))
    return found


def spend_notes(report: Report) -> list[str]:
    notes = []
    for run in report.runs:
        if run.spent_from == "cells":
            notes.append(f"{run.run_id}: no provisioning attempts recorded (an imported or older run): "
                         f"its spend is the cells' cost")
        if run.open_sessions:
            notes.append(f"{run.run_id}: {_plural(run.open_sessions, 'session')} with no recorded end, counted "
                         f"up to {when(run.as_of)}; gpubench cleanup releases what a dead run left")
    return notes


#: Section texts both reports show under their headings.
TOKENS_INTRO = ("One ranking per model (a model competes only with itself), by output throughput (output tok/s); "
                "ties by GPU, provider, runtime.")
COST_INTRO = ("One ranking per model, by $/M tokens, cheapest first; results without a price are left out. "
              "At one load each: the Frontiers section compares them at the same interactivity.")
HEAD_TO_HEAD_INTRO = "The same GPU and model (and load) measured on more than one provider."
NO_HEAD_TO_HEAD = "No GPU and model was measured on more than one provider."
FAILURES_INTRO = "Failed and partial cells, grouped by stage and message (Count: cells with that message)."
NO_FAILURES = "No cell failed."
SPEND_INTRO = ("Billed session time (price x lifetime, each session once). \"Cells' cost\" sums the cells' own "
               "cost_usd: each cell's share of its session (the time it held it).")


# ------------------------------------------------------------------- hardware

HARDWARE_INTRO = ("The machines measured on, as system detection found them (docs/hardware.md): one row per "
                  "machine, its first GPU's figures; Source says what answered (nvml, nvidia-smi-xml, "
                  "nvidia-smi-csv).")
NO_HARDWARE = "No system was detected in these runs (older runs, imports and endpoints have none)."
GIB = 1024 ** 3


def _number(value: float | None, text: str) -> Figure:
    return Figure(text if value is not None else "-", value)


def _gib(mib: int | None) -> Figure:
    return _number(mib, f"{mib / 1024:.0f}" if mib is not None else "")


def _disk(row: MachineRow) -> str:
    if row.disk_total_bytes is None:
        return "-"
    free = f"{row.disk_free_bytes / GIB:.0f}" if row.disk_free_bytes is not None else "?"
    return f"{free} / {row.disk_total_bytes / GIB:.0f}"


def _gpus(row: MachineRow) -> str:
    return f"{row.gpu_count} x {row.gpu_name}" if row.gpu_count != 1 else row.gpu_name or "-"


def hardware_table(rows: list[MachineRow]) -> Table:
    """GPU and provider, the GPUs with their memory, compute capability, max clocks and power limit,
    driver and CUDA, the host (CPU, RAM, OS, kernel, free / total disk), the source and sessions."""
    body: list[tuple[Value, ...]] = [
        (row.gpu_type, row.provider_label, _gpus(row), _gib(row.memory_mib), row.compute_capability or "-",
         _number(row.sm_clock_max_mhz, str(row.sm_clock_max_mhz)),
         _number(row.mem_clock_max_mhz, str(row.mem_clock_max_mhz)),
         _number(row.power_limit_w, f"{row.power_limit_w:.0f}" if row.power_limit_w is not None else ""),
         row.driver_version or "-", row.cuda_version or "-",
         f"{row.cpu_model or '?'} ({row.cpu_cores} cores)" if row.cpu_cores else (row.cpu_model or "-"),
         _gib(row.ram_mib), row.os or "-", row.kernel or "-", _disk(row), row.source,
         Figure(str(row.sessions), row.sessions))
        for row in rows
    ]
    return Table(("GPU", "Provider", "GPUs", "GPU memory (GiB)", "Compute cap.", "Max SM MHz", "Max memory MHz",
                  "Power limit (W)", "Driver", "CUDA", "CPU", "RAM (GiB)", "OS", "Kernel", "Disk free / total (GiB)",
                  "Source", "Sessions"), body)


# -------------------------------------------------------- GPU microbenchmarks

MICROBENCH_INTRO = ("What each GPU itself measured with torch (microbench cells): device-to-device copy bandwidth "
                    "and dense matmul throughput per precision, the mean of the timed runs with its 95% confidence "
                    "interval, as a % of the datasheet peak (sources below), beside the best output tok/s the same "
                    "GPU reached in this report (docs/metrics.md).")


def _with_unit(value: float | None, unit: str) -> str:
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
        body.append((row.gpu, row.provider, row.label, measured, Figure(_with_unit(row.peak, row.unit), row.peak),
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
