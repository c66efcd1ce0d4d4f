"""The command line over the matrix: ``--gpubench-duration`` and friends applied to a cell.

Light (the matrix and the settings only): collection applies it to every cell
before ordering the run.
"""

from __future__ import annotations

from .cells import Cell
from ..settings import MIN_SANDBOX_INTERVAL, Settings


def apply_overrides(cell: Cell, settings: Settings) -> Cell:
    """Apply ``--gpubench-duration`` and friends on top of what the matrix says."""
    workload: dict[str, object] = {}
    if settings.duration is not None:
        workload["duration"] = settings.duration
    if settings.progress_interval is not None:
        workload["progress_interval"] = settings.progress_interval
    if settings.telemetry_interval is not None:
        workload["telemetry_interval"] = settings.telemetry_interval
    if settings.stall_timeout is not None:
        workload["stall_timeout"] = settings.stall_timeout
    if settings.benchmark_scale != 1.0:
        # The run's own sandbox: the benchmark runs on the sandbox's clock, as its
        # setup does (the stall timeout is scaled where it is used). No warm-up
        # requests: the runtime's one-token warm-up has loaded the model, and an
        # emulated GPU has nothing else to warm, while a full-length warm-up at a slow
        # model's real rate (256 tokens at 3.6 tokens/s: 71 s) would outlast the run.
        current = cell.workload.model_copy(update=workload)
        workload.update(
            duration=settings.benchmark_seconds(current.duration),
            progress_interval=settings.benchmark_seconds(current.progress_interval, MIN_SANDBOX_INTERVAL),
            telemetry_interval=settings.benchmark_seconds(current.telemetry_interval, MIN_SANDBOX_INTERVAL),
            warmup_requests=0,
        )
        sweep = current.sweep
        if sweep is not None and sweep.duration is not None:  # each step of a saturation sweep, likewise
            workload["sweep"] = sweep.model_copy(update={"duration": settings.benchmark_seconds(sweep.duration)})
    update: dict[str, object] = {}
    if workload:
        update["workload"] = cell.workload.model_copy(update=workload)
    if settings.max_price is not None:
        cap = settings.max_price if cell.offer.max_price is None else min(settings.max_price, cell.offer.max_price)
        update["offer"] = cell.offer.model_copy(update={"max_price": cap})
    if settings.ollama_install:
        update["ollama_install"] = settings.ollama_install
    if settings.reuse is not None and cell.launch is None:  # an entrypoint session serves its one cell
        update["reuse"] = settings.reuse
    return cell.model_copy(update=update) if update else cell
