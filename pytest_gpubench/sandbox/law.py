"""The sandbox's batching and power law, as numbers a test or a report can check a measurement against.

The stand-ins serve by this law (:func:`.ollama_engine.batch_slowdown` stretches each
token's interval and each prefill, :func:`.nvidia_smi_standin.power_draw_w` sets the
card's draw); this module says what a closed-loop load of ``c`` clients should then
measure, from the catalog alone (docs/sandbox.md, "Batching and power law"):

- ``b = min(c, slots)`` sequences run at once, ``s = 1 + (b - 1) / F`` (``F``: the
  runtime's ceiling factor on that GPU and model);
- per stream ``r1 / s`` tokens/s (1000 / TPOT), all together ``b * r1 / s`` while
  they decode; with ``n`` output tokens a request holds its slot ``s * (ttft1 + n / r1)``
  (prefill, then ``n`` steps, the last one the end of sequence), so the output
  throughput is ``b * n`` over that;
- TTFT ``s * ttft1``, plus, when ``c`` exceeds the slots, the wait in the queue
  ``D * (c / b - 1)`` (Little's law for a closed loop);
- power ``idle + (limit - idle) * b / (b + k)`` per card, so energy per output token
  is that over the output throughput.
"""

from __future__ import annotations

from typing import NamedTuple

from .catalog import Catalog, load_catalog
from .nvidia_smi_standin import IDLE_POWER_FRACTION, power_draw_w
from .ollama_engine import batch_slowdown


class LawPoint(NamedTuple):
    """What the law predicts at one load (unpacks as ``aggregate, per_stream, ttft_ms``)."""

    output_tps: float  # all streams' output tokens per second
    per_stream_tps: float  # one stream's decode rate, 1000 / TPOT
    ttft_ms: float  # time to first token, the queue's wait included


def batched_point(rate: float, ttft_ms: float, factor: float | None, concurrency: int, *,
                  output_tokens: int | None = None, parallel: int | None = None) -> LawPoint:
    """The law for one model on one card: single-stream ``rate`` (tokens/s) and ``ttft_ms``,
    ceiling factor ``factor`` (None or 0: parallel sequences cost nothing).

    ``output_tokens`` (per request) counts each request's prefill in the throughput and
    gives the queue's wait; without it the throughput is the batch's decode rate, and a
    ``concurrency`` above ``parallel`` (the server's slots; None: as many as asked) is refused.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    batch = min(concurrency, parallel) if parallel else concurrency
    slowdown = batch_slowdown(batch, factor)
    per_stream = rate / slowdown
    ttft = ttft_ms * slowdown
    if output_tokens is None:
        if batch < concurrency:
            raise ValueError("a queue's wait depends on how long requests are: give output_tokens")
        return LawPoint(batch * per_stream, per_stream, ttft)
    held = ttft / 1000 + output_tokens / per_stream  # seconds a request holds its slot
    wait = held * (concurrency / batch - 1)
    return LawPoint(batch * output_tokens / held, per_stream, ttft + wait * 1000)


def expected_point(gpu: str, model: str, runtime: str, concurrency: int, *, provider: str = "",
                   output_tokens: int | None = None, parallel: int | None = None,
                   catalog: Catalog | None = None) -> LawPoint:
    """What the sandbox's ``runtime`` serving ``model`` on one ``gpu`` (catalog names:
    ``"RTX 4090"``, ``"qwen2:7b"``, ``"vllm"``) should measure at ``concurrency``.

    ``provider`` picks the provider's own rate rows (as an offer's instance does); the
    catalog is the shipped one unless given. See :func:`batched_point` for the rest.
    """
    catalog = catalog or load_catalog()
    rate, ttft_ms, _origin = catalog.rate(gpu, provider, model)
    factor = catalog.batch_ceiling(gpu, provider, model, runtime) / rate
    return batched_point(rate, ttft_ms, factor, concurrency, output_tokens=output_tokens, parallel=parallel)


def expected_power_w(limit_w: float, batch: int, *, heat: float = 1.0, model_loaded: bool = True) -> float:
    """One card's draw (watts, without the readings' small wobble) with ``batch`` sequences
    generating; the idle draw at 0. ``heat``: 0 a cold card .. 1 one that has run for a minute."""
    idle = limit_w * (IDLE_POWER_FRACTION + 0.02 * heat) + (6 if model_loaded else 0)
    return power_draw_w(limit_w, batch, idle)
