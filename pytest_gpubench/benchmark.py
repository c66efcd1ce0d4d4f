"""Run the load generator next to the model and gather its event stream.

The generator (``remote/loadgen.py``) is sent as the stdin of ``python3 -`` on the
instance; its config travels as one quoted argument. Without python3 there, the
same script runs here against the SSH-forwarded Ollama port (DESIGN decision 7).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import ValidationError

from .errors import BenchmarkInterrupted, Stage, StageError
from .remote.ssh import Connection, quote
from .results import RequestRecord

LOADGEN_SOURCE = resources.files("pytest_gpubench.remote").joinpath("loadgen.py").read_text()


@dataclass
class BenchmarkPlan:
    """What the load generator is asked to do."""

    model: str
    duration: float
    max_tokens: int
    prompts: list[Any]  # strings, or {"prompt", "expect"} for quality checks
    warmup_requests: int
    progress_interval: float
    checkpoint_every: int
    checkpoint_path: str
    concurrency: int = 1
    rate: float | None = None
    seed: int = 0
    request_timeout: float = 120.0

    def config(self, ollama_url: str) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "seed": self.seed,
            "ollama_url": ollama_url,
            "model": self.model,
            "duration": self.duration,
            "max_tokens": self.max_tokens,
            "prompts": self.prompts,
            "warmup_requests": self.warmup_requests,
            "progress_interval": self.progress_interval,
            "checkpoint_every": self.checkpoint_every,
            "checkpoint_path": self.checkpoint_path,
            "concurrency": self.concurrency,
            "request_timeout": self.request_timeout,
        }


@dataclass
class BenchmarkOutcome:
    """Every record the run produced, in arrival order, and how it ended."""

    records: list[RequestRecord] = field(default_factory=list)
    duration_seconds: float = 0.0
    status: str = "running"
    message: str = ""
    where: str = "instance"
    #: The generator's own summary from its finish event (ITL, CPU, lag, load).
    finish: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]

    @property
    def successful(self) -> int:
        return sum(1 for r in self.measured if r.ok)

    def merge(self, records: list[RequestRecord]) -> None:
        """Add checkpointed records this stream did not deliver."""
        seen = {r.index for r in self.records}
        self.records.extend(r for r in records if r.index not in seen)
        self.records.sort(key=lambda r: r.index)


async def run_benchmark(
    conn: Connection,
    plan: BenchmarkPlan,
    *,
    remote_ollama_url: str,
    local_ollama_url: str,
    timeout: float,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> BenchmarkOutcome:
    """Run ``plan`` and return its outcome.

    Raises ``BenchmarkInterrupted`` (carrying the partial outcome) when the run
    ends early, and ``StageError`` when nothing at all was measured.
    """
    outcome = BenchmarkOutcome()
    has_python = (
        await conn.run("command -v python3", stage=Stage.BENCHMARK, what="looking for python3",
                       timeout=30, check=False)
    ).ok
    if has_python:
        command = "python3 - " + quote(json.dumps(plan.config(remote_ollama_url)))
        lines = conn.stream_lines(command, stdin=LOADGEN_SOURCE)
    else:
        outcome.where = "local"
        lines = _local_lines(plan.config(local_ollama_url))
    try:
        await asyncio.wait_for(_consume(lines, outcome, on_event), timeout)
    except asyncio.TimeoutError:
        outcome.status, outcome.message = "interrupted", f"benchmark exceeded its {timeout:.0f} s budget"
    except (OSError, StageError, Exception) as exc:  # noqa: BLE001 - any break keeps what was measured
        outcome.status, outcome.message = "interrupted", f"stream broke off: {exc or type(exc).__name__}"
    if outcome.status != "completed" and has_python and plan.checkpoint_path:
        outcome.merge(await _fetch_checkpoint(conn, plan.checkpoint_path))
    if outcome.status == "completed":
        return outcome
    detail = outcome.message or "the load generator ended without a finish event"
    if outcome.successful:
        raise BenchmarkInterrupted(
            f"benchmark interrupted after {outcome.successful} successful requests: {detail}",
            partial=outcome,
        )
    stderr = conn.last_stderr.strip()[-300:]
    raise StageError(Stage.BENCHMARK, f"no request succeeded: {detail}" + (f"; {stderr}" if stderr else ""))


async def _consume(
    lines: AsyncIterator[str],
    outcome: BenchmarkOutcome,
    on_event: Callable[[dict[str, Any]], None] | None,
) -> None:
    async for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a stray line on stdout is not an event
        kind = event.pop("event", None)
        if kind == "request":
            try:
                outcome.records.append(RequestRecord.model_validate(event))
            except ValidationError:
                continue
        elif kind == "finish":
            outcome.finish = dict(event)
            outcome.status = event.get("status", "completed")
            outcome.duration_seconds = float(event.get("duration_seconds") or 0.0)
            outcome.message = str(event.get("message") or "")
        if on_event is not None and kind is not None:
            on_event({"event": kind, **event})


async def _local_lines(config: dict[str, Any]) -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-", json.dumps(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(LOADGEN_SOURCE.encode())
    process.stdin.close()
    try:
        async for raw in process.stdout:
            yield raw.decode("utf-8", "replace").rstrip("\n")
        await process.wait()
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


async def _fetch_checkpoint(conn: Connection, path: str) -> list[RequestRecord]:
    """Read the instance-side checkpoint with ``cat`` (seed 001: not SCP)."""
    if conn.closed:
        return []
    try:
        where = quote(path) if path.startswith("/") else f'"$HOME"/{quote(path)}'
        result = await conn.run(f"cat {where}", stage=Stage.RESULTS,
                                what="reading the checkpoint", timeout=30, check=False)
        data = json.loads(result.stdout) if result.ok else {}
        return [RequestRecord.model_validate(r) for r in data.get("results", [])]
    except (StageError, ValueError, ValidationError):
        return []
