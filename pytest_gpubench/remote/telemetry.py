"""GPU telemetry during a benchmark: one long-lived ``nvidia-smi -l`` over SSH.

:func:`sample_gpus` starts ``nvidia-smi --query-gpu=timestamp,index,... -l N`` (or
``-lms N`` below a second) on the instance and parses its CSV lines as they arrive,
until the caller sets a stop event; then the remote command is terminated (a
signal, then closing the channel: its next write fails and it exits, as under
OpenSSH's sshd). It never raises for bad lines, an ``nvidia-smi`` that fails, or a
lost connection: it returns the samples it got. :func:`summarize_gpu` turns the
samples into the result's :class:`~pytest_gpubench.remote.readings.GPUStats`.

nvidia-smi stamps each line with the instance's local time and no zone
(``2026/11/22 03:00:01.123``). The zone is inferred from the first line: the
difference between that reading and this machine's clock, rounded to the nearest
quarter hour, is the instance's UTC offset (clock skew is far below 7.5 minutes on
NTP-synced machines). Sample times are therefore the instance's own UTC clock, the
clock its load generator also stamps requests with; a line without a readable
timestamp gets its arrival time here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from ..gpuinfo import parse_gpu_query_csv
from ..errors import one_line
from .readings import GPUStats

__all__ = [
    "QUERY_FIELDS",
    "GpuSample",
    "RemoteClock",
    "nvidia_smi_loop_command",
    "parse_sample_line",
    "sample_gpus",
    "summarize_gpu",
]

log = logging.getLogger("pytest_gpubench.remote.telemetry")

QUERY_FIELDS = ("timestamp", "index", "utilization.gpu", "memory.used", "temperature.gpu", "power.draw")
_TIMESTAMP_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")
_QUARTER_HOUR = 900.0


class GpuSample(BaseModel):
    """One reading of one GPU; a value nvidia-smi could not give (``[N/A]``) is ``None``."""

    model_config = ConfigDict(frozen=True)

    t: float  # unix seconds
    gpu: int
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None


class _Streams(Protocol):
    """What :func:`sample_gpus` needs of a connection (``remote.ssh.Connection``)."""

    def stream_lines(self, command: str, *, stdin: str) -> AsyncIterator[str]: ...


def nvidia_smi_loop_command(interval: float) -> str:
    """The remote command: ``-l SECONDS`` for whole seconds, else ``-lms MILLISECONDS``."""
    if not interval > 0 or not math.isfinite(interval):
        raise ValueError(f"the telemetry interval must be a positive number of seconds, got {interval!r}")
    if interval >= 1 and float(interval).is_integer():
        loop = f"-l {int(interval)}"
    else:
        loop = f"-lms {max(1, round(interval * 1000))}"
    return f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits {loop}"


class RemoteClock:
    """Turns nvidia-smi's zone-less local timestamps into unix seconds (see the module doc)."""

    def __init__(self) -> None:
        self.offset: float | None = None  # the instance's UTC offset in seconds, once known

    def to_unix(self, stamp: str | None, arrival: float) -> float:
        """Unix time of ``stamp`` (read at ``arrival``); ``arrival`` when it is unreadable."""
        naive = _parse_timestamp(stamp)
        if naive is None:
            return arrival
        wall = naive.replace(tzinfo=timezone.utc).timestamp()  # the local reading as if it were UTC
        if self.offset is None:
            self.offset = round((wall - arrival) / _QUARTER_HOUR) * _QUARTER_HOUR
        return wall - self.offset


def _parse_timestamp(stamp: str | None) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return datetime.strptime(stamp.strip(), fmt)
        except ValueError:
            continue
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def parse_sample_line(line: str, *, arrival: float, clock: RemoteClock | None = None) -> GpuSample | None:
    """One ``timestamp,index,utilization.gpu,memory.used,temperature.gpu,power.draw`` line.

    ``None`` for a line that is not a reading (an error message, a header, garbage):
    a reading needs at least a GPU index. Values nvidia-smi reports as ``[N/A]``,
    ``[Not Supported]`` or anything unreadable become ``None``. Never raises.
    """
    try:
        rows = parse_gpu_query_csv(line, QUERY_FIELDS)
    except Exception:  # noqa: BLE001 - a malformed line is skipped, never fatal
        return None
    if len(rows) != 1:
        return None
    row = rows[0]
    index = row.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return None
    memory = _number(row.get("memory.used"))
    stamp = row.get("timestamp")
    return GpuSample(
        t=(clock or RemoteClock()).to_unix(stamp if isinstance(stamp, str) else None, arrival),
        gpu=index,
        utilization_pct=_number(row.get("utilization.gpu")),
        memory_used_mib=round(memory) if memory is not None else None,
        temperature_c=_number(row.get("temperature.gpu")),
        power_draw_w=_number(row.get("power.draw")),
    )


async def sample_gpus(
    conn: _Streams,
    interval: float,
    stop: asyncio.Event,
    *,
    on_sample: Callable[[GpuSample], None] | None = None,
) -> list[GpuSample]:
    """Sample every GPU each ``interval`` seconds until ``stop`` is set; return the samples.

    Runs one remote ``nvidia-smi ... -l``/``-lms`` command through
    ``conn.stream_lines`` and parses its lines as they come; ``on_sample`` (if given)
    is called with each sample as it arrives. When ``stop`` is set the remote command
    is terminated. Bad lines are skipped; an ``nvidia-smi`` that exits (missing,
    broken driver) or a lost connection ends sampling early, with what was read so
    far. Only cancelling the caller's own task propagates (as ``CancelledError``):
    use ``stop`` to end sampling and keep the samples. An ``interval`` that is not a
    positive number is a ``ValueError``, raised before anything starts.
    """
    command = nvidia_smi_loop_command(interval)
    samples: list[GpuSample] = []
    clock = RemoteClock()
    lines = conn.stream_lines(command, stdin="")

    async def consume() -> None:
        async for line in lines:
            sample = parse_sample_line(line, arrival=time.time(), clock=clock)
            if sample is None:
                if line.strip():
                    log.debug("nvidia-smi telemetry: skipped line %r", line[:200])
                continue
            samples.append(sample)
            if on_sample is not None:
                try:
                    on_sample(sample)
                except Exception:  # noqa: BLE001 - a caller's callback must not end sampling
                    log.exception("nvidia-smi telemetry: on_sample callback failed")

    reader = asyncio.ensure_future(consume())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({reader, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        # Cancelling the reader runs stream_lines' cleanup, which terminates the
        # remote command and closes its channel; wait for that without letting the
        # reader's outcome escape.
        reader.cancel()
        await asyncio.wait({reader})
        try:
            await lines.aclose()  # in case the reader never started iterating
        except Exception:  # noqa: BLE001
            pass
    if not reader.cancelled() and (exc := reader.exception()) is not None:
        log.info("nvidia-smi telemetry ended early: %s", str(exc) or type(exc).__name__)
    elif not stop.is_set():
        log.info(
            "nvidia-smi telemetry ended early: exit status %s %s",
            getattr(conn, "last_exit_status", None),
            one_line(getattr(conn, "last_stderr", "") or "").strip()[-200:],  # the instance's text: no escapes
        )
    return samples


def _stats(values: Iterable[float | int | None]) -> tuple[float, float]:
    present = [float(v) for v in values if v is not None]
    if not present:
        return 0.0, 0.0
    return sum(present) / len(present), max(present)


def summarize_gpu(samples: Sequence[GpuSample]) -> GPUStats:
    """Average and maximum of each reading over all samples of all GPUs.

    ``None`` values are left out of their own figure only; a figure with no values
    (or no samples at all) is zero. Memory is whole MiB, as the Go ``GPUStats`` has it.
    """
    utilization = _stats(s.utilization_pct for s in samples)
    memory = _stats(s.memory_used_mib for s in samples)
    temperature = _stats(s.temperature_c for s in samples)
    power = _stats(s.power_draw_w for s in samples)
    return GPUStats(
        avg_utilization_pct=utilization[0],
        max_utilization_pct=utilization[1],
        avg_memory_used_mib=round(memory[0]),
        max_memory_used_mib=round(memory[1]),
        avg_temperature_c=temperature[0],
        max_temperature_c=temperature[1],
        avg_power_draw_w=power[0],
        max_power_draw_w=power[1],
    )
