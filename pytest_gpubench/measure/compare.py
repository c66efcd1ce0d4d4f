"""Compare a cell's result with a baseline run, and fail on regressions.

Like pytest-benchmark's ``--benchmark-compare`` / ``--benchmark-compare-fail``: a
baseline is the same cell in an earlier run of the manifest
(:meth:`~pytest_gpubench.store.base.Store.baseline`), and rules such as
``tps:10%,ttft:20%`` bound how much worse a figure may get.

Metrics (``METRICS``; the rule grammar, :func:`~pytest_gpubench.figures.parse_compare_fail`,
is in ``figures.py`` with the other names a person gives figures):

========== ============================ ==========================================
rule name  figure                       a regression is
========== ============================ ==========================================
tps        p50_tokens_per_second        a drop, in percent of the baseline (the
                                        median per-request rate: one stream that
                                        stalled and then burst cannot move it as
                                        it moves the mean; rows without it fall
                                        back to decode_tokens_per_second)
ttft       ttft_p50_ms                  a rise, in percent of the baseline
cost       cost_per_million_tokens      a rise, in percent of the baseline
error_rate error_rate (0-1)             a rise, in percentage points: relative
                                        change from a clean run (0 errors) has
                                        no meaning, so ``error_rate:2%`` allows
                                        0.0% -> 2.0% but not 0.0% -> 2.5%
========== ============================ ==========================================

A figure missing on either side (no TTFT measured, no price known) is shown as
unknown and breaks no rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..figures import METRICS, Metric, Rule
from .results import BenchmarkResult

__all__ = [
    "Comparison",
    "MetricChange",
    "Violation",
    "compare",
    "figures_of",
]


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True)


class MetricChange(_Value):
    """One figure in both runs: ``change_pct`` is relative, ``worse_by`` how much it regressed.

    ``worse_by`` is in percent of the baseline (percentage points for error_rate);
    negative when the figure improved; ``None`` when either value is unknown or the
    baseline is zero.
    """

    metric: str
    baseline: float | None
    current: float | None
    change_pct: float | None
    worse_by: float | None


class Violation(_Value):
    """A rule a comparison broke."""

    rule: Rule
    change: MetricChange


class Comparison(_Value):
    """A result against its baseline: every figure's change and the rules broken."""

    baseline_run: str
    changes: tuple[MetricChange, ...]
    violations: tuple[Violation, ...] = ()
    ruled: tuple[str, ...] = ()  # metrics some rule bounds

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def change(self, metric: str) -> MetricChange | None:
        """The change of ``metric`` (tps, ttft, cost, error_rate), if compared."""
        return next((c for c in self.changes if c.metric == metric), None)

    def line(self) -> str:
        """One line for a report, e.g. ``vs run R: tps 195.3 -> 180.1 (-7.8%), ttft p50 42 -> 45 ms (+7.1%)``."""
        shown = []
        for change in self.changes:
            quiet = change.metric in ("cost", "error_rate") and change.metric not in self.ruled
            if change.metric == "error_rate" and (change.baseline or change.current):
                quiet = False  # errors are worth a mention whenever there are any
            if not quiet:
                shown.append(_describe(change))
        return f"vs run {self.baseline_run}: " + ", ".join(shown)

    def failure(self) -> str:
        """What regressed beyond its bound, for a failure report; empty when nothing did."""
        reasons = []
        for violation in self.violations:
            change, rule = violation.change, violation.rule
            metric = METRICS[change.metric]
            unit = " points" if metric.in_points else "%"
            direction = "fell" if metric.higher_is_better else "rose"
            reasons.append(
                f"{metric.label} {direction} {change.worse_by:.1f}{unit} vs run {self.baseline_run} "
                f"({_value_text(metric, change.baseline)} -> {_value_text(metric, change.current)}), "
                f"more than the {rule.percent:g}{unit} allowed by {rule}"
            )
        return "; ".join(reasons)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def figures_of(result: BenchmarkResult, run_id: str = "") -> dict[str, Any]:
    """The comparable figures of a result, as :func:`compare` reads them."""
    return {
        "run_id": run_id,
        "p50_tokens_per_second": result.results.p50_tokens_per_second,
        "decode_tokens_per_second": result.results.avg_tokens_per_second,
        "ttft_p50_ms": result.results.p50_ttft_ms or None,  # 0 means "not measured"
        "cost_per_million_tokens": result.cost_analysis().cost_per_million_tokens,
        "error_rate": result.results.error_rate,
    }


def _lookup(figures: Mapping[str, Any], metric: Metric) -> float | None:
    """``metric`` from a manifest row, a benchmarks row, a baseline (row + ``benchmark``)
    or a BenchmarkResult dict."""
    value = _number(figures.get(metric.column))
    if value is not None:
        return value
    benchmark = figures.get("benchmark")
    if isinstance(benchmark, Mapping):
        value = _number(benchmark.get(metric.column))
        if value is not None:
            return value
    results = figures.get("results")
    if isinstance(results, Mapping) and "avg_tokens_per_second" in results:
        try:
            return _number(figures_of(BenchmarkResult.model_validate(figures))[metric.column])
        except ValueError:
            return None
    if metric.fallback:
        return _lookup(figures, metric.model_copy(update={"column": metric.fallback, "fallback": ""}))
    if metric.name == "error_rate":  # a manifest row alone: errors / requests
        requests, errors = _number(figures.get("total_requests")), _number(figures.get("error_count"))
        if requests and errors is not None:
            return errors / requests
    return None


def _change(metric: Metric, baseline: float | None, current: float | None) -> MetricChange:
    change_pct = worse_by = None
    if baseline is not None and current is not None:
        if baseline != 0:
            change_pct = (current - baseline) / abs(baseline) * 100
        elif current == 0:
            change_pct = 0.0
        if metric.in_points:
            worse_by = (current - baseline) * 100
        elif change_pct is not None:
            worse_by = -change_pct if metric.higher_is_better else change_pct
    return MetricChange(metric=metric.name, baseline=baseline, current=current,
                        change_pct=change_pct, worse_by=worse_by)


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], rules: Iterable[Rule] = ()) -> Comparison:
    """Compare ``current`` figures with ``baseline``'s and check ``rules``.

    Both are mappings with the metric columns (``decode_tokens_per_second``,
    ``ttft_p50_ms``, ``cost_per_million_tokens``, ``error_rate``): a manifest row,
    a :meth:`Baseline.figures` (store.records), :func:`figures_of` a result, or a
    BenchmarkResult dict. The baseline's ``run_id`` names it in the texts.
    """
    rules = list(rules)
    changes = tuple(
        _change(metric, _lookup(baseline, metric), _lookup(current, metric)) for metric in METRICS.values()
    )
    by_metric = {change.metric: change for change in changes}
    violations = tuple(
        Violation(rule=rule, change=by_metric[rule.metric])
        for rule in rules
        if by_metric[rule.metric].worse_by is not None and by_metric[rule.metric].worse_by > rule.percent + 1e-9
    )
    return Comparison(
        baseline_run=str(baseline.get("run_id") or "?"),
        changes=changes,
        violations=violations,
        ruled=tuple(rule.metric for rule in rules),
    )


def _value_text(metric: Metric, value: float | None) -> str:
    if value is None:
        return "?"
    if metric.name == "tps":
        return f"{value:.1f}"
    if metric.name == "ttft":
        return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"
    if metric.name == "cost":
        return f"${value:.3f}" if abs(value) < 10 else f"${value:.2f}"
    return f"{value * 100:.1f}%"


def _describe(change: MetricChange) -> str:
    metric = METRICS[change.metric]
    unit = " ms" if metric.name == "ttft" else ""
    text = f"{metric.label} {_value_text(metric, change.baseline)} -> {_value_text(metric, change.current)}{unit}"
    if metric.in_points and change.worse_by is not None:
        return f"{text} ({change.worse_by:+.1f} pts)"
    if change.change_pct is not None:
        return f"{text} ({change.change_pct:+.1f}%)"
    return text
