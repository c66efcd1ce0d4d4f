"""A point of a throughput-interactivity frontier: one load on one session, as the report draws it.

A frontier (SemiAnalysis InferenceX, vLLM's ``bench sweep plot_pareto``, AIPerf's
``plot``) plots a server's throughput per GPU against how fast each user sees tokens
(interactivity) at several loads. The field defines interactivity three ways, and
every point stores all three (docs/metrics.md, "Frontiers"):

* ``tpot_interactivity``: ``1000 / tpot_p50_ms``, the median request's decode speed
  after its first token (InferenceX's "interactivity", 1/TPOT). **The primary one**: it
  is the speed a reader watches the answer stream at, the figure a user's requirement
  ("30 tokens/s per user") names, and it does not depend on how the load was offered
  (closed-loop concurrency or open-loop rate), so points of every kind of load compare.
* ``per_user_throughput``: ``output_tokens_per_second / concurrency``, the output
  throughput shared equally among the streams in flight (vLLM's ``plot_pareto``). It
  counts queueing and prefill time against the user, but only a closed-loop load has a
  concurrency to divide by: None for a rate point.
* ``ntpot_interactivity``: ``1000 / p90(latency_ms / output_tokens)``, the 90th
  percentile of each request's end-to-end time per output token, inverted
  (InferenceX AgentX, llm-d's normalised TPOT): TTFT included, so long prompts and
  queues count, and a slow tail counts.

:func:`frontier_point` computes a point from one run's records; ``run/cell_benchmark.py``
calls it per step of a ``concurrency: sweep`` (``details["frontier"]``) and the report
reads a single-load cell as a one-point frontier. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from ..figures import cost_per_million_tokens
from ..matrix.thresholds import Slo
from ..remote.readings import RequestRecord
from .metrics import DetailedMetrics, Energy, detailed_metrics
from .results import percentile

__all__ = ["PRIMARY_INTERACTIVITY", "FrontierPoint", "frontier_point", "ntpot_interactivity"]

#: The interactivity the report's frontiers and cost-at-target answers use (see the module's docstring).
PRIMARY_INTERACTIVITY = "tpot_interactivity"


class FrontierPoint(BaseModel):
    """One load's figures: the x and y of the frontier charts and what a reader checks beside them.

    Names are the figure registry's (docs/metrics.md). A figure not measured is None, never 0.
    """

    model_config = ConfigDict(frozen=True)

    #: The load: requests kept in flight (closed loop), or the offered request rate (open loop).
    concurrency: int | None = None
    rate: float | None = None
    #: The server's own limit on sequences batched at once (vLLM ``--max-num-seqs``, llama.cpp
    #: ``-np``, ``OLLAMA_NUM_PARALLEL`` ...) the point was measured under; None: not known.
    batch_limit: int | None = None
    gpus: int = 1
    requests: int = 0
    duration_seconds: float = 0.0
    #: Which run of the cell's records this point is (``run_index`` of its requests).
    run_index: int = 0

    output_tokens_per_second: float | None = None
    output_tokens_per_second_per_gpu: float | None = None
    request_throughput_rps: float | None = None

    tpot_interactivity: float | None = None
    per_user_throughput: float | None = None
    ntpot_interactivity: float | None = None

    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput_share: float | None = None

    #: ``cost_per_million_tokens`` at the billed ``price_per_hour`` of the session (all its GPUs).
    price_per_hour: float | None = None
    cost_per_million_tokens: float | None = None

    joules_per_output_token: float | None = None
    output_tokens_per_second_per_watt: float | None = None

    def interactivity(self, definition: str = PRIMARY_INTERACTIVITY) -> float | None:
        """The point's interactivity by one of the three definitions (a field name)."""
        if definition not in ("tpot_interactivity", "per_user_throughput", "ntpot_interactivity"):
            raise ValueError(f"unknown interactivity definition {definition!r}")
        return getattr(self, definition)


def ntpot_interactivity(records: Iterable[RequestRecord]) -> float | None:
    """``1000 / p90(latency_ms / output_tokens)`` over the successful measured requests with output."""
    normalised = [r.latency_ms / r.output_tokens for r in records
                  if not r.warmup and r.ok and r.output_tokens > 0 and r.latency_ms > 0]
    if not normalised:
        return None
    return 1000.0 / percentile(normalised, 90)


def frontier_point(records: Iterable[RequestRecord], duration_seconds: float, *, concurrency: int | None = None,
                   rate: float | None = None, gpus: int = 1, price_per_hour: float | None = None,
                   batch_limit: int | None = None, energy: Energy | None = None, slo: Slo | None = None,
                   run_index: int = 0, metrics: DetailedMetrics | None = None) -> FrontierPoint:
    """The point of one run: its records (warm-ups dropped), its measured duration and its load.

    ``metrics``, when the caller has them, saves computing :class:`DetailedMetrics` again.
    """
    every = list(records)
    if metrics is None:
        metrics = detailed_metrics(every, duration_seconds, slo=slo if slo is not None and slo.is_set else None,
                                   concurrency=concurrency)
    output = metrics.output_throughput_tps
    gpus = max(gpus, 1)
    cost = cost_per_million_tokens(price_per_hour, output) if price_per_hour and output else None
    return FrontierPoint(
        concurrency=concurrency, rate=rate, batch_limit=batch_limit, gpus=gpus, requests=metrics.requests,
        duration_seconds=round(duration_seconds, 3), run_index=run_index,
        output_tokens_per_second=output,
        output_tokens_per_second_per_gpu=output / gpus if output is not None else None,
        request_throughput_rps=metrics.request_throughput_rps,
        tpot_interactivity=1000.0 / metrics.tpot_p50_ms if metrics.tpot_p50_ms else None,
        per_user_throughput=output / concurrency if output is not None and concurrency else None,
        ntpot_interactivity=ntpot_interactivity(every),
        ttft_p50_ms=metrics.ttft_p50_ms, ttft_p95_ms=metrics.ttft_p95_ms, ttft_p99_ms=metrics.ttft_p99_ms,
        tpot_p50_ms=metrics.tpot_p50_ms, tpot_p95_ms=metrics.tpot_p95_ms, tpot_p99_ms=metrics.tpot_p99_ms,
        e2e_p50_ms=metrics.e2e_p50_ms, e2e_p95_ms=metrics.e2e_p95_ms, e2e_p99_ms=metrics.e2e_p99_ms,
        goodput_share=metrics.goodput_share, price_per_hour=price_per_hour, cost_per_million_tokens=cost,
        joules_per_output_token=energy.joules_per_output_token if energy is not None else None,
        output_tokens_per_second_per_watt=energy.output_tokens_per_second_per_watt if energy is not None else None,
    )
