"""Result models and the statistics that fill them.

The models mirror the GPU Shopper server's Go structs (``internal/benchmark/models.go``)
field for field, so a :class:`BenchmarkResult` can be POSTed to
``/api/v1/benchmarks`` as it is and the manifest stores the same fields.

What the instance reports and these models hold (a request of the load generator,
the machine, GPU telemetry) is in :mod:`pytest_gpubench.remote.readings`, which
``remote/`` and ``runtimes/`` read without importing ``measure/``. Here:
:func:`summarize`, which turns request records into :class:`PerformanceResults`, and
:func:`cost_analysis`.

Statistics over repeated runs of one benchmark cell: mean ± std, outliers, a CI
-------------------------------------------------------------------------------

One run of a cell gives one figure (say, its average tokens per second); a matrix
that asks for ``runs: 5`` or ``runs: {until_cv: 2%, max: 10}`` gives a short list
of them, and this module says how much to trust their mean. It follows seed 003
(the RUCKUS agent's multi-run jobs): the first, cold run is reported apart from
the warm ones, and the warm runs are summarised as mean ± sample standard
deviation with the outlying runs named by index. Pass only the warm runs here.

Outliers: Tukey's fences, not seed 003's z-score
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
RUCKUS flags a run whose value lies more than two sample standard deviations
from the mean (``agent/src/ruckus_agent/core/agent.py``,
``_calculate_multi_run_statistics``: ``abs(val - mean) > 2 * stdev``). With the
handful of runs a benchmark can afford that rule cannot fire: a value's
distance from the sample mean is at most ``(n - 1) / sqrt(n)`` sample standard
deviations, which is below 2 for every n up to 5 (1.79 at n = 5). RUCKUS's own
test case, ``[1.0, 1.1, 1.2, 5.0]`` with 5.0 "the outlier", is one its rule
does not flag (z = 1.499). So a run here is an outlier when it lies beyond
Tukey's fences, more than 1.5 interquartile ranges below the first quartile or
above the third (quartiles by the same linear interpolation as
:func:`percentile`). The fences do not depend on the
outlier's own pull on the mean and standard deviation, and they flag 5.0 above.
Below four runs no value can lie outside them, which is honest: three runs
cannot say which one is wrong.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..figures import cost_per_million_tokens
from ..remote.readings import GPUStats, HardwareInfo, RequestRecord, ValueModel

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BenchmarkResult",
    "CostAnalysis",
    "ModelInfo",
    "PerformanceResults",
    "RunStatistics",
    "TestConfig",
    "cost_analysis",
    "decode_tokens_per_second",
    "format_mean_std",
    "percentile",
    "quality",
    "summarize",
    "tukey_outliers",
    "until_cv_reached",
]


# --------------------------------------------------------------------------- requests


def decode_tokens_per_second(
    output_tokens: int, latency_ms: float, ttft_ms: float | None
) -> float | None:
    """Client-measured decode rate: ``(output_tokens - 1) / ((latency - ttft) / 1000)``.

    The first token is excluded because its time is the TTFT (prompt processing), not
    decoding. ``None`` when there are fewer than two tokens, no TTFT, or no time between
    the first and the last token.
    """
    if output_tokens < 2 or ttft_ms is None:
        return None
    decode_ms = latency_ms - ttft_ms
    if decode_ms <= 0:
        return None
    return (output_tokens - 1) / (decode_ms / 1000.0)


# --------------------------------------------------------------------- result models


class ModelInfo(ValueModel):
    """The model under test (Go ``ModelInfo``)."""

    name: str = ""
    family: str = ""
    parameter_count: str = ""
    quantization: str = ""
    size_gb: float = 0.0
    runtime: str = ""
    runtime_version: str = ""


class TestConfig(ValueModel):
    """How the load was generated (Go ``TestConfig``)."""

    # Not a test class, whatever its name says: keeps pytest from trying to collect
    # it when a test module imports it.
    __test__ = False

    duration_minutes: int = 0
    max_tokens: int = 0
    prompt_types: list[str] = Field(default_factory=list)
    concurrent_reqs: int = 0
    warmup_requests: int = 0


class PerformanceResults(ValueModel):
    """The measured figures (Go ``PerformanceResults``); built by :func:`summarize`."""

    total_requests: int = 0
    total_tokens: int = 0
    total_prompt_tokens: int = 0
    total_errors: int = 0
    duration_seconds: float = 0.0

    avg_tokens_per_second: float = 0.0
    min_tokens_per_second: float = 0.0
    max_tokens_per_second: float = 0.0
    p50_tokens_per_second: float = 0.0
    p95_tokens_per_second: float = 0.0
    p99_tokens_per_second: float = 0.0

    avg_latency_ms: float = 0.0
    min_latency_ms: float = 0.0
    max_latency_ms: float = 0.0
    p50_latency_ms: float = 0.0
    p95_latency_ms: float = 0.0
    p99_latency_ms: float = 0.0

    requests_per_minute: float = 0.0
    avg_tokens_per_request: float = 0.0
    error_rate: float = 0.0

    avg_ttft_ms: float = 0.0
    p50_ttft_ms: float = 0.0
    p95_ttft_ms: float = 0.0

    # omitempty on the Go side; zero means "no quality validation ran".
    match_rate: float = 0.0
    prompts_with_expected: int = 0
    prompts_matching: int = 0


class CostAnalysis(ValueModel):
    """Cost efficiency (Go ``CostAnalysis``); see :func:`cost_analysis` for the ``None`` cases."""

    tokens_per_dollar: float | None = None
    cost_per_million_tokens: float | None = None
    cost_per_hour: float = 0.0
    estimated_monthly_24x7: float = 0.0


class BenchmarkResult(ValueModel):
    """One benchmark, in the shape ``POST /api/v1/benchmarks`` stores (Go ``BenchmarkResult``).

    ``id`` is empty until the manifest or the server assigns one. ``timestamp`` is
    always timezone-aware (a naive one is taken as UTC), because Go's ``time.Time``
    refuses an RFC 3339 string without an offset.
    """

    id: str = ""
    timestamp: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    hardware: HardwareInfo = Field(default_factory=HardwareInfo)
    model: ModelInfo = Field(default_factory=ModelInfo)
    test_config: TestConfig = Field(default_factory=TestConfig)
    results: PerformanceResults = Field(default_factory=PerformanceResults)
    gpu_stats: GPUStats = Field(default_factory=GPUStats)
    provider: str = ""
    location: str = ""
    price_per_hour: float = 0.0

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)

    @property
    def output_tokens_per_second(self) -> float:
        """What the machine delivered: ``total_tokens / duration_seconds`` (0 if no duration)."""
        figures = self.results
        return figures.total_tokens / figures.duration_seconds if figures.duration_seconds > 0 else 0.0

    def cost_analysis(self) -> CostAnalysis:
        """The cost of a token this machine delivered: :func:`cost_analysis` of the price
        and :attr:`output_tokens_per_second`.

        The headline figure. At concurrency N the per-stream rate (what the Go server
        feeds its own ``CalculateCostAnalysis``) would understate the cost per token
        about N times; see :meth:`per_stream_cost_analysis`.
        """
        return cost_analysis(self.price_per_hour, self.output_tokens_per_second)

    def per_stream_cost_analysis(self) -> CostAnalysis:
        """:func:`cost_analysis` of the average per-request tokens/s, as the Go server computes it."""
        return cost_analysis(self.price_per_hour, self.results.avg_tokens_per_second)


# ------------------------------------------------------------------------ statistics


def cost_analysis(price_per_hour: float, tokens_per_second: float) -> CostAnalysis:
    """Cost figures for a GPU at ``price_per_hour`` producing ``tokens_per_second``.

    cost per million tokens = price_per_hour / (tokens_per_second * 3600) * 1e6,
    tokens per dollar = tokens_per_second * 3600 / price_per_hour,
    monthly = price_per_hour * 24 * 30 (the server's own ``CalculateCostAnalysis``).

    A ratio with a zero denominator is ``None`` ("undefined"), never a division
    error: no throughput means no cost per token, a free machine has no tokens per
    dollar. (The Go server returns all zeros there instead; zero would read as "free"
    in a report, and a JSON ``null`` decodes to zero on the Go side anyway.)
    Negative inputs are a ``ValueError``.
    """
    if price_per_hour < 0 or tokens_per_second < 0:
        raise ValueError(
            f"price_per_hour and tokens_per_second must not be negative "
            f"(got {price_per_hour}, {tokens_per_second})"
        )
    tokens_per_hour = tokens_per_second * 3600.0
    return CostAnalysis(
        tokens_per_dollar=tokens_per_hour / price_per_hour if price_per_hour > 0 else None,
        cost_per_million_tokens=cost_per_million_tokens(price_per_hour, tokens_per_second),
        cost_per_hour=price_per_hour,
        estimated_monthly_24x7=price_per_hour * 24 * 30,
    )


def percentile(values: Iterable[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation, as numpy's default.

    For sorted values ``x`` of length ``n`` the rank is ``(n - 1) * p / 100``; the
    result interpolates between the two neighbouring values. An empty input gives 0.
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def quality(records: Iterable[RequestRecord]) -> tuple[float, int, int]:
    """``(match_rate, prompts_with_expected, prompts_matching)`` for the Go result fields.

    Counts the measured, successful requests whose ``matched`` is not ``None``
    (the prompt expected something), like the GPU Shopper benchmark script, which
    skips failed prompts before counting. ``match_rate`` is a fraction (0-1), 0
    when nothing was checked (the Go field is ``omitempty``).
    """
    checked = [r.matched for r in records if not r.warmup and r.ok and r.matched is not None]
    matching = sum(1 for m in checked if m)
    return (matching / len(checked) if checked else 0.0), len(checked), matching


def summarize(records: Iterable[RequestRecord], duration_seconds: float) -> PerformanceResults:
    """Summarize measured requests into :class:`PerformanceResults`.

    * Warm-up records are left out entirely.
    * ``total_requests`` counts every measured request, successful or not (as the Go
      ``AnalyzeResults`` does), incomplete ones (cut at the deadline) included;
      ``total_errors`` the failed ones; ``error_rate`` is errors / total_requests.
    * Latency statistics cover successful requests only. TTFT and tokens per second
      (the per-request client decode rates; requests with fewer than two tokens are
      left out of those statistics only) also cover incomplete requests: what they
      received was measured like any other stream.
    * ``total_tokens`` sums each successful request's server ``eval_count`` when
      present, otherwise the client's chunk count (:attr:`RequestRecord.counted_tokens`),
      plus the tokens incomplete requests received before the cut;
      ``avg_tokens_per_request`` is over successful requests only;
      ``total_prompt_tokens`` sums ``prompt_tokens`` where reported.
    * ``requests_per_minute`` = successful requests / ``duration_seconds`` * 60.
    * ``match_rate`` / ``prompts_with_expected`` / ``prompts_matching`` come from
      :func:`pytest_gpubench.measure.metrics.quality`: successful requests whose prompt
      expected an answer (``matched`` not ``None``); all zero when none did.
    * Nothing successful (or nothing at all) gives zeros, not an error.
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    streamed = [r for r in measured if r.streamed]
    errors = len(measured) - len(streamed)

    tps = [r.tokens_per_second for r in streamed if r.tokens_per_second is not None]
    latency = [r.latency_ms for r in ok]
    ttft = [r.ttft_ms for r in streamed if r.ttft_ms is not None]
    ok_tokens = sum(r.counted_tokens for r in ok)
    total_tokens = ok_tokens + sum(r.output_tokens for r in streamed if r.incomplete)
    match_rate, with_expected, matching = quality(measured)

    return PerformanceResults(
        total_requests=len(measured),
        total_tokens=total_tokens,
        total_prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        total_errors=errors,
        duration_seconds=duration_seconds,
        avg_tokens_per_second=_mean(tps),
        min_tokens_per_second=min(tps, default=0.0),
        max_tokens_per_second=max(tps, default=0.0),
        p50_tokens_per_second=percentile(tps, 50),
        p95_tokens_per_second=percentile(tps, 95),
        p99_tokens_per_second=percentile(tps, 99),
        avg_latency_ms=_mean(latency),
        min_latency_ms=min(latency, default=0.0),
        max_latency_ms=max(latency, default=0.0),
        p50_latency_ms=percentile(latency, 50),
        p95_latency_ms=percentile(latency, 95),
        p99_latency_ms=percentile(latency, 99),
        requests_per_minute=len(ok) / duration_seconds * 60 if duration_seconds > 0 else 0.0,
        avg_tokens_per_request=ok_tokens / len(ok) if ok else 0.0,
        error_rate=errors / len(measured) if measured else 0.0,
        avg_ttft_ms=_mean(ttft),
        p50_ttft_ms=percentile(ttft, 50),
        p95_ttft_ms=percentile(ttft, 95),
        match_rate=match_rate,
        prompts_with_expected=with_expected,
        prompts_matching=matching,
    )


# ---------------------------------------------- statistics over repeated runs

#: Resamples of the bootstrap confidence interval: enough for a stable 95% interval
#: of a mean, and a few milliseconds for the run counts a matrix asks for.
BOOTSTRAP_RESAMPLES = 2000
#: Tukey's fence factor.
IQR_FACTOR = 1.5


class RunStatistics(BaseModel):
    """Summary of one figure over repeated runs, built by :meth:`from_values`.

    ``std`` is the sample standard deviation (n - 1), 0.0 for a single run; ``cv``
    is ``std / |mean|`` (None when the mean is 0); ``outliers`` are indices into
    ``values`` (Tukey's fences, see the module docstring); ``ci_low`` / ``ci_high``
    bound a percentile-bootstrap confidence interval of the mean at ``confidence``,
    degenerate (both equal to the value) for a single run.
    """

    model_config = ConfigDict(frozen=True)

    values: tuple[float, ...]
    n: int
    mean: float
    std: float
    cv: float | None
    min: float
    max: float
    outliers: tuple[int, ...] = ()
    ci_low: float
    ci_high: float
    confidence: float = Field(default=0.95, gt=0, lt=1)

    @classmethod
    def from_values(
        cls,
        values: Sequence[float],
        *,
        confidence: float = 0.95,
        resamples: int = BOOTSTRAP_RESAMPLES,
        seed: int = 0,
    ) -> RunStatistics:
        """Statistics of ``values`` (one per run, in run order).

        The bootstrap draws ``resamples`` resamples with ``random.Random(seed)``, so
        the same values always give the same interval. An empty list or a
        non-finite value is a ``ValueError``: a run without a figure must be
        dropped (and said so) by the caller, not averaged as zero.
        """
        data = tuple(float(v) for v in values)
        if not data:
            raise ValueError("RunStatistics needs at least one run")
        if not all(math.isfinite(v) for v in data):
            raise ValueError(f"run values must be finite numbers, got {data}")
        mean = statistics.fmean(data)
        std = statistics.stdev(data) if len(data) > 1 else 0.0
        low, high = bootstrap_mean_ci(data, confidence=confidence, resamples=resamples, seed=seed)
        return cls(
            values=data,
            n=len(data),
            mean=mean,
            std=std,
            cv=std / abs(mean) if mean != 0 else None,
            min=min(data),
            max=max(data),
            outliers=tukey_outliers(data),
            ci_low=low,
            ci_high=high,
            confidence=confidence,
        )


def tukey_outliers(values: Sequence[float], factor: float = IQR_FACTOR) -> tuple[int, ...]:
    """Indices of the values outside ``[Q1 - factor*IQR, Q3 + factor*IQR]``."""
    if len(values) < 4:
        return ()  # no value can fall outside the fences of three or fewer
    q1, q3 = percentile(values, 25), percentile(values, 75)
    spread = factor * (q3 - q1)
    low, high = q1 - spread, q3 + spread
    return tuple(i for i, v in enumerate(values) if v < low or v > high)


def bootstrap_mean_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of ``values``.

    Draws ``resamples`` samples of the same size with replacement and takes the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of their means.
    Deterministic for a given ``seed``. One value gives ``(value, value)``.
    """
    if not values:
        raise ValueError("a confidence interval needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    n = len(values)
    if n == 1:
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    means = [math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples)]
    tail = (1 - confidence) / 2 * 100
    return percentile(means, tail), percentile(means, 100 - tail)


def format_mean_std(stats: RunStatistics, unit: str = "") -> str:
    """``"41.6 ± 0.4"`` (or ``"41.6 ± 0.4 tok/s"`` with a unit).

    Both numbers get the decimals that show the standard deviation to one
    significant digit, and at least one: more digits than the spread would be
    noise, fewer would hide it.
    """
    decimals = 1
    if stats.std > 0:
        decimals = min(6, max(1, -math.floor(math.log10(stats.std))))
    text = f"{stats.mean:.{decimals}f} ± {stats.std:.{decimals}f}"
    return f"{text} {unit}" if unit else text


def until_cv_reached(values: Sequence[float], bound: float, max_runs: int, min_runs: int = 3) -> bool:
    """Whether a ``runs: {until_cv: bound, max: max_runs}`` loop may stop now.

    True once ``max_runs`` runs are done, or once at least ``min_runs`` are and
    the coefficient of variation of ``values`` is at most ``bound`` (a fraction:
    2% is 0.02). A mean of zero never meets a CV bound. ``min_runs`` below 2 is
    refused, since one run has no spread to judge.
    """
    if bound <= 0:
        raise ValueError(f"the CV bound must be positive (2% is 0.02), got {bound}")
    if min_runs < 2:
        raise ValueError(f"min_runs must be at least 2, got {min_runs}")
    if max_runs < min_runs:
        raise ValueError(f"max_runs ({max_runs}) must not be below min_runs ({min_runs})")
    if len(values) >= max_runs:
        return True
    if len(values) < min_runs:
        return False
    mean = statistics.fmean(values)
    if mean == 0:
        return False
    return statistics.stdev(values) / abs(mean) <= bound
