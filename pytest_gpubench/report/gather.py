"""Markdown and HTML reports from the manifest: what to compare, gathered once.

:func:`build_report` reads runs, cells, results and provisioning attempts of the
manifest and gathers what ``gpubench report`` shows (docs/report.md): the results
to rank, the leaderboards, a table per model, provider head-to-heads, failures by
stage and the money spent, as a :class:`~.model.Report`; :func:`write_reports`
renders it as ``BENCHMARK_REPORT.md`` (:mod:`.markdown`) and ``index.html``
(:mod:`.html`).

The figures are the project's headline ones (docs/metrics.md): ``output tok/s`` is
the machine's **output throughput** (total output tokens / measured duration),
``decode tok/s`` the per-request mean decode rate, and ``$/M tokens`` the
``cost_per_million_tokens`` computed from output throughput. Several runs may
measure the same cell; the latest successful result of each (GPU, provider, model,
load) is the one shown, so a report over all runs reads as "what we know now".
Money comes from the ``attempts`` table, where every rented session is one row
(with session reuse, several cells share one session and only its renting
attempt carries the bill): summing attempts counts each session exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import Stage
from ..cloud.budget import spend_of
from ..figures import FigureSource, figure_values
from ..figures import cost_per_million_tokens
from ..matrix import cells as microbench_spec
from ..matrix.fields import DEFAULT_RUNTIME
from ..matrix.selection import gpus_label
from ..measure.microbench import peaks_for, percent_of_peak
from ..store.base import Store
from ..store.records import CellRecord, ResultRecord, RunRecord
from .comparison import RunComparison
from .frontier import Curve, FrontierGroup, answer, setup_seconds, slo_targets, stored_points
from .html import render_html
from .markdown import render_markdown
from .model import (BestValue, FailureGroup, MachineRow, Matchup, MicrobenchRow, ModelTable, ProviderWins, Report,
                    ResultRow, RunSpend)

__all__ = ["build_report", "write_reports"]

#: Cell statuses whose result is ranked; ``partial`` ones are shown marked.
RANKED_STATUSES = ("success", "partial")
_STAGE_ORDER = {stage.value: index for index, stage in enumerate(Stage)}


def build_report(store: Store, run_ids: Sequence[str] | None = None, *,
                 now: datetime | None = None, targets: Sequence[float] = ()) -> Report:
    """Gather the report of ``run_ids`` (default: every run, most recent first).

    ``now`` (UTC-aware) is when a session still open is counted up to, for runs
    that never finished; default the current time. ``targets``: the interactivities
    (tokens/s per user) the cost-at-target tables answer at; none: the stored SLOs'.
    """
    known = store.run_ids()
    runs = list(run_ids) if run_ids else known
    order = {run_id: known.index(run_id) if run_id in known else len(known) for run_id in runs}
    runs.sort(key=lambda run_id: order[run_id])
    cells = [cell for run_id in runs for cell in store.cells(run_id)]
    benchmarks = {result.id: result for run_id in runs for result in store.results(run_id)}
    candidates = [row for row in (_result_row(cell, benchmarks) for cell in cells) if row is not None]
    results = _latest(candidates, order)
    by_tokens = sorted(results, key=lambda r: (-(r.output_tokens_per_second or 0.0), _tie(r)))
    by_cost = sorted((r for r in results if r.cost_per_million_tokens is not None),
                     key=lambda r: (r.cost_per_million_tokens, _tie(r)))
    models = _model_tables(by_tokens)
    matchups = _matchups(results)
    finished = [cell.completed_at for cell in cells if cell.completed_at]
    return Report(
        manifest=store.location,
        run_ids=runs,
        results=sorted(results, key=_tie),
        replaced=len(candidates) - len(results),
        runs_combined=len({r.run_id for r in results}),
        by_tokens=by_tokens,
        by_cost=by_cost,
        models=models,
        best_value=_best_value(models),
        matchups=matchups,
        provider_wins=_provider_wins(matchups),
        failures=_grouped(c for c in cells if c.status in ("failed", "partial") and c.failure_stage),
        skipped=_grouped(c for c in cells if c.status == "skipped"),
        statuses=dict(sorted(Counter(cell.status for cell in cells).items())),
        runs=[run_spend(store, run_id, now or datetime.now(timezone.utc)) for run_id in runs],
        data_until=max(finished, default=""),
        sandbox_runs=[run_id for run_id in runs if (run := store.run(run_id)) is not None and run.sandbox],
        machines=machines(store, runs),
        microbench=microbench_rows(store, runs, results),
        frontiers=frontier_groups(results, targets),
        targets=tuple(targets),
    )


# ------------------------------------------------------------------- results


def _result_row(cell: CellRecord, benchmarks: dict[str, ResultRecord]) -> ResultRow | None:
    """The cell's result as a row, when the cell ended with one worth ranking."""
    if cell.status not in RANKED_STATUSES:
        return None
    bench = benchmarks.get(cell.benchmark_id or "")
    if bench is None:  # no id on the cell row: its latest stored result
        own = [b for b in benchmarks.values() if b.row_id == cell.row_id]
        bench = max(own, key=lambda b: b.created_at or "", default=None)
    if bench is None:
        return None
    details, result, figures = bench.details, bench.result or {}, bench.figures
    load = details.get("load") or {}
    concurrency = load.get("concurrency") or (result.get("test_config") or {}).get("concurrent_reqs") or None
    validity = details.get("validity") or {}
    tokens, duration = figures.total_tokens, figures.duration_seconds
    per_stream = figures.avg_tokens_per_second or None
    output = tokens / duration if tokens > 0 and duration > 0 else None
    price = bench.price_per_hour or cell.price_per_hour or None
    headline = output if output is not None else per_stream
    # The stored headline figure; the same formula where it could not be stored (no
    # token total: on the per-stream rate; no price on the result: the cell's).
    cost = bench.cost_per_million_tokens if output is not None else None
    if price is None:
        cost = None
    elif not cost and headline:
        cost = cost_per_million_tokens(price, headline)
    gpus = _gpus(details)
    points, source, stop_reason = stored_points(details, price_per_hour=price, gpus=gpus,
                                                output_tokens_per_second=output)
    workload, workload_label = _workload(details)
    return ResultRow(
        run_id=cell.run_id, cell_id=cell.cell_id or cell.row_id, benchmark_id=bench.id,
        gpu=gpus_label(cell.gpu_type, gpus), gpus=gpus, provider=cell.provider, model=cell.model, runtime=_runtime(result, details),
        concurrency=int(concurrency) if concurrency else None, rate=load.get("rate"),
        status=cell.status, output_tokens_per_second=headline, decode_tokens_per_second=per_stream,
        per_stream_only=output is None and per_stream is not None,
        ttft_p50_ms=figures.p50_ttft_ms or None,  # the Go shape writes 0 for "unknown"
        price_per_hour=price, cost_per_million_tokens=cost,
        requests=figures.total_requests, errors=figures.total_errors,
        location=bench.location or "",
        valid=validity.get("valid"), invalid_because="; ".join(validity.get("reasons") or []),
        finished_at=cell.completed_at or bench.created_at or "",
        figures=figure_values(FigureSource(result, details, cell.run_id)),
        saturation=details.get("sweep") if isinstance(details.get("sweep"), dict) else None,
        points=points, points_source=source, stop_reason=stop_reason, workload=workload,
        workload_label=workload_label, setup_seconds=setup_seconds(cell.stage_seconds),
        slo_targets=slo_targets(details),
    )


def _workload(details: dict[str, Any]) -> tuple[str, str]:
    """(key, label) of the workload a result ran: its fingerprint's prompts, max_tokens, prompt
    source and think (not its load, runtime or GPU: those are what a frontier compares)."""
    fields = (details.get("fingerprint") or {}).get("fields")
    if not isinstance(fields, dict) or "prompts" not in fields:
        return "", ""
    key = "|".join(str(fields.get(name)) for name in ("prompts", "max_tokens", "prompt_source", "think"))
    label = f"max_tokens {fields.get('max_tokens')}, prompts {str(fields.get('prompts'))[:8]}"
    if fields.get("prompt_source"):
        label += f" from {str(fields['prompt_source'])[:40]}"
    return key, label


# ----------------------------------------------------------------- frontiers


def frontier_groups(results: Iterable[ResultRow], targets: Sequence[float] = ()) -> list[FrontierGroup]:
    """One group per model and workload, a curve per GPU x provider x runtime with every point of
    its results (the loads of a sweep, or several cells at one load each), and the answer at each
    target: ``targets``, else the interactivities the results' stored SLOs imply (1000 / tpot_ms).
    Results that are not valid GPU figures take no part."""
    grouped: dict[tuple[str, str], dict[tuple[str, str, str], list[ResultRow]]] = {}
    for row in results:
        if row.points and row.valid is not False:
            grouped.setdefault((row.model, row.workload), {}).setdefault(
                (row.gpu, row.provider, row.runtime), []).append(row)
    found = []
    for (model, workload), series in sorted(grouped.items()):
        curves = []
        for (gpu, provider, runtime), rows in sorted(series.items()):
            rows = sorted(rows, key=_tie)
            setups = [row.setup_seconds for row in rows if row.setup_seconds is not None]
            curves.append(Curve(
                gpu=gpu, provider=provider, runtime=runtime, label=rows[0].machine,
                points=[point for row in rows for point in row.points],
                price_per_hour=next((row.price_per_hour for row in rows if row.price_per_hour), None),
                setup_seconds=max(setups) if setups else None,
                stop_reason="; ".join(sorted({row.stop_reason for row in rows if row.stop_reason})),
                source="metrics" if all(row.points_source == "metrics" for row in rows) else "frontier"))
        members = [row for rows in series.values() for row in rows]
        if targets:
            asked = [(target, "--target-interactivity") for target in targets]
        else:
            asked = [(target, f"slo tpot_ms {1000.0 / target:g}")
                     for target in sorted({t for row in members for t in row.slo_targets})]
        found.append(FrontierGroup(model=model, workload=workload, workload_label=members[0].workload_label,
                                   curves=curves, answers=[answer(curves, target, source)
                                                           for target, source in asked]))
    return found


def _gpus(details: dict[str, Any]) -> int:
    """GPUs the cell's server spanned (``details.runtime.gpus``, runtimes/base.py); 1 when not recorded."""
    count = ((details.get("runtime") or {}).get("gpus") or {}).get("count")
    return count if isinstance(count, int) and count > 1 else 1


def _runtime(result: dict[str, Any], details: dict[str, Any]) -> str:
    """The server a result was measured on: ``vllm``, ``vllm (entrypoint)``; Ollama for results
    from before runtimes were recorded (and imports that name none)."""
    name = str((result.get("model") or {}).get("runtime") or DEFAULT_RUNTIME)
    launch = (details.get("runtime") or {}).get("launch") or {}
    return name + (" (entrypoint)" if launch.get("mode") == "entrypoint" else "")


def _latest(rows: list[ResultRow], order: dict[str, int]) -> list[ResultRow]:
    """One result per cell: a successful one before a partial one, then the latest run's
    (``order[run]`` is 0 for the most recent), then the latest finished."""
    newest_first = sorted(rows, key=lambda row: row.finished_at, reverse=True)
    ranked = sorted(newest_first, key=lambda row: (row.status != "success", order.get(row.run_id, 0)))
    chosen: dict[tuple[str, str, str, str, str], ResultRow] = {}
    for row in ranked:
        chosen.setdefault(row.key, row)
    return list(chosen.values())


def _tie(row: ResultRow) -> tuple[str, str, str, str, float, float]:
    return (row.gpu, row.provider, row.model, row.runtime, row.concurrency or 1, row.rate or 0.0)


def _model_tables(by_tokens: list[ResultRow]) -> list[ModelTable]:
    tables = []
    for model in sorted({row.model for row in by_tokens}):
        rows = [row for row in by_tokens if row.model == model]
        priced = [row for row in rows if row.cost_per_million_tokens is not None]
        cheapest = min(priced, key=lambda r: (r.cost_per_million_tokens, _tie(r)), default=None)
        tables.append(ModelTable(model=model, rows=rows, fastest=rows[0], cheapest=cheapest))
    return tables


def _best_value(models: list[ModelTable]) -> BestValue | None:
    """The GPU and provider cheapest per token on the most models (ties: the one that ran fewer)."""
    wins: Counter[tuple[str, str]] = Counter(
        (table.cheapest.gpu, table.cheapest.provider) for table in models if table.cheapest is not None)
    if not wins:
        return None
    ran: dict[tuple[str, str], set[str]] = {}
    for table in models:
        for row in table.rows:
            ran.setdefault((row.gpu, row.provider), set()).add(table.model)
    gpu, provider = min(wins, key=lambda pair: (-wins[pair], len(ran[pair]), pair))
    return BestValue(gpu=gpu, provider=provider, cheapest_on=wins[(gpu, provider)],
                     models=len(ran[(gpu, provider)]))


def _matchups(results: list[ResultRow]) -> list[Matchup]:
    # Providers are compared on the same GPU, model, server and load.
    groups: dict[tuple[str, str, str, str], list[ResultRow]] = {}
    for row in results:
        groups.setdefault((row.gpu, row.model, row.runtime, row.load), []).append(row)
    matchups = []
    for (gpu, model, runtime, load), rows in sorted(groups.items()):
        if len({row.provider for row in rows}) < 2:
            continue
        rows = sorted(rows, key=lambda r: r.provider)
        faster = min(rows, key=lambda r: (-(r.output_tokens_per_second or 0.0), r.provider))
        priced = [r for r in rows if r.cost_per_million_tokens is not None]
        cheaper = min(priced, key=lambda r: (r.cost_per_million_tokens, r.provider)) if priced else None
        matchups.append(Matchup(gpu=gpu, model=model, runtime=runtime, load=load, entries=rows, faster=faster.provider,
                                cheaper=cheaper.provider if cheaper else None))
    return matchups


def _provider_wins(matchups: list[Matchup]) -> list[ProviderWins]:
    providers = sorted({row.provider for m in matchups for row in m.entries})
    return [ProviderWins(provider=p, faster=sum(m.faster == p for m in matchups),
                         cheaper=sum(m.cheaper == p for m in matchups),
                         matchups=sum(any(row.provider == p for row in m.entries) for m in matchups))
            for p in providers]


# ------------------------------------------------------------------ failures


def _grouped(cells: Iterable[CellRecord]) -> list[FailureGroup]:
    """Cells grouped by (stage, message), in stage order, then most frequent first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for cell in cells:
        stage = cell.failure_stage or "unknown"
        message = " ".join((cell.error_message or cell.failure_reason or cell.status).split())
        groups.setdefault((stage, message), []).append(f"{cell.gpu_type} / {cell.provider} / {cell.model}")
    ordered = sorted(groups.items(), key=lambda item: (_STAGE_ORDER.get(item[0][0], len(_STAGE_ORDER)),
                                                       -len(item[1]), item[0]))
    return [FailureGroup(stage=stage, message=message, count=len(names), cells=sorted(set(names)))
            for (stage, message), names in ordered]


# ------------------------------------------------------------------- hardware


def machines(store: Store, run_ids: Sequence[str]) -> list[MachineRow]:
    """The machines of ``run_ids``, by GPU type and provider; the latest session's figures for each.

    System detection records each session's machine once (the store's ``systems``);
    here they become one row per machine: sessions of the same GPU type, provider and
    machine (the offer's machine id, a host's name) whose GPUs, driver, CPU and OS agree fold into one row
    (``sessions`` counts them, the disk figures are the latest session's), and a different machine under the
    same GPU type and provider gets a row of its own (docs/report.md, its Hardware section).
    """
    records = sorted((record for run_id in run_ids for record in store.systems(run_id)),
                     key=lambda record: record.recorded_at or "")
    found: dict[tuple[object, ...], MachineRow] = {}
    for record in records:
        row = MachineRow.of(record)
        earlier = found.get(row.identity)
        found[row.identity] = row if earlier is None else row.model_copy(update={"sessions": earlier.sessions + 1})
    return sorted(found.values(), key=lambda row: (row.gpu_type, row.provider, row.machine, row.gpu_count,
                                                   row.gpu_name))


# -------------------------------------------------------- GPU microbenchmarks


def microbench_rows(store: Store, run_ids: Sequence[str], results: list[ResultRow]) -> list[MicrobenchRow]:
    """The latest figure (``run_ids`` most recent first) of each GPU, provider and figure, with its
    datasheet peak (:mod:`..measure.microbench`) and the GPU's best output tok/s among ``results``
    (docs/hardware.md, "GPU microbenchmarks")."""
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


# ---------------------------------------------------------------------- spend


def run_spend(store: Store, run_id: str, now: datetime) -> RunSpend:
    """Run ``run_id``'s cells and spend; an unfinished run's open sessions count up to ``now``.

    Money is read from the manifest's ``attempts`` table: every rented session is one
    row there (the renting attempt of a shared session carries its whole bill), so the
    sum counts each session once, as the spend cap (``cloud/budget.py``) does. The cells'
    own ``cost_usd`` (each one's share of its session) is kept beside it; a
    run without attempt rows (imported, or older) has only that.
    """
    run = store.run(run_id) or RunRecord(run_id=run_id)
    cells = store.cells(run_id)
    attempts = store.attempts(run_id)
    finished = run.finished_at or ""
    as_of = datetime.fromisoformat(finished) if finished else now
    cells_cost = sum(cell.cost_usd or 0.0 for cell in cells)
    if attempts:
        spent, source = spend_of(attempts, as_of).spent, "attempts"
        sessions = {a.session_id for a in attempts if a.session_id}
        still_open = sum(1 for a in attempts if a.session_id and not a.ended_at)
    else:  # a run from before attempts were kept, or an imported one: the cells' own figures
        spent, source = cells_cost, "cells"
        sessions = {cell.session_id for cell in cells if cell.session_id}
        still_open = 0
    return RunSpend(
        run_id=run_id, started_at=run.started_at or min((c.created_at or "" for c in cells), default=""),
        finished_at=finished, status=run.status or "",
        cells=len(cells), statuses=dict(sorted(Counter(cell.status for cell in cells).items())),
        sessions=len(sessions), spent_usd=spent, cells_cost_usd=cells_cost, spent_from=source,
        open_sessions=still_open, as_of=as_of.isoformat(timespec="seconds"),
    )


# ------------------------------------------------------- the report's files

MARKDOWN_NAME, HTML_NAME, COMPARISON_NAME = "BENCHMARK_REPORT.md", "index.html", "comparison.json"


def write_reports(report: Report, directory: Path, comparison: RunComparison | None = None) -> tuple[Path, Path]:
    """Write ``BENCHMARK_REPORT.md`` and ``index.html`` into ``directory`` (made if missing); with
    ``comparison`` (``gpubench report --compare``), both open with its section and
    ``comparison.json`` (:data:`COMPARISON_NAME`) holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    markdown, html = directory / MARKDOWN_NAME, directory / HTML_NAME
    markdown.write_text(render_markdown(report, comparison), encoding="utf-8")
    html.write_text(render_html(report, comparison), encoding="utf-8")
    if comparison is not None:
        (directory / COMPARISON_NAME).write_text(comparison.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return markdown, html
