"""Measure one cell on a ready runtime: repeated runs with GPU telemetry, then judge.

One *run* is one load-generator session (warm-up requests only in the first).
``runs: N`` repeats it N times on the same rented session; ``runs: {until_cv}``
repeats until the runs' decode_tokens_per_second agree. GPU telemetry is sampled over SSH while
each run streams. What the BenchmarkResult shape cannot hold (detailed metrics,
validity, cold start, run statistics, the load generator's health) goes into
``details``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .benchmark import LoadgenPass, BenchmarkPlan, run_benchmark
from ..errors import BenchmarkInterrupted
from ..figures import output_tokens_per_second
from ..matrix.cells import Cell
from . import spec_decode
from .metrics import detailed_metrics, energy_of
from ..remote.ssh import Connection
from .results import RunStatistics, summarize, until_cv_reached
from ..remote.readings import RequestRecord
from ..runtimes.base import Runtime
from ..remote.telemetry import GpuSample, sample_gpus
from .validity import judge
from ..cloud.watch import SessionWatch

#: Request indexes of run k start at k * RUN_STRIDE, so records of all runs stay distinct.
RUN_STRIDE = 1_000_000


@dataclass
class Measurement:
    """Everything the runs produced, so far (also when they were cut short)."""

    records: list[RequestRecord] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[LoadgenPass] = field(default_factory=list)

    @property
    def duration_seconds(self) -> float:
        return sum(outcome.duration_seconds for outcome in self.outcomes)

    def add(self, outcome: LoadgenPass, samples: list[GpuSample], run_index: int) -> None:
        offset = run_index * RUN_STRIDE
        records = [r.model_copy(update={"index": r.index + offset}) for r in outcome.records]
        self.records.extend(records)
        self.samples.extend(samples)
        self.outcomes.append(outcome)
        figures = summarize(records, outcome.duration_seconds or 0.0)
        self.runs.append({
            "run_index": run_index,
            "decode_tokens_per_second": figures.avg_tokens_per_second,
            "output_tokens_per_second": output_tokens_per_second(figures.model_dump()),
            "ttft_p50_ms": figures.p50_ttft_ms,
            "requests": figures.total_requests,
            "duration_seconds": outcome.duration_seconds,
            "outlier": False,
        })

    def mark(self) -> tuple[int, int, int, int]:
        """Where the measurement stands now, for :meth:`rewind`."""
        return len(self.records), len(self.samples), len(self.runs), len(self.outcomes)

    def rewind(self, mark: tuple[int, int, int, int]) -> None:
        """Forget everything added since ``mark`` (a run measured again)."""
        records, samples, runs, outcomes = mark
        del self.records[records:], self.samples[samples:], self.runs[runs:], self.outcomes[outcomes:]

    def statistics(self) -> RunStatistics | None:
        values = [run["decode_tokens_per_second"] for run in self.runs]
        if not values:
            return None
        stats = RunStatistics.from_values(values)
        for index in stats.outliers:
            self.runs[index]["outlier"] = True
        return stats


def enough_runs(cell: Cell, runs_override: int | None, values: list[float]) -> bool:
    """Whether the measurement is complete after ``values`` (tokens/s per run)."""
    runs = cell.runs
    if runs_override is not None:
        return len(values) >= runs_override
    if runs.until_cv is None:
        return len(values) >= (runs.count or runs.max)
    return until_cv_reached(values, runs.until_cv, runs.max, runs.min)


async def measure_once(runtime: Runtime, plan: BenchmarkPlan, *, timeout: float, telemetry_interval: float,
                       on_event: Callable[[dict[str, Any]], None], watch: SessionWatch | None = None,
                       reconnect: Callable[[], Awaitable[Connection]] | None = None,
                       ) -> tuple[LoadgenPass, list[GpuSample]]:
    """One run with nvidia-smi sampled beside it. Samples survive an interrupted run.

    ``watch`` and ``reconnect`` go to :func:`run_benchmark`: a lost instance ends the
    run at once, a lost connection is made up for from the instance's checkpoint.
    """
    stop = asyncio.Event()
    endpoint = runtime.endpoint
    if endpoint.worker_command and not plan.worker_command:  # container workers: what the generator starts
        plan = replace(plan, worker_command=list(endpoint.worker_command))
    # Speculative decoding's counters before and after (a runtime with Prometheus metrics only).
    scrape = getattr(runtime, "prometheus_text", None)
    before = await scrape() if scrape is not None else None
    sampler = asyncio.ensure_future(sample_gpus(runtime.conn, telemetry_interval, stop))
    try:
        outcome = await run_benchmark(runtime.conn, plan, remote_server_url=endpoint.remote_url,
                                      local_server_url=endpoint.local_url, timeout=timeout, on_event=on_event,
                                      watch=watch, reconnect=reconnect)
    except BenchmarkInterrupted as exc:
        stop.set()
        exc.samples = _own_gpus(await sampler, runtime)
        raise
    finally:
        stop.set()
    after = await scrape() if scrape is not None else None
    outcome.spec_decode = spec_decode.acceptance(before, after, runtime=runtime.name)
    return outcome, _own_gpus(await sampler, runtime)


def _own_gpus(samples: list[GpuSample], runtime: Runtime) -> list[GpuSample]:
    """nvidia-smi lists every GPU of the machine: on a shared one, only the cell's GPUs are its readings."""
    return [sample for sample in samples if runtime.placement.owns(sample.gpu)]


def details_of(cell: Cell, measurement: Measurement, runtime: Runtime, *,
               residency: dict[str, Any] | None, compute_capability: str) -> dict[str, Any]:
    """The figures beyond the BenchmarkResult shape, as plain JSON."""
    slo = cell.slo
    single = measurement.outcomes[0].finish if len(measurement.outcomes) == 1 else None
    duration = measurement.duration_seconds or cell.workload.duration
    metrics = detailed_metrics(measurement.records, duration,
                               slo=slo if slo.is_set else None, loadgen=single or None,
                               concurrency=None if cell.rate is not None or cell.sweep is not None
                               or cell.workload.trace is not None else cell.concurrency)
    stats = measurement.statistics()
    prompts = [p if isinstance(p, str) else p.get("prompt", "") for p in cell.workload.prompt_payload()]
    validity = judge([r for r in measurement.records if not r.warmup], prompts, residency)
    first_sample = measurement.samples[0].memory_used_mib if measurement.samples else None
    return {
        "metrics": metrics.model_dump(mode="json"),
        "energy": energy_of(measurement.samples, measurement.records, duration,
                            metrics.output_throughput_tps).model_dump(mode="json"),
        "validity": validity.model_dump(mode="json"),
        "cold_start": {
            "load_seconds": runtime.warmup_load_seconds,
            "first_token_ms": runtime.cold_first_token_ms,
            "vram_used_mib_after_load": first_sample,
        },
        "runs": measurement.runs,
        "run_statistics": stats.model_dump(mode="json") if stats else None,
        # Speculative decoding's acceptance over the measured runs, or None with the reason.
        "spec_decode": spec_decode.combined(outcome.spec_decode for outcome in measurement.outcomes),
        "load": {"concurrency": cell.concurrency, "rate": cell.rate,
                 # Trace replay: the trace's label, requests, speedup and window (matrix/trace.py).
                 **({"trace": cell.workload.trace.describe()} if cell.workload.trace is not None else {})},
        # "instance" (python3 there) or "local" (here, over the SSH forward): latency includes the tunnel.
        "loadgen_where": sorted({outcome.where for outcome in measurement.outcomes}),
        "runtime": {"name": runtime.name, "version": runtime.version, "num_parallel": runtime.num_parallel,
                    "started_here": runtime.started_here,
                    **({"launch_args": list(cell.runtime_args)} if cell.runtime_args else {}),
                    # The GPUs the server spanned: count, tensor-parallel size, CUDA_VISIBLE_DEVICES (runtimes/base.py).
                    **({"gpus": runtime.placement.describe(runtime.tensor_parallel)}
                       if runtime.placement.count > 1 or runtime.placement.indices else {}),
                    # How GPU Shopper launched the instance: mode, image, the image's API port.
                    **({"launch": cell.launch.model_dump(mode="json")} if cell.launch else {})},
        "hardware": {"compute_capability": compute_capability},
        # `requested`: the matrix's think (None: not sent, the runtime's default);
        # `effective`: whether the model did reason (None: nothing to tell from).
        "thinking": {"requested": cell.workload.think,
                     "effective": None if metrics.thinking_tokens is None else metrics.thinking_tokens > 0},
    }
