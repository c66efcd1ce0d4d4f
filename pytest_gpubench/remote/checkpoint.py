"""Recover the instance-side checkpoint of a benchmark whose event stream broke off.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import Stage, StageError
from .ssh import Connection, quote
from .readings import RequestRecord
from ..cloud.watch import SessionWatch

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
