"""What an instance reports, as the result models hold it.

The GPU Shopper server's Go structs (``internal/benchmark/models.go``) that come from the
instance rather than from the statistics: one request as the instance-side load generator
reports it (:class:`RequestRecord`), the machine system detection found
(:class:`HardwareInfo`) and GPU telemetry over a run (:class:`GPUStats`). Defined here, in
``remote/``, because the checkpoint reader, system detection, telemetry and the runtimes'
VRAM check build or read them; :mod:`pytest_gpubench.measure.results` holds them in a
``BenchmarkResult``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["GPUStats", "HardwareInfo", "RequestRecord", "ValueModel"]


class ValueModel(BaseModel):
    """Base of the result's value models (these and measure/results.py's): immutable, and
    tolerant of fields a newer peer adds."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class RequestRecord(ValueModel):
    """One request of the load generator, as it emits it (one JSON object per request).

    ``latency_ms`` runs from sending the request to the final chunk; ``output_tokens``
    counts the text chunks the client received, ``eval_count`` / ``eval_duration_ns`` /
    ``prompt_tokens`` are the server's own counters when it reports them.
    ``tokens_per_second`` is the client-measured decode rate, see
    :func:`~pytest_gpubench.measure.results.decode_tokens_per_second`.
    """

    index: int
    warmup: bool = False
    prompt_index: int
    started_at: float
    ttft_ms: float | None = None
    latency_ms: float
    output_tokens: int
    eval_count: int | None = None
    eval_duration_ns: int | None = None
    prompt_tokens: int | None = None
    tokens_per_second: float | None = None
    error: str | None = None
    # Added for issue 3's metrics; None when the generator or server did not say.
    scheduled_at: float | None = None  # seconds after the run's start the request was due
    send_lag_ms: float | None = None  # actual send time minus scheduled: a saturated client shows here
    itl_mean_ms: float | None = None  # mean gap between consecutive tokens (first token excluded)
    itl_max_ms: float | None = None
    tpot_ms: float | None = None  # (last token - first token) / (output_tokens - 1)
    server_tokens_per_second: float | None = None  # eval_count / eval_duration
    prompt_eval_duration_ns: int | None = None
    load_duration_ns: int | None = None
    total_duration_ns: int | None = None
    done_reason: str | None = None
    matched: bool | None = None  # quality check: None when the prompt expects nothing
    # Reasoning models (issue 9); None when the generator did not say. ``output_tokens``
    # and ``ttft_ms`` count every generated token, reasoning included.
    ttfat_ms: float | None = None  # time to the first answer token; None without an answer
    thinking_tokens: int | None = None  # token chunks of reasoning ("thinking")
    # Still streaming when the run's time ran out, and cut there (``cut_at_deadline``,
    # the sandbox's clock): neither a success nor an error.
    incomplete: bool = False
    # Conversations and prefix reuse (issue 23); None when the generator did not say.
    conversation: int | None = None  # the conversation this request is a turn of (numbered from 0)
    turn: int | None = None  # its turn in that conversation, from 1
    sent_prompt_tokens: int | None = None  # the prompt's length by the tokenizer-free rule (1.3 per word)
    cacheable_prompt_tokens: int | None = None  # of those, a prefix already sent (history, shared system prompt)
    cached_prompt_tokens: int | None = None  # the server's count of prompt tokens its prefix cache served

    @property
    def ok(self) -> bool:
        """True when the request completed without an error."""
        return self.error is None and not self.incomplete

    @property
    def streamed(self) -> bool:
        """True when what it received is a measurement: it completed, or the deadline cut it.

        A cut request's TTFT, token gaps and decode rate are as real as a finished
        one's; its end-to-end latency is not a request's latency.
        """
        return self.error is None

    @property
    def counted_tokens(self) -> int:
        """Output tokens of this request: the server's ``eval_count`` when present.

        The server counts real tokens; the client counts chunks, which only equal
        tokens for runtimes that stream one token per chunk.
        """
        return self.eval_count if self.eval_count is not None else self.output_tokens


class HardwareInfo(ValueModel):
    """The machine the benchmark ran on (Go ``HardwareInfo``)."""

    gpu_name: str = ""
    gpu_memory_mib: int = 0
    gpu_count: int = 0
    driver_version: str = ""
    cuda_version: str = ""
    cpu_model: str = ""
    cpu_cores: int = 0
    ram_gib: int = 0


class GPUStats(ValueModel):
    """GPU telemetry over the run (Go ``GPUStats``); the Go side keeps memory as ints."""

    avg_utilization_pct: float = 0.0
    max_utilization_pct: float = 0.0
    avg_memory_used_mib: int = 0
    max_memory_used_mib: int = 0
    avg_temperature_c: float = 0.0
    max_temperature_c: float = 0.0
    avg_power_draw_w: float = 0.0
    max_power_draw_w: float = 0.0
