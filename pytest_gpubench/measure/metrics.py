"""Detailed serving metrics of one run: latency distributions, goodput, client health.

:func:`~pytest_gpubench.measure.results.summarize` fills the GPU Shopper result shape,
which the server fixes. This module computes what that shape has no room for,
with the definitions of ``docs/metrics.md`` (and how vLLM ``bench serve``,
NVIDIA AIPerf and GuideLLM define the same names): TTFT, ITL, TPOT and
end-to-end latency distributions, run-level throughput, decode rates as the
client and the server measured them, goodput under SLOs, and whether the load
generator itself kept up (:attr:`DetailedMetrics.client_saturated`).

Everything here covers the measured requests only: warm-up records are dropped
first. A figure with nothing to compute it from is ``None``, never 0: a report
must be able to tell "no TTFT" from "a TTFT of 0 ms".
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .results import percentile
from ..remote.readings import RequestRecord
from ..remote.telemetry import GpuSample
from ..matrix.thresholds import Slo

__all__ = [
    "DetailedMetrics",
    "LoadgenSummary",
    "Slo",
    "meets_slo",
    "detailed_metrics",
    "request_tpot_ms",
    "token_counts_disagree",
]

#: Send-lag p99 above this share of the mean request latency means the client,
#: not the server, was shaping the load.
SEND_LAG_SHARE = 0.10
#: Delivered concurrency below this share of the configured one: same verdict.
CONCURRENCY_SHARE = 0.95
#: A request's client and server output-token counts disagree when they differ by
#: more than max(TOKEN_SLACK, TOKEN_SHARE x server count): a chunk or two of slack
#: for an empty final chunk, 5% for long answers.
TOKEN_SLACK = 2
TOKEN_SHARE = 0.05

ItlSource = Literal["loadgen", "per_request_means"]


# ---------------------------------------------------------------------- inputs


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    """Whether ``record`` succeeded and meets every bound ``slo`` sets, inclusively
    (``ttft_ms <= slo.ttft_ms`` and so on), as in vLLM's ``--goodput``.

    A bound whose figure the record lacks is not met (a request without a TTFT
    cannot prove it met a TTFT objective), with one exception taken from vLLM: a
    request with fewer than two output tokens has no decode phase, and its TPOT
    counts as 0.
    """
    if not record.ok:
        return False
    if slo.ttft_ms is not None and (record.ttft_ms is None or record.ttft_ms > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None:
        tpot = request_tpot_ms(record)
        if tpot is None:
            tpot = 0.0 if record.output_tokens < 2 else None
        if tpot is None or tpot > slo.tpot_ms:
            return False
    return slo.e2e_ms is None or record.latency_ms <= slo.e2e_ms


class StreamSummary(BaseModel):
    """A distribution as the load generator summarises it (e.g. its ``itl_ms``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    count: int | None = None
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @property
    def usable(self) -> bool:
        """Has a mean over at least one sample (a count of 0 means nothing was measured)."""
        return self.mean is not None and (self.count is None or self.count > 0)


class LoadgenSummary(BaseModel):
    """What :func:`detailed_metrics` reads from the load generator's ``finish`` event.

    Every field is optional and unknown fields are ignored, so an older or newer
    load generator still parses. ``itl_ms`` summarises every gap between
    consecutive token chunks of the measured requests (first token excluded);
    ``send_lag_ms`` the delays between when requests were due and when they were
    sent; ``cpu_seconds`` the generator's own CPU time.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    itl_ms: StreamSummary | None = None
    send_lag_ms: StreamSummary | None = None
    cpu_seconds: float | None = None
    cpu_seconds_per_1k_tokens: float | None = None
    delivered_concurrency: float | None = None
    configured_concurrency: int | None = None


# --------------------------------------------------------------------- result


class DetailedMetrics(BaseModel):
    """Serving metrics of one run's measured requests; see ``docs/metrics.md``.

    Latencies are in milliseconds, rates per second. Percentiles interpolate
    linearly (numpy's default, :func:`~pytest_gpubench.measure.results.percentile`).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    # Requests
    requests: int = 0  # measured requests: successful, failed or incomplete
    successful: int = 0
    errors: int = 0
    incomplete: int = 0  # still streaming at the deadline and cut there (the sandbox's clock)
    error_rate: float = 0.0  # errors / requests
    duration_seconds: float = 0.0

    # Time to first token, successful and incomplete requests
    ttft_avg_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None

    # Inter-token latency: over every gap when the load generator summarised them
    # ("loadgen"), else over each request's mean gap ("per_request_means").
    itl_source: ItlSource | None = None
    itl_mean_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_max_ms: float | None = None

    # Time per output token, one value per successful or incomplete request with two tokens or more
    tpot_avg_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    tpot_p99_ms: float | None = None

    # End-to-end latency, successful requests
    e2e_avg_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None

    # Throughput over the whole run
    output_throughput_tps: float | None = None  # output tokens of successful and incomplete requests / duration
    request_throughput_rps: float | None = None  # successful requests / duration
    decode_tps_client_avg: float | None = None  # mean of per-request client decode rates (incomplete included)
    decode_tps_server_avg: float | None = None  # mean of per-request eval_count / eval_duration

    # Tokens, successful requests
    output_tokens_client: int = 0  # token chunks the client received
    output_tokens_server: int | None = None  # sum of eval_count where reported
    server_counted_requests: int = 0  # requests with an eval_count
    token_count_mismatches: int = 0  # requests whose two counts disagree
    token_count_mismatch: bool | None = None  # any disagreement; None without server counts
    prompt_tokens: int | None = None  # sum of prompt_eval_count where reported
    prompt_tokens_avg: float | None = None

    # Goodput: None unless an SLO was given
    slo: Slo | None = None
    good_requests: int | None = None
    goodput_share: float | None = None  # good / measured requests (errors count against it)
    goodput_rps: float | None = None  # good / duration

    # Load-generator health
    cpu_seconds: float | None = None
    cpu_seconds_per_1k_tokens: float | None = None
    configured_concurrency: int | None = None
    delivered_concurrency: float | None = None
    send_lag_p50_ms: float | None = None
    send_lag_p99_ms: float | None = None
    send_lag_max_ms: float | None = None
    client_saturated: bool | None = None  # None when neither check could be made
    saturation_reasons: tuple[str, ...] = ()

    # Reasoning ("thinking") models, successful requests. TTFT above is the first
    # token of either kind; these need a load generator that tells the kinds apart
    # (None otherwise).
    ttfat_avg_ms: float | None = None  # time to first answer token
    ttfat_p50_ms: float | None = None
    ttfat_p95_ms: float | None = None
    ttfat_p99_ms: float | None = None
    thinking_tokens: int | None = None  # reasoning token chunks
    thinking_token_share: float | None = None  # thinking_tokens / all their output tokens (client count), 0-1
    unanswered_requests: int | None = None  # ended (e.g. at max_tokens) before any answer token

    # Prefix reuse (conversations, shared system prompts), successful requests that report it
    prefix_cacheable_share: float | None = None  # cacheable / sent prompt tokens, 0-1
    prefix_cached_share: float | None = None  # server-reported cached / sent prompt tokens, 0-1
    cached_prompt_tokens: int | None = None  # sum of the server's cached prompt tokens


# -------------------------------------------------------------- per request


def request_tpot_ms(record: RequestRecord) -> float | None:
    """TPOT of one request: the time from its first to its last token / (tokens - 1).

    The load generator's own ``tpot_ms`` when it sent one. Otherwise
    ``(latency - TTFT) / (output_tokens - 1)`` with the client's token (chunk)
    count, which also counts the wait for the final ``done`` chunk. ``None``
    below two tokens or without a TTFT.
    """
    if record.tpot_ms is not None:
        return record.tpot_ms
    if record.output_tokens < 2 or record.ttft_ms is None:
        return None
    decode_ms = record.latency_ms - record.ttft_ms
    return decode_ms / (record.output_tokens - 1) if decode_ms >= 0 else None


def _server_decode_tps(record: RequestRecord) -> float | None:
    if record.server_tokens_per_second is not None:
        return record.server_tokens_per_second
    if record.eval_count and record.eval_duration_ns:
        return record.eval_count / (record.eval_duration_ns / 1e9)
    return None


def token_counts_disagree(client: int, server: int) -> bool:
    """Whether a client's and a server's output-token counts of one request disagree.

    More than ``max(2, 5% of the server count)`` apart, the same rule as
    :func:`pytest_gpubench.measure.validity.token_count_mismatch`.
    """
    return abs(client - server) > max(TOKEN_SLACK, TOKEN_SHARE * server)


# ------------------------------------------------------------------ helpers


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _pct(values: Sequence[float], p: float) -> float | None:
    return percentile(values, p) if values else None


def _per_second(count: float, duration_seconds: float) -> float | None:
    return count / duration_seconds if duration_seconds > 0 else None


def _loadgen(loadgen: Mapping[str, Any] | BaseModel | None) -> LoadgenSummary:
    if loadgen is None:
        return LoadgenSummary()
    if isinstance(loadgen, LoadgenSummary):
        return loadgen
    if isinstance(loadgen, BaseModel):
        loadgen = loadgen.model_dump()
    return LoadgenSummary.model_validate(loadgen)


def _itl(ok: Sequence[RequestRecord], summary: StreamSummary | None) -> dict[str, Any]:
    if summary is not None and summary.usable:
        return dict(itl_source="loadgen", itl_mean_ms=summary.mean, itl_p50_ms=summary.p50,
                    itl_p90_ms=summary.p90, itl_p95_ms=summary.p95, itl_p99_ms=summary.p99,
                    itl_max_ms=summary.max)
    means = [r.itl_mean_ms for r in ok if r.itl_mean_ms is not None]
    if not means:
        return {}
    maxima = [r.itl_max_ms for r in ok if r.itl_max_ms is not None]
    return dict(itl_source="per_request_means", itl_mean_ms=statistics.fmean(means),
                itl_p50_ms=percentile(means, 50), itl_p90_ms=percentile(means, 90),
                itl_p95_ms=percentile(means, 95), itl_p99_ms=percentile(means, 99),
                itl_max_ms=max(maxima) if maxima else max(means))


def _reasoning(ok: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFAT and the thinking figures of the successful requests that report them."""
    told = [r for r in ok if r.thinking_tokens is not None]
    if not told:
        return {}
    ttfat = [r.ttfat_ms for r in told if r.ttfat_ms is not None]
    thinking = sum(r.thinking_tokens for r in told)
    output = sum(r.output_tokens for r in told)
    return dict(ttfat_avg_ms=_mean(ttfat), ttfat_p50_ms=_pct(ttfat, 50), ttfat_p95_ms=_pct(ttfat, 95),
                ttfat_p99_ms=_pct(ttfat, 99), thinking_tokens=thinking,
                thinking_token_share=thinking / output if output else None,
                unanswered_requests=sum(1 for r in told if r.ttfat_ms is None))


def _prefix_reuse(ok: Sequence[RequestRecord]) -> dict[str, Any]:
    """The prefix-reuse shares over the successful requests that report them: what a prefix cache
    could serve (from what was sent) and what the server says its cache served, both over the
    prompt tokens sent (the load generator's count), so the two compare directly."""
    told = [r for r in ok if r.sent_prompt_tokens and r.cacheable_prompt_tokens is not None]
    sent = sum(r.sent_prompt_tokens or 0 for r in told)
    if not sent:
        return {}
    out: dict[str, Any] = dict(prefix_cacheable_share=sum(r.cacheable_prompt_tokens or 0 for r in told) / sent)
    counted = [r for r in told if r.cached_prompt_tokens is not None]
    counted_sent = sum(r.sent_prompt_tokens or 0 for r in counted)
    if counted and counted_sent:
        cached = sum(r.cached_prompt_tokens or 0 for r in counted)
        # A server's tokenizer counts the text otherwise than the rule: never above all of it.
        out.update(prefix_cached_share=min(1.0, cached / counted_sent), cached_prompt_tokens=cached)
    return out


def _send_lag(measured: Sequence[RequestRecord], summary: StreamSummary | None) -> dict[str, Any]:
    # The records carry every request's own lag, so they beat a summary that may
    # also cover the warm-up.
    lags = [r.send_lag_ms for r in measured if r.send_lag_ms is not None]
    if lags:
        return dict(send_lag_p50_ms=percentile(lags, 50), send_lag_p99_ms=percentile(lags, 99),
                    send_lag_max_ms=max(lags))
    if summary is not None and summary.count != 0 and summary.p99 is not None:
        return dict(send_lag_p50_ms=summary.p50, send_lag_p99_ms=summary.p99, send_lag_max_ms=summary.max)
    return {}


def _saturation(send_lag_p99: float | None, e2e_avg: float | None, delivered: float | None,
                configured: int | None) -> tuple[bool | None, tuple[str, ...]]:
    reasons = []
    checked = False
    if send_lag_p99 is not None and e2e_avg is not None and e2e_avg > 0:
        checked = True
        if send_lag_p99 > SEND_LAG_SHARE * e2e_avg:
            reasons.append(f"send-lag p99 {send_lag_p99:.1f} ms exceeds {SEND_LAG_SHARE:.0%} "
                           f"of the mean latency ({e2e_avg:.1f} ms)")
    if delivered is not None and configured:
        checked = True
        if delivered < CONCURRENCY_SHARE * configured:
            reasons.append(f"delivered concurrency {delivered:.2f} is below {CONCURRENCY_SHARE:.0%} "
                           f"of the configured {configured}")
    return (bool(reasons) if checked else None), tuple(reasons)


# --------------------------------------------------------------------- main


def detailed_metrics(
    records: Iterable[RequestRecord],
    duration_seconds: float,
    *,
    slo: Slo | None = None,
    loadgen: Mapping[str, Any] | BaseModel | None = None,
    concurrency: int | None = None,
) -> DetailedMetrics:
    """Compute :class:`DetailedMetrics` from a run's records (warm-ups are dropped here).

    ``duration_seconds`` is the measured window the throughputs divide by (the
    load generator's ``finish`` duration). ``loadgen`` is that ``finish`` event
    (or its :class:`LoadgenSummary`): its ``itl_ms`` summary is preferred for ITL,
    and it supplies CPU time and delivered concurrency. ``concurrency``, the cell's (else the
    event's own ``configured_concurrency``, the name the stored metrics keep beside
    ``delivered_concurrency``) enables the delivered-
    concurrency check of :attr:`DetailedMetrics.client_saturated`. When the
    event says nothing of delivered concurrency, it is computed from the records
    by Little's law: the sum of request latencies over the duration.
    """
    every = list(records)
    measured = [r for r in every if not r.warmup]
    ok = [r for r in measured if r.ok]
    # Incomplete requests (cut at the deadline) count for what they received.
    streamed = [r for r in measured if r.streamed]
    cut_tokens = sum(r.output_tokens for r in streamed if r.incomplete)
    errors = len(measured) - len(streamed)
    summary = _loadgen(loadgen)

    ttft = [r.ttft_ms for r in streamed if r.ttft_ms is not None]
    tpot = [t for t in (request_tpot_ms(r) for r in streamed) if t is not None]
    e2e = [r.latency_ms for r in ok]
    client_tps = [r.tokens_per_second for r in streamed if r.tokens_per_second is not None]
    server_tps = [t for t in (_server_decode_tps(r) for r in ok) if t is not None]

    counted = [r for r in ok if r.eval_count is not None]
    mismatches = sum(1 for r in counted if token_counts_disagree(r.output_tokens, r.eval_count))
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]

    good = None
    if slo is not None and slo.is_set:
        good = sum(1 for r in measured if meets_slo(r, slo))

    # CPU time covers the generator's whole process, warm-up included, so it is
    # divided by every token it received.
    cpu_per_1k = summary.cpu_seconds_per_1k_tokens
    received = sum(r.output_tokens for r in every)
    if cpu_per_1k is None and summary.cpu_seconds is not None and received > 0:
        cpu_per_1k = summary.cpu_seconds / (received / 1000)

    delivered = summary.delivered_concurrency
    if delivered is None and measured and duration_seconds > 0:
        delivered = sum(r.latency_ms for r in measured) / 1000 / duration_seconds
    configured = concurrency if concurrency is not None else summary.configured_concurrency

    reasoning = _reasoning(ok)
    reasoning.update(_prefix_reuse(ok))
    lag = _send_lag(measured, summary.send_lag_ms)
    e2e_avg = _mean(e2e)
    saturated, reasons = _saturation(lag.get("send_lag_p99_ms"), e2e_avg, delivered, configured)

    return DetailedMetrics(
        requests=len(measured),
        successful=len(ok),
        errors=errors,
        incomplete=len(streamed) - len(ok),
        error_rate=errors / len(measured) if measured else 0.0,
        duration_seconds=duration_seconds,
        ttft_avg_ms=_mean(ttft), ttft_p50_ms=_pct(ttft, 50), ttft_p90_ms=_pct(ttft, 90),
        ttft_p95_ms=_pct(ttft, 95), ttft_p99_ms=_pct(ttft, 99),
        **_itl(streamed, summary.itl_ms),
        tpot_avg_ms=_mean(tpot), tpot_p50_ms=_pct(tpot, 50), tpot_p95_ms=_pct(tpot, 95),
        tpot_p99_ms=_pct(tpot, 99),
        e2e_avg_ms=e2e_avg, e2e_p50_ms=_pct(e2e, 50), e2e_p95_ms=_pct(e2e, 95), e2e_p99_ms=_pct(e2e, 99),
        output_throughput_tps=_per_second(sum(r.counted_tokens for r in ok) + cut_tokens, duration_seconds),
        request_throughput_rps=_per_second(len(ok), duration_seconds),
        decode_tps_client_avg=_mean(client_tps),
        decode_tps_server_avg=_mean(server_tps),
        output_tokens_client=sum(r.output_tokens for r in ok),
        output_tokens_server=sum(r.eval_count for r in counted) if counted else None,
        server_counted_requests=len(counted),
        token_count_mismatches=mismatches,
        token_count_mismatch=mismatches > 0 if counted else None,
        prompt_tokens=sum(prompt) if prompt else None,
        prompt_tokens_avg=_mean(prompt),
        slo=slo if good is not None else None,
        good_requests=good,
        goodput_share=(good / len(measured) if measured else 0.0) if good is not None else None,
        goodput_rps=_per_second(good, duration_seconds) if good is not None else None,
        cpu_seconds=summary.cpu_seconds,
        cpu_seconds_per_1k_tokens=cpu_per_1k,
        configured_concurrency=configured,
        delivered_concurrency=delivered,
        **lag,
        client_saturated=saturated,
        saturation_reasons=reasons,
        **reasoning,
    )


# --------------------------------------------------------------------- energy


class Energy(BaseModel):
    """The cell's GPUs' energy while it was measured, from the power readings telemetry took
    (nvidia-smi's ``power.draw`` of each of the cell's GPUs, every sample interval): see
    docs/metrics.md, "Energy". Where no GPU reported its power the figures are ``None`` and
    ``missing`` says why: never a zero."""

    model_config = ConfigDict(frozen=True)

    #: The cell's GPUs that reported their power, and their readings taken while a measured
    #: request was in flight (warm-ups and gaps between repeated runs left out).
    gpus: int = 0
    samples: int = 0
    #: The median time between two readings of one GPU.
    sample_interval_s: float | None = None
    #: The GPUs' power together: the sum over the GPUs of each one's mean reading.
    mean_power_w: float | None = None
    #: ``mean_power_w`` x the measured duration.
    energy_j: float | None = None
    #: ``mean_power_w / output_tokens_per_second``: energy per output token.
    joules_per_output_token: float | None = None
    #: ``output_tokens_per_second / mean_power_w`` (tokens per joule).
    output_tokens_per_second_per_watt: float | None = None
    #: The standard error of ``mean_power_w`` (each GPU's sample standard deviation / sqrt(readings),
    #: added in quadrature), as a percentage of it; it carries over to the other figures. Readings
    #: a sample interval apart miss what happens between them: a spike shorter than the interval
    #: is not in it. None with fewer than two readings of a GPU.
    uncertainty_pct: float | None = None
    missing: str | None = None


def energy_of(samples: Sequence[GpuSample], records: Iterable[RequestRecord], duration_seconds: float,
              output_tokens_per_second: float | None) -> Energy:
    """:class:`Energy` of a cell from its GPUs' ``samples`` and its ``records`` (the measured ones
    say when the load ran), the measured duration and the output throughput."""
    spans = _merged(sorted((r.started_at, r.started_at + r.latency_ms / 1000.0) for r in records if not r.warmup))
    if not samples:
        return Energy(missing="no GPU readings were taken")
    starts = [start for start, _ in spans]
    by_gpu: dict[int, list[GpuSample]] = {}
    for sample in samples:
        if sample.power_draw_w is None or not math.isfinite(sample.power_draw_w):
            continue
        at = bisect.bisect_right(starts, sample.t) - 1
        if at >= 0 and sample.t <= spans[at][1]:
            by_gpu.setdefault(sample.gpu, []).append(sample)
    if not by_gpu:
        reported = any(s.power_draw_w is not None for s in samples)
        return Energy(missing="no power reading was taken while measured requests ran" if reported
                      else "the GPU reports no power draw (nvidia-smi: [N/A])")
    readings = {gpu: [s.power_draw_w for s in found if s.power_draw_w is not None] for gpu, found in by_gpu.items()}
    power = sum(statistics.fmean(watts) for watts in readings.values())
    gaps = [b - a for found in by_gpu.values() for a, b in itertools.pairwise(sorted(s.t for s in found)) if b > a]
    base = Energy(gpus=len(by_gpu), samples=sum(len(w) for w in readings.values()),
                  sample_interval_s=statistics.median(gaps) if gaps else None)
    if power <= 0:
        return base.model_copy(update={"missing": "the GPUs reported 0 W while measured"})
    spread = (math.sqrt(sum(statistics.variance(w) / len(w) for w in readings.values())) / power * 100.0
              if all(len(w) > 1 for w in readings.values()) else None)
    rate = output_tokens_per_second if output_tokens_per_second and output_tokens_per_second > 0 else None
    return base.model_copy(update={
        "mean_power_w": power,
        "energy_j": power * duration_seconds if duration_seconds > 0 else None,
        "joules_per_output_token": power / rate if rate else None,
        "output_tokens_per_second_per_watt": rate / power if rate else None,
        "uncertainty_pct": spread,
    })


def _merged(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted ``(start, end)`` spans with the overlapping ones joined."""
    joined: list[tuple[float, float]] = []
    for start, end in spans:
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return joined
