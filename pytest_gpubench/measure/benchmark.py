"""Run the load generator next to the model and gather its event stream.

The generator (``remote/loadgen.py``) is sent as the stdin of ``python3 -c`` with a
short bootstrap on the instance, and its config (every prompt of the dataset) follows
the script on the same stdin: never as an argument, which Linux caps at 128 KiB
(``MAX_ARG_STRLEN``), while a ShareGPT-sized dataset is megabytes. Without python3
there, the same script runs here against the SSH-forwarded Ollama port (DESIGN
decision 7), its config sent the same way.

:func:`recover` reads the instance-side checkpoint of a benchmark whose event stream broke off.

The load generator keeps running when its SSH connection goes (it ignores SIGHUP
and a broken stdout) and rewrites a checkpoint file with every record so far,
its pid and a status (seed 001). When the stream is lost while the instance is
still up, the records it did not deliver are read from there, with ``cat`` (not
SCP), over the same connection if it is still open, else over a new one; and
while the generator is still alive the reader waits for its final write, so that
nothing measured after the break is lost either.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BenchmarkInterrupted, InstanceLost, Stage, StageError
from ..remote.ssh import Connection, quote
from ..remote.readings import RequestRecord
from ..cloud.watch import SessionWatch

LOADGEN_SOURCE = resources.files("pytest_gpubench.remote").joinpath("loadgen.py").read_text()

#: Run with ``python3 -c``: reads the load generator from stdin (its length in bytes on the
#: first line, then the script) and runs it as ``__main__``; the script then reads its config,
#: the rest of stdin. Python 3.8's too: the instance's python3 may be old.
LOADGEN_BOOTSTRAP = ("import sys;r=sys.stdin.buffer;n=int(r.readline());"
                     "exec(compile(r.read(n),'gpubench-loadgen','exec'),{'__name__':'__main__'})")
#: The instance's command: short and fixed, whatever the size of the dataset.
LOADGEN_COMMAND = "python3 -c " + quote(LOADGEN_BOOTSTRAP)


def loadgen_input(config: dict[str, Any]) -> str:
    """The load generator's stdin for ``config``: the script's length, the script, then the config (JSON)."""
    return f"{len(LOADGEN_SOURCE.encode())}\n{LOADGEN_SOURCE}{json.dumps(config)}"


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
    think: bool | None = None  # the request's ``think``; None leaves the runtime's default
    cut_at_deadline: bool = False  # requests in flight at the deadline are cut (incomplete), not awaited
    #: The streaming API spoken: "ollama" (/api/generate), "openai-chat" (/v1/chat/completions)
    #: or "openai-completions" (/v1/completions); a Runtime chooses it.
    protocol: str = "ollama"
    #: The name (never the value) of an environment variable on the instance holding a bearer token.
    api_key_env: str | None = None
    #: An https:// endpoint's certificate is verified against this CA file (None: the system's trust store).
    ca_file: str | None = None
    #: ``protocol: worker``: the argv of one container (``docker run ... IMAGE``), run on the instance.
    worker_command: list[str] | None = None
    #: Trace replay: when measured request *i* (prompt *i*) is sent, seconds into the run; None: no trace.
    schedule: list[float] | None = None
    #: At a fixed concurrency, send at most this many requests (the prompts in order), then end:
    #: the accuracy pass asks each problem once (None: requests until the duration ends).
    requests: int | None = None

    def config(self, server_url: str) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "seed": self.seed,
            "server_url": server_url,
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
            "think": self.think,
            "cut_at_deadline": self.cut_at_deadline,
            "protocol": self.protocol,
            "api_key_env": self.api_key_env,
            "ca_file": self.ca_file,
            **({"worker_command": self.worker_command} if self.worker_command else {}),
            **({"schedule": self.schedule} if self.schedule is not None else {}),
            **({"requests": self.requests} if self.requests is not None else {}),
        }


@dataclass
class LoadgenPass:
    """One load-generator pass: every record it produced, in arrival order, and how it ended."""

    records: list[RequestRecord] = field(default_factory=list)
    duration_seconds: float = 0.0
    status: str = "running"
    message: str = ""
    where: str = "instance"
    #: The generator's own summary from its finish event (ITL, CPU, lag, load).
    finish: dict[str, Any] = field(default_factory=dict)
    #: Seconds into the run of the last progress event: a lower bound of a cut-short run's length.
    elapsed: float = 0.0
    #: Records read from the instance's checkpoint that the stream had not delivered.
    recovered: int = 0
    #: Speculative decoding over this run (``measure/spec_decode.py``); None: not scraped.
    spec_decode: dict[str, Any] | None = None

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]

    @property
    def successful(self) -> int:
        return sum(1 for r in self.measured if r.ok)

    def merge(self, records: list[RequestRecord]) -> int:
        """Add checkpointed records this stream did not deliver; returns how many."""
        seen = {r.index for r in self.records}
        new = [r for r in records if r.index not in seen]
        self.records.extend(new)
        self.records.sort(key=lambda r: r.index)
        return len(new)

    def span(self) -> float:
        """Seconds from the run's start to the last measured request's end (0 if unknown)."""
        ends = [r.scheduled_at + ((r.send_lag_ms or 0.0) + r.latency_ms) / 1000
                for r in self.measured if r.scheduled_at is not None]
        return max(ends, default=0.0)


async def run_benchmark(
    conn: Connection,
    plan: BenchmarkPlan,
    *,
    remote_server_url: str,
    local_server_url: str,
    timeout: float,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    watch: SessionWatch | None = None,
    reconnect: Callable[[], Awaitable[Connection]] | None = None,
) -> LoadgenPass:
    """Run ``plan`` and return its outcome.

    Raises ``BenchmarkInterrupted`` (carrying the partial outcome) when the run
    ends early, and ``StageError`` when nothing at all was measured. With
    ``watch``, a session the API reports gone ends the run at once (its reason in
    the message); otherwise a broken stream is completed from the instance's
    checkpoint, read over ``reconnect`` when the connection itself was lost.
    """
    until = time.monotonic() + timeout
    outcome = LoadgenPass()
    has_python = (
        await conn.run("command -v python3", stage=Stage.BENCHMARK, what="looking for python3",
                       timeout=30, check=False)
    ).ok
    if has_python:
        lines = conn.stream_lines(LOADGEN_COMMAND, stdin=loadgen_input(plan.config(remote_server_url)))
    elif plan.worker_command:
        raise StageError(Stage.BENCHMARK, "runtime worker needs python3 on the instance: the load generator "
                                          "runs there, next to the containers it starts")
    else:
        outcome.where = "local"
        # Here the stream is local and cannot be lost, so no checkpoint: a relative
        # path would otherwise land in this machine's home directory.
        lines = _local_lines({**plan.config(local_server_url), "checkpoint_path": None})
    gone = False
    try:
        streaming = asyncio.wait_for(_consume(lines, outcome, on_event), timeout)
        await (watch.guard(streaming) if watch is not None else streaming)
    except InstanceLost as exc:
        gone = True
        outcome.status, outcome.message = "interrupted", exc.message
    except asyncio.TimeoutError:
        outcome.status, outcome.message = "interrupted", f"benchmark exceeded its {timeout:.0f} s budget"
    except (OSError, StageError, Exception) as exc:  # noqa: BLE001 - any break keeps what was measured
        outcome.status, outcome.message = "interrupted", f"stream broke off: {exc or type(exc).__name__}"
    if outcome.status != "completed" and watch is not None and not gone and await watch.confirm():
        gone = True  # the stream ended quietly, and the API says why
        outcome.message = watch.reason
    if outcome.status != "completed" and not outcome.message:
        outcome.message = "the load generator ended without a finish event"
    if gone:
        # A vanished instance's link goes silent rather than closing: drop it now, or
        # every later command on it would wait for its own timeout.
        conn.abort()
    elif outcome.status != "completed" and has_python and plan.checkpoint_path:
        await _complete_from_checkpoint(conn, plan, outcome, until, reconnect, watch)
    if outcome.status == "completed":
        return outcome
    outcome.duration_seconds = outcome.duration_seconds or max(outcome.elapsed, outcome.span())
    detail = outcome.message
    if outcome.successful:
        raise BenchmarkInterrupted(
            f"benchmark interrupted after {outcome.successful} successful requests: {detail}",
            partial=outcome,
        )
    if gone:
        raise InstanceLost(Stage.BENCHMARK, f"no request succeeded: {detail}")
    stderr = conn.last_stderr.strip()[-300:]
    raise StageError(Stage.BENCHMARK, f"no request succeeded: {detail}" + (f"; {stderr}" if stderr else ""))


async def _complete_from_checkpoint(
    conn: Connection,
    plan: BenchmarkPlan,
    outcome: LoadgenPass,
    until: float,
    reconnect: Callable[[], Awaitable[Connection]] | None,
    watch: SessionWatch | None,
) -> None:
    """Merge the records of the instance's checkpoint that the stream did not deliver."""
    recovered = await recover(conn, plan.checkpoint_path, until=until, reconnect=reconnect, watch=watch)
    outcome.recovered = outcome.merge(recovered.records)
    outcome.elapsed = max(outcome.elapsed, recovered.elapsed)
    if recovered.problem:
        outcome.message += f"; the instance's checkpoint gave {outcome.recovered} more records ({recovered.problem})"
    else:
        ended = f"the run there ended {recovered.status}" if recovered.status else "the run there ended"
        outcome.message += f"; {outcome.recovered} more records recovered from the instance's checkpoint ({ended})"


async def _consume(
    lines: AsyncIterator[str],
    outcome: LoadgenPass,
    on_event: Callable[[dict[str, Any]], None] | None,
) -> None:
    async for line in lines:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: JSON nested past the interpreter's limit
            continue  # a stray line on stdout is not an event
        if not isinstance(event, dict):
            continue  # nor is JSON that is not an object
        kind = event.pop("event", None)
        if kind == "request":
            try:
                outcome.records.append(RequestRecord.model_validate(event))
            except ValidationError:
                continue
        elif kind == "progress" and _seconds(event.get("elapsed")) is not None:
            outcome.elapsed = _seconds(event["elapsed"])
        elif kind == "finish":
            outcome.finish = dict(event)
            outcome.status = str(event.get("status", "completed"))
            outcome.duration_seconds = _seconds(event.get("duration_seconds")) or 0.0
            outcome.message = str(event.get("message") or "")
        if on_event is not None and kind is not None:
            on_event({"event": kind, **event})


def _seconds(value: Any) -> float | None:
    """A number of seconds from an event, or None when it is not a finite number (a float() of
    an integer too large for one raises OverflowError, of a word ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


async def _local_lines(config: dict[str, Any]) -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOADGEN_BOOTSTRAP,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(loadgen_input(config).encode())
        try:
            await process.stdin.drain()  # the script reads all of it before it writes a line
        except (BrokenPipeError, ConnectionResetError):
            pass  # it exited without reading: its output (none) says so
        process.stdin.close()
        async for raw in process.stdout:
            yield raw.decode("utf-8", "replace").rstrip("\n")
        await process.wait()
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


# ---------------------------------- the checkpoint, when the stream broke off

#: Statuses the load generator writes last.
FINAL_STATUSES = frozenset({"completed", "interrupted", "failed"})
#: Seconds between reads while the generator is still running.
POLL_SECONDS = 1.0
#: The longest a reconnect may take.
RECONNECT_TIMEOUT = 60.0


class CheckpointFile(BaseModel):
    """The checkpoint as the load generator writes it (seed 001's shape, plus ``pid``)."""

    model_config = ConfigDict(extra="ignore")

    status: str = ""
    pid: int | None = None
    results: list[RequestRecord] = Field(default_factory=list)
    summary: dict[str, Any] | None = None


@dataclass
class Recovered:
    """What the checkpoint held when reading stopped, and how that went."""

    records: list[RequestRecord] = field(default_factory=list)
    status: str = ""
    elapsed: float = 0.0
    #: Why nothing (or not everything) could be read; empty when all went well.
    problem: str = ""


def remote_path(path: str) -> str:
    """``path`` quoted for the shell; a relative one is under the login's home."""
    return quote(path) if path.startswith("/") else f'"$HOME"/{quote(path)}'


async def read_checkpoint(conn: Connection, path: str) -> CheckpointFile | None:
    """The checkpoint file now, or None when it is missing or unreadable."""
    result = await conn.run(f"cat {remote_path(path)}", stage=Stage.RESULTS,
                            what="reading the checkpoint", timeout=30, check=False)
    if not result.ok:
        return None
    try:
        return CheckpointFile.model_validate_json(result.stdout)
    except ValidationError:
        return None  # caught mid-rename on a file system without atomic replace: read again


async def still_running(conn: Connection, pid: int | None) -> bool:
    """Whether the generator's process is alive (``kill -0``)."""
    if pid is None or pid <= 0:
        return False
    result = await conn.run(f"kill -0 {int(pid)}", stage=Stage.RESULTS,
                            what="checking the load generator", timeout=30, check=False)
    return result.ok


async def recover(
    conn: Connection,
    path: str,
    *,
    until: float,
    reconnect: Callable[[], Awaitable[Connection]] | None = None,
    watch: SessionWatch | None = None,
) -> Recovered:
    """Read the checkpoint at ``path``, waiting (to ``until``, a monotonic time) for the run's end.

    Never raises for a checkpoint that cannot be had: ``problem`` says why.
    """
    recovered = Recovered()
    fresh: Connection | None = None
    try:
        if conn.closed:
            if reconnect is None:
                recovered.problem = "the SSH connection is closed"
                return recovered
            budget = max(1.0, min(RECONNECT_TIMEOUT, until - time.monotonic()))
            fresh = conn = await asyncio.wait_for(reconnect(), budget)
        exited = False
        while True:
            data = await read_checkpoint(conn, path)
            if data is None:
                recovered.problem = "no readable checkpoint file on the instance"
                break
            recovered.records, recovered.status = data.results, data.status
            recovered.elapsed = float((data.summary or {}).get("elapsed") or 0.0)
            if data.status in FINAL_STATUSES or exited:
                break
            # Gone since the read: it may have written its last checkpoint on the way out, so read
            # once more (read, then exit, then `kill -0` reported "ended running" for a completed run).
            exited = not await still_running(conn, data.pid)
            if exited:
                continue
            if time.monotonic() >= until:
                recovered.problem = "the load generator was still running when the stage's time ran out"
                break
            if watch is not None and await watch.check():
                recovered.problem = watch.reason
                break
            await asyncio.sleep(POLL_SECONDS)
    except (StageError, asyncio.TimeoutError, OSError) as exc:
        recovered.problem = f"reading it failed: {str(exc) or type(exc).__name__}"
    finally:
        if fresh is not None:
            await fresh.close()
    return recovered
