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

Which results may be compared: a fingerprint of what changes a cell's figures
-----------------------------------------------------------------------------

``--gpubench-compare`` holds a cell's figures against the same cell of a baseline
run. That only means something when both measured the same thing: 64 output
tokens per request against 128, other prompts, thinking on against off, or
another Ollama release all move tokens/s and TTFT with no change in the GPU.
Every result therefore stores a :class:`Fingerprint` (in ``details_json`` under
``fingerprint``, its hash in the ``benchmarks.workload_fingerprint`` column), and
a baseline whose fingerprint differs, or that has none, is not compared:
:func:`incomparable` says why.

What is in it, and why (see docs/metrics.md, "Comparable baselines"):

* ``prompts``: a hash of the prompt texts, their expectations and their own
  output lengths (``max_tokens``, ``ignore_eos``), in order;
* ``prompt_source``: for prompts from a dataset, its content hash and the options
  that chose them; for synthetic prompts, the spec (``matrix/datasets.py``,
  ``matrix/synthetic.py``). Only present for those, so fingerprints of written
  and built-in prompts keep the hash they always had;
* ``max_tokens``: the output cap, which sets answer lengths and the share of
  requests cut by it;
* ``load``: ``concurrency N`` or ``rate R/s`` (the cell id has it too: kept so
  the fingerprint stands alone);
* ``think``: the matrix's ``think`` as sent (None: the runtime's default);
* ``warmup``: whether the measured window starts on a warmed-up model;
* ``runtime``: the runtime's name and version (an Ollama upgrade changes
  scheduling, batching and thinking defaults);
* ``model_digest``: the weights behind the tag (a re-pushed tag is another model);
* ``launch``: the runtime's launch arguments and fixed port (``runtime.args``,
  ``runtime.port``): other arguments are another server configuration. Only
  present when set, so fingerprints without them keep their hash;
* ``gpus``: the GPUs the server spans when more than one (the cell id has it too,
  ``-x2``: kept so the fingerprint stands alone); the tensor-parallel size follows
  from it. Absent for one GPU, so one-GPU fingerprints keep their hash.

Left out on purpose: ``duration`` and ``runs`` (they set how precise the figures
are, not what they measure: a short CI run is compared with a long nightly one),
the progress, checkpoint and telemetry intervals, ``stall_timeout``, and the SLO
and thresholds (they judge figures, they do not make them). GPU, provider and
model are the cell itself: a baseline is always the same cell.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..figures import METRICS, Metric, Rule
from .results import BenchmarkResult, RunStatistics

__all__ = [
    "COMPARED",
    "FIELDS",
    "FigureDelta",
    "SERVER_FIELDS",
    "Spread",
    "Comparison",
    "Fingerprint",
    "MetricChange",
    "Violation",
    "compare",
    "figure_delta",
    "figures_of",
    "fingerprint",
    "incomparable",
    "server_changes",
    "spread_of",
    "stored_fingerprint",
    "workload_differs",
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


# ---------------------------------------------- which results may be compared

#: The fields, in the order a difference is told.
FIELDS = ("prompts", "prompt_source", "max_tokens", "load", "think", "warmup", "runtime", "model_digest", "launch",
          "gpus")


class Fingerprint(BaseModel):
    """The figure-changing facts of one result, and their stable hash."""

    model_config = ConfigDict(frozen=True)

    hash: str
    fields: dict[str, Any]


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(*, prompts: list[Any], max_tokens: int, concurrency: int, rate: float | None,
                think: bool | None, warmup_requests: int, runtime: str, runtime_version: str,
                model_digest: str = "", prompt_source: str | None = None,
                launch_args: Sequence[str] = (), port: int | None = None, sweep: str | None = None,
                gpus: int = 1) -> Fingerprint:
    """The fingerprint of a cell's workload on a runtime (see the module docstring); ``sweep``
    describes a saturation sweep's goal, SLO and bounds, which stand for its load."""
    fields = {
        "prompts": _digest(prompts)[:16],
        "max_tokens": max_tokens,
        "load": sweep or (f"rate {rate:g}/s" if rate is not None else f"concurrency {concurrency}"),
        "think": think,
        "warmup": warmup_requests > 0,
        "runtime": f"{runtime} {runtime_version}".strip(),
        "model_digest": model_digest or None,
    }
    if prompt_source:
        fields["prompt_source"] = prompt_source
    if launch_args or port is not None:  # only when set: fingerprints from before launch options stay equal
        fields["launch"] = {"args": list(launch_args), "port": port}
    if gpus > 1:
        fields["gpus"] = gpus
    return Fingerprint(hash=_digest(fields)[:16], fields=fields)


def stored_fingerprint(baseline: Mapping[str, Any]) -> Fingerprint | None:
    """The fingerprint a baseline (:meth:`Baseline.figures <pytest_gpubench.store.records.Baseline.figures>`,
    or a manifest row with its ``benchmark``) was stored with, if any."""
    benchmark = baseline.get("benchmark")
    if not isinstance(benchmark, Mapping):
        return None
    try:
        details = benchmark.get("details")  # a store's record: parsed already
        if not isinstance(details, Mapping):
            details = json.loads(benchmark.get("details_json") or "{}")
        found = details.get("fingerprint") if isinstance(details, Mapping) else None
        return Fingerprint.model_validate(found) if isinstance(found, dict) else None
    except ValueError:
        return None


def _shown(field: str, value: Any) -> str:
    if field == "think":
        return "default" if value is None else str(value).lower()
    if field == "warmup":
        return "warm-up" if value else "no warm-up"
    if field == "launch":
        return "default launch" if value is None else " ".join(
            [*value.get("args", []), *([f"port {value['port']}"] if value.get("port") else [])]) or "default launch"
    if value is None:
        return "written or built-in prompts" if field == "prompt_source" else "unknown"
    return str(value)


def incomparable(current: Fingerprint, baseline: Mapping[str, Any]) -> str | None:
    """Why ``baseline`` cannot be compared with a result of fingerprint ``current``; None if it can.

    The answer names what differs, baseline value first:
    ``max_tokens 64 -> 128, prompts differ``.
    """
    run = baseline.get("run_id") or "?"
    stored = stored_fingerprint(baseline)
    if stored is None:
        origin = "it was imported" if baseline.get("imported_from") else "it predates them"
        return f"run {run} stored no workload fingerprint ({origin}), so its workload is unknown"
    if stored.hash == current.hash:
        return None
    differences = _differences(stored, current, FIELDS)
    # A hash that differs with equal fields: a fingerprint of another version.
    return f"run {run} differs: " + (", ".join(differences) or "its fingerprint has other fields")


# ------------------------------------------ two runs side by side (``gpubench report --compare``)
#
# ``--gpubench-compare`` above judges one result against a baseline with rules; ``gpubench report
# --compare`` lays two runs' cells side by side and asks of each figure's delta whether it is beyond
# the runs' own spread. The plain logic is here; report/comparison.py reads the stores and renders it.

#: Fingerprint fields that describe the server rather than the workload: two runs that differ only
#: in these measured the same thing on another server ("did the new vLLM make us faster"), so they
#: are compared, the difference shown; any other field differing makes two cells incomparable.
SERVER_FIELDS = ("runtime", "launch")

#: The headline figures compared, each with the words for a change in its better and worse
#: direction (names are :data:`~pytest_gpubench.figures.FIGURES` entries; one not registered there,
#: or not measured on either side, is left out).
COMPARED: dict[str, tuple[bool, str, str]] = {
    # name: (higher is better, better, worse)
    "output_tokens_per_second": (True, "faster", "slower"),
    "ttft_p50_ms": (False, "faster", "slower"),
    "ttft_p95_ms": (False, "faster", "slower"),
    "tpot_p50_ms": (False, "faster", "slower"),
    "cost_per_million_tokens": (False, "cheaper", "dearer"),
    "joules_per_output_token": (False, "less energy", "more energy"),
    "output_tokens_per_second_per_watt": (True, "more efficient", "less efficient"),
    "match_rate": (True, "more accurate", "less accurate"),
    "accuracy": (True, "more accurate", "less accurate"),
}

WITHIN_NOISE = "within noise"
NO_REPEATS = "no repeats: spread unknown"
NO_RUN_VALUES = "spread unknown: no per-run values"
ONE_SIDE = "measured on one side only"


class Spread(_Value):
    """A figure's interval over one result's repeated runs: the 95% bootstrap confidence interval
    of the mean of its per-run values (:class:`~.results.RunStatistics`, the interval ``runs: N``
    reports)."""

    n: int
    low: float
    high: float


def spread_of(values: Sequence[float | None]) -> Spread | None:
    """The :class:`Spread` of per-run ``values``; None with fewer than two finite values."""
    finite = [float(v) for v in values if _number(v) is not None]
    if len(finite) < 2:
        return None
    stats = RunStatistics.from_values(finite)
    return Spread(n=stats.n, low=stats.ci_low, high=stats.ci_high)


class FigureDelta(_Value):
    """One figure of one cell in runs A and B: B - A, absolute and in percent of A, and the verdict.

    ``verdict`` is :data:`WITHIN_NOISE` (the two intervals overlap), ``"<better|worse word>, beyond
    the spread"`` (they do not), :data:`NO_REPEATS` (a side ran once), :data:`NO_RUN_VALUES` (both
    repeated, but this figure is not kept per run) or :data:`ONE_SIDE`.
    """

    figure: str
    a: float | None
    b: float | None
    delta: float | None
    delta_pct: float | None
    spread_a: Spread | None = None
    spread_b: Spread | None = None
    verdict: str
    #: True / False: B is better / worse beyond the spread; None: not beyond it, or unknown.
    better: bool | None = None


def figure_delta(figure: str, a: float | None, b: float | None, *, runs_a: int, runs_b: int,
                 spread_a: Spread | None = None, spread_b: Spread | None = None) -> FigureDelta:
    """Compare ``figure``'s values ``a`` (before) and ``b`` (after); ``runs_a``/``runs_b`` are the
    repeats behind each, ``spread_a``/``spread_b`` their intervals when the figure is kept per run."""
    higher_is_better, better_word, worse_word = COMPARED.get(figure, (True, "higher", "lower"))
    a, b = _number(a), _number(b)
    delta = delta_pct = None
    better = None
    if a is None or b is None:
        verdict = ONE_SIDE
    else:
        delta = b - a
        delta_pct = delta / abs(a) * 100 if a != 0 else (0.0 if b == 0 else None)
        if runs_a < 2 or runs_b < 2:
            verdict = NO_REPEATS
        elif spread_a is None or spread_b is None:
            verdict = NO_RUN_VALUES
        elif spread_b.low > spread_a.high or spread_b.high < spread_a.low:
            better = (delta > 0) == higher_is_better
            verdict = f"{better_word if better else worse_word}, beyond the spread"
        else:
            verdict = WITHIN_NOISE
    return FigureDelta(figure=figure, a=a, b=b, delta=delta, delta_pct=delta_pct, spread_a=spread_a,
                       spread_b=spread_b, verdict=verdict, better=better)


def workload_differs(a: Fingerprint | None, b: Fingerprint | None) -> str | None:
    """Why results of fingerprints ``a`` and ``b`` did not measure the same workload (``max_tokens
    64 -> 128, prompts differ``); None when they did. :data:`SERVER_FIELDS` are not the workload."""
    if a is None or b is None:
        side = "A" if a is None else "B"
        return f"run {side}'s result stored no workload fingerprint, so its workload is unknown"
    return ", ".join(_differences(a, b, [f for f in FIELDS if f not in SERVER_FIELDS])) or None


def server_changes(a: Fingerprint | None, b: Fingerprint | None) -> str:
    """What changed in the server between ``a`` and ``b`` (``runtime vllm 0.6.3 -> vllm 0.7.0``); ""."""
    if a is None or b is None:
        return ""
    return ", ".join(_differences(a, b, SERVER_FIELDS))


def _differences(old: Fingerprint, new: Fingerprint, fields: Iterable[str]) -> list[str]:
    differences = []
    for field in fields:
        before, after = old.fields.get(field), new.fields.get(field)
        if before == after:
            continue
        if field in ("prompts", "model_digest") and before is not None and after is not None:
            differences.append("prompts differ" if field == "prompts" else "model digest differs")
        else:
            differences.append(f"{field} {_shown(field, before)} -> {_shown(field, after)}")
    return differences
