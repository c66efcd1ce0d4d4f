"""The one registry of the figures a cell's result shows: name, definition, unit, source.

Every output that lists a result's figures reads this table: the JUnit properties
(``gpubench_<name>``, ``run/record.py``), the CSV export (a column ``<name>`` each,
``store/export.py``) and the terminal summary's columns (``--gpubench-columns``,
``report/summary_table.py``). Adding a figure is one :class:`Figure` entry here (and its
definition in docs/metrics.md, which ``tests/plugin/test_summary_columns.py`` checks).

The names a person gives figures on the command line are read here too, so that the
option table (``options.py``, a top-level module like this one) checks them without
importing a folder: the summary's columns (:func:`parse_columns`) and the rules of
``--gpubench-compare-fail`` (:func:`parse_compare_fail`, over :data:`METRICS`; the
comparison itself is ``measure/compare.py``). The one cost formula,
:func:`cost_per_million_tokens`, is here as well: the stored headline figure, the
report's fallback and the registry's ``cost_per_million_tokens`` all call it.

A figure is read from the stored result: the GPU Shopper ``BenchmarkResult`` as a
JSON mapping, and the ``details`` mapping (``details_json``: ``metrics`` is
:class:`~pytest_gpubench.measure.metrics.DetailedMetrics` dumped, ``load``,
``run_statistics`` ...). Nothing is computed twice: a figure reads what was
stored, so a cell's JUnit property, its CSV column and its terminal column agree.
A figure that was not measured is ``None``, never 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ALLOWED_COLUMNS", "CELL_COLUMNS", "FIGURES", "METRICS", "Figure", "FigureSource", "Metric", "Rule",
    "cost_per_million_tokens", "figure_values", "output_tokens_per_second", "parse_columns", "parse_compare_fail",
]


def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float | None:
    """USD per million tokens of a GPU at ``price_per_hour`` producing ``tokens_per_second``:
    ``price_per_hour / (tokens_per_second * 3600) * 1e6``; ``None`` without throughput.

    The one cost formula: the stored headline figure
    (:func:`~pytest_gpubench.measure.results.cost_analysis`), the
    report's fallback for a result stored without one, and the figure registry's
    ``cost_per_million_tokens`` all call it.
    """
    if tokens_per_second <= 0:
        return None
    return price_per_hour / (tokens_per_second * 3600.0) * 1e6


@dataclass(frozen=True)
class FigureSource:
    """What a figure is read from: one stored result, its details, and its run."""

    result: Mapping[str, Any]
    details: Mapping[str, Any]
    run_id: str = ""

    @property
    def results(self) -> Mapping[str, Any]:
        return self.result.get("results") or {}

    @property
    def metrics(self) -> Mapping[str, Any]:
        return self.details.get("metrics") or {}


@dataclass(frozen=True)
class Figure:
    """One figure: ``name`` (the same in JUnit, CSV, terminal and docs), the column
    ``header`` the terminal shows, its ``unit``, a one-line ``definition`` and how it
    is read (``read``). ``pattern`` formats it in the terminal; ``digits`` rounds it
    in JUnit properties."""

    name: str
    header: str
    unit: str
    definition: str
    read: Callable[[FigureSource], Any]
    pattern: str = "{:.1f}"
    digits: int = 3

    def value(self, source: FigureSource) -> Any:
        """The figure of ``source``: a finite number, a text, or ``None`` when not measured."""
        try:
            value = self.read(source)
        except (TypeError, ValueError, ZeroDivisionError, AttributeError):
            return None
        if isinstance(value, bool):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _positive(value: Any) -> float | None:
    """The Go result shape writes 0 for "not measured"; a rate or latency of 0 is that."""
    number = _number(value)
    return number if number is not None and number > 0 else None


def output_tokens_per_second(results: Mapping[str, Any]) -> float | None:
    """Output throughput of a PerformanceResults mapping: ``total_tokens / duration_seconds``."""
    tokens, duration = _number(results.get("total_tokens")), _number(results.get("duration_seconds"))
    if tokens is None or not duration or duration <= 0:
        return None
    return tokens / duration


def _tpot_interactivity(source: FigureSource) -> float | None:
    # The headline's figure: the same formula as its frontier point's (measure/frontier.py), read from
    # the headline metrics, so a result stored before frontiers existed has it too.
    tpot = _positive(source.metrics.get("tpot_p50_ms"))
    return 1000.0 / tpot if tpot is not None else None


def _metric(name: str, fallback: str | None = None) -> Callable[[FigureSource], Any]:
    """A DetailedMetrics figure, else (an imported result, an older manifest) the Go field."""

    def read(source: FigureSource) -> Any:
        value = _number(source.metrics.get(name))
        if value is None and fallback is not None:
            value = _positive(source.results.get(fallback))
        return value

    return read


def _cost_per_million(source: FigureSource) -> float | None:
    price, output = _number(source.result.get("price_per_hour")), output_tokens_per_second(source.results)
    if not price or not output:
        return None
    return cost_per_million_tokens(price, output)


def _concurrency(source: FigureSource) -> int | None:
    load = source.details.get("load") or {}
    if load.get("rate") is not None or load.get("sweep") or load.get("trace"):
        return None  # an open-loop (rate, trace) cell, or a sweep of rates, has no fixed concurrency
    value = load.get("concurrency") or (source.result.get("test_config") or {}).get("concurrent_reqs")
    return int(value) if value else None


def _slo(source: FigureSource) -> str | None:
    slo = source.metrics.get("slo")
    if not isinstance(slo, Mapping):
        return None
    parts = [f"{key}<={value:g}" for key, value in slo.items() if isinstance(value, (int, float))]
    return " ".join(parts) or None


def _match_rate(source: FigureSource) -> float | None:
    if not source.results.get("prompts_with_expected"):
        return None  # no prompt expected an answer: nothing was checked
    return _number(source.results.get("match_rate"))


def _energy(key: str) -> Callable[[FigureSource], Any]:
    """A figure of the cell's GPU energy (``details["energy"]``, measure/metrics.py ``Energy``)."""

    def read(source: FigureSource) -> Any:
        return _number((source.details.get("energy") or {}).get(key))

    return read


def _spec_decode(key: str) -> Callable[[FigureSource], Any]:
    """A speculative-decoding figure (``details["spec_decode"]``, measure/spec_decode.py)."""

    def read(source: FigureSource) -> Any:
        return _number((source.details.get("spec_decode") or {}).get(key))

    return read


def _run_statistic(key: str) -> Callable[[FigureSource], Any]:
    def read(source: FigureSource) -> Any:
        stats = source.details.get("run_statistics") or {}
        return stats.get(key) if (stats.get("n") or 0) > 1 else None

    return read


def _ms(name: str, header: str, definition: str, fallback: str | None = None) -> Figure:
    return Figure(name, header, "ms", definition, _metric(name, fallback), pattern="{:.0f}", digits=3)


FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("output_tokens_per_second", "output tok/s", "tokens/s",
           "output throughput: output tokens of the successful measured requests (and of incomplete ones, "
           "up to the cut) / measured duration",
           lambda s: output_tokens_per_second(s.results)),
    Figure("decode_tokens_per_second", "decode tok/s", "tokens/s",
           "per-request mean decode rate: the mean over requests of (tokens - 1) / (last token - first token) "
           "(GPU Shopper's avg_tokens_per_second)",
           lambda s: _positive(s.results.get("avg_tokens_per_second"))),
    Figure("decode_tokens_per_second_std", "decode ± std", "tokens/s",
           "sample standard deviation of decode_tokens_per_second over repeated runs (runs > 1)",
           _run_statistic("std")),
    Figure("runs", "runs", "runs", "repeated runs summarised (runs > 1)", _run_statistic("n"), pattern="{}"),
    Figure("joules_per_output_token", "J/token", "J/token",
           "GPU energy per output token: the cell's GPUs' mean power together (sampled while measured "
           "requests ran) / output_tokens_per_second; empty where a GPU reports no power",
           _energy("joules_per_output_token"), pattern="{:.3f}", digits=4),
    Figure("output_tokens_per_second_per_watt", "tok/s/W", "tokens/s/W",
           "output_tokens_per_second / the cell's GPUs' mean power together (tokens per joule)",
           _energy("output_tokens_per_second_per_watt"), pattern="{:.2f}"),
    Figure("mean_power_w", "power W", "W",
           "the cell's GPUs' power together while measured requests ran: the sum of each GPU's mean reading",
           _energy("mean_power_w"), pattern="{:.0f}"),
    Figure("energy_uncertainty_pct", "energy ±%", "%",
           "standard error of mean_power_w as a percentage of it (it carries over to the energy figures)",
           _energy("uncertainty_pct"), pattern="{:.1f}"),
    Figure("request_throughput_rps", "req/s", "requests/s",
           "successful measured requests / measured duration", _metric("request_throughput_rps"),
           pattern="{:.2f}"),
    _ms("ttft_avg_ms", "TTFT avg ms", "mean time to first token", "avg_ttft_ms"),
    _ms("ttft_p50_ms", "TTFT p50 ms", "median time to first token", "p50_ttft_ms"),
    _ms("ttft_p95_ms", "TTFT p95 ms", "95th percentile time to first token", "p95_ttft_ms"),
    _ms("ttft_p99_ms", "TTFT p99 ms", "99th percentile time to first token"),
    _ms("ttfat_avg_ms", "TTFAT avg ms", "mean time to first answer token (reasoning models)"),
    _ms("ttfat_p50_ms", "TTFAT p50 ms", "median time to first answer token (reasoning models)"),
    _ms("ttfat_p95_ms", "TTFAT p95 ms", "95th percentile time to first answer token (reasoning models)"),
    _ms("ttfat_p99_ms", "TTFAT p99 ms", "99th percentile time to first answer token (reasoning models)"),
    Figure("tpot_avg_ms", "TPOT avg ms", "ms", "mean time per output token after the first, over requests",
           _metric("tpot_avg_ms"), pattern="{:.1f}"),
    Figure("tpot_p50_ms", "TPOT p50 ms", "ms", "median time per output token", _metric("tpot_p50_ms")),
    Figure("tpot_p95_ms", "TPOT p95 ms", "ms", "95th percentile time per output token", _metric("tpot_p95_ms")),
    Figure("tpot_p99_ms", "TPOT p99 ms", "ms", "99th percentile time per output token", _metric("tpot_p99_ms")),
    Figure("tpot_interactivity", "interactivity tok/s/user", "tokens/s per user",
           "1000 / tpot_p50_ms: the median request's decode speed after its first token (the frontier's primary "
           "interactivity, docs/metrics.md \"Frontiers\")", _tpot_interactivity, pattern="{:.1f}", digits=4),
    Figure("itl_p50_ms", "ITL p50 ms", "ms", "median inter-token latency (gap between tokens)",
           _metric("itl_p50_ms")),
    Figure("itl_p95_ms", "ITL p95 ms", "ms", "95th percentile inter-token latency", _metric("itl_p95_ms")),
    Figure("itl_p99_ms", "ITL p99 ms", "ms", "99th percentile inter-token latency", _metric("itl_p99_ms")),
    _ms("e2e_p50_ms", "e2e p50 ms", "median end-to-end request latency", "p50_latency_ms"),
    _ms("e2e_p95_ms", "e2e p95 ms", "95th percentile end-to-end request latency", "p95_latency_ms"),
    _ms("e2e_p99_ms", "e2e p99 ms", "99th percentile end-to-end request latency", "p99_latency_ms"),
    Figure("thinking_tokens", "thinking tok", "tokens", "reasoning (thinking) tokens generated (reasoning models)",
           lambda s: s.metrics.get("thinking_tokens"), pattern="{}"),
    Figure("thinking_token_share", "thinking share", "fraction 0-1",
           "thinking tokens / all output tokens (reasoning models)", _metric("thinking_token_share"),
           pattern="{:.1%}", digits=4),
    Figure("prefix_cacheable_share", "cacheable", "fraction 0-1",
           "prompt tokens a prefix cache could serve (already sent: history, shared system prompt) / prompt "
           "tokens sent", _metric("prefix_cacheable_share"), pattern="{:.1%}", digits=4),
    Figure("prefix_cached_share", "cached", "fraction 0-1",
           "prompt tokens the server says its prefix cache served / prompt tokens sent (where it says)",
           _metric("prefix_cached_share"), pattern="{:.1%}", digits=4),
    Figure("unanswered_requests", "unanswered", "requests",
           "successful requests of a reasoning model that ended before any answer token (reasoning models)",
           lambda s: s.metrics.get("unanswered_requests"), pattern="{}"),
    Figure("goodput_share", "goodput", "fraction 0-1",
           "requests meeting every bound of the cell's SLO / measured requests (with an SLO only)",
           _metric("goodput_share"), pattern="{:.1%}", digits=4),
    Figure("goodput_rps", "goodput req/s", "requests/s", "requests meeting the SLO / measured duration",
           _metric("goodput_rps"), pattern="{:.2f}"),
    Figure("slo", "SLO", "", "the SLO goodput is judged against, e.g. ttft_ms<=500 tpot_ms<=50", _slo,
           pattern="{}"),
    Figure("match_rate", "match", "fraction 0-1",
           "quality check: matching / checked answers (only when a prompt expects an answer)", _match_rate,
           pattern="{:.1%}", digits=4),
    Figure("accuracy", "accuracy", "fraction 0-1",
           "problems with exact answers asked after the load (workload `accuracy:`): correct / problems; "
           "an unanswered or failed problem counts as wrong",
           lambda s: _number((s.details.get("accuracy") or {}).get("accuracy")), pattern="{:.1%}", digits=4),
    Figure("requests", "requests", "requests", "measured requests: successful, failed or incomplete",
           lambda s: s.results.get("total_requests"), pattern="{}"),
    Figure("incomplete_requests", "incomplete", "requests",
           "measured requests still streaming at the end of the duration, cut there (the sandbox's clock only)",
           lambda s: s.metrics.get("incomplete"), pattern="{}"),
    Figure("errors", "errors", "requests", "measured requests that failed",
           lambda s: s.results.get("total_errors"), pattern="{}"),
    Figure("error_rate", "error rate", "fraction 0-1", "failed / measured requests",
           lambda s: _number(s.results.get("error_rate")), pattern="{:.1%}", digits=4),
    Figure("concurrency", "conc", "requests", "configured concurrency of a closed-loop cell", _concurrency,
           pattern="{}"),
    Figure("rate", "rate/s", "requests/s", "configured request rate of an open-loop cell",
           lambda s: _number((s.details.get("load") or {}).get("rate")), pattern="{:g}"),
    _ms("send_lag_p50_ms", "lag p50 ms", "send lag: how late requests left the client against their schedule "
        "(open-loop rate and trace cells), median"),
    _ms("send_lag_p99_ms", "lag p99 ms", "send lag, 99th percentile"),
    _ms("send_lag_max_ms", "lag max ms", "send lag, the largest"),
    Figure("spec_decode_acceptance_rate", "spec accept", "fraction 0-1",
           "speculative decoding: draft tokens the target model accepted / draft tokens proposed, over the "
           "measured run (vLLM's /metrics counters); empty without speculative decoding",
           _spec_decode("acceptance_rate"), pattern="{:.1%}", digits=4),
    Figure("spec_decode_mean_acceptance_length", "spec len", "tokens/step",
           "speculative decoding: tokens emitted per verification step, 1 + accepted / drafts (vLLM V1 counters)",
           _spec_decode("mean_acceptance_length"), pattern="{:.2f}", digits=4),
    Figure("max_rate_meeting_slo", "max rate/s", "requests/s",
           "saturation sweep (rate: sweep): the highest offered request rate whose goodput_share met the goal",
           lambda s: _number((s.details.get("sweep") or {}).get("max_rate_meeting_slo")), pattern="{:g}", digits=4),
    Figure("cost_per_million_tokens", "$/M tokens", "USD",
           "price_per_hour / (output_tokens_per_second x 3600) x 1e6", _cost_per_million,
           pattern="{:.2f}", digits=4),
    Figure("run_id", "run", "", "the run that measured the result", lambda s: s.run_id or None, pattern="{}"),
)}


def figure_values(source: FigureSource) -> dict[str, Any]:
    """Every registered figure of ``source``, by name (``None`` where not measured)."""
    return {name: figure.value(source) for name, figure in FIGURES.items()}


# ------------------------------------------------ summary columns (``--gpubench-columns``)

#: Columns that are not a result figure: how the cell ended, what it cost.
CELL_COLUMNS: dict[str, tuple[str, str]] = {
    "status": ("status", "how the cell ended (with the failure stage)"),
    "cost_usd": ("cost $", "what the cell cost: price x the time it held a session, USD"),
}
ALLOWED_COLUMNS: tuple[str, ...] = (*CELL_COLUMNS, *FIGURES)


def parse_columns(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"status,output_tokens_per_second"`` -> the column names, in order, once each.

    Names are case-insensitive; ``cell`` is accepted and ignored (it always comes
    first). An unknown name, or none at all, is a ``ValueError`` naming the allowed ones.
    """
    items = [text] if isinstance(text, str) else list(text)
    names: list[str] = []
    for item in items:
        names += [name.strip().lower() for name in str(item).split(",") if name.strip()]
    unknown = [name for name in names if name not in ALLOWED_COLUMNS and name != "cell"]
    allowed = ", ".join(ALLOWED_COLUMNS)
    if unknown:
        raise ValueError(f"unknown column{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}; "
                         f"allowed: {allowed}")
    chosen = tuple(dict.fromkeys(name for name in names if name != "cell"))
    if not chosen:
        raise ValueError(f"expected at least one column name; allowed: {allowed}")
    return chosen


# ------------------------------------------ compare rules (``--gpubench-compare-fail``)


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True)


class Metric(_Value):
    """One comparable figure: where it is found and which direction is better."""

    name: str  # the rule name: tps, ttft, cost, error_rate
    column: str  # the manifest / benchmarks column
    fallback: str = ""  # the column read where ``column`` is missing (older rows)
    label: str  # how a line names it
    higher_is_better: bool
    in_points: bool = False  # regressions in percentage points rather than percent


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(name="tps", column="p50_tokens_per_second", fallback="decode_tokens_per_second", label="tps",
               higher_is_better=True),
        Metric(name="ttft", column="ttft_p50_ms", label="ttft p50", higher_is_better=False),
        Metric(name="cost", column="cost_per_million_tokens", label="cost/Mtok", higher_is_better=False),
        Metric(name="error_rate", column="error_rate", label="errors", higher_is_better=False,
               in_points=True),
    )
}
_ALIASES = {
    "tokens_per_second": "tps",
    "ttft_p50": "ttft",
    "ttft_p50_ms": "ttft",
    "cost_per_million_tokens": "cost",
    "errors": "error_rate",
}
_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*$")


class Rule(_Value):
    """A bound: ``metric`` may get worse by at most ``percent`` (points for error_rate)."""

    metric: str
    percent: float

    def __str__(self) -> str:
        return f"{self.metric}:{self.percent:g}%"


def parse_compare_fail(text: str | Iterable[str]) -> list[Rule]:
    """Parse ``tps:10%,ttft:20%`` (comma-separated, or several such strings) into rules.

    The ``%`` sign is optional; a metric named twice keeps its strictest bound.
    Anything else is a ``ValueError`` that says what is allowed.
    """
    parts = [text] if isinstance(text, str) else list(text)
    allowed = ", ".join(METRICS)
    rules: dict[str, Rule] = {}
    for part in parts:
        for item in str(part).split(","):
            if not item.strip():
                continue
            match = _RULE.match(item)
            if match is None:
                raise ValueError(
                    f"expected METRIC:PERCENT such as tps:10% (metrics: {allowed}), got {item.strip()!r}"
                )
            name = match.group(1).lower()
            name = _ALIASES.get(name, name)
            if name not in METRICS:
                raise ValueError(f"unknown metric {match.group(1)!r} in {item.strip()!r} (allowed: {allowed})")
            bound = float(match.group(2))
            if name in rules and rules[name].percent <= bound:
                continue
            rules[name] = Rule(metric=name, percent=bound)
    if not rules:
        raise ValueError(f"expected at least one METRIC:PERCENT such as tps:10% (metrics: {allowed})")
    return list(rules.values())
