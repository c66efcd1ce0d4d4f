"""How many requests an instance's stand-ins served: what a soak checks the store against.

Every server on an instance (``ollama serve``, the OpenAI launchers, the worker
containers) appends one line to ``served_requests.log`` in the instance's state
directory when a generation was delivered whole: the closing bytes of a stream
written to a client still connected (``stream``), a worker's ``completed`` finish
(``worker``), or a non-streamed answer (``whole``: what warm-ups and probes ask for;
a load generator streams, to time each token). A request cut by the client, a
stall or a fault is not served. The file is append-only and each line one ``write`` under ``O_APPEND``,
so servers in several processes never interleave; the sandbox reads it when the
instance stops (before its directory goes) and ``GET /sandbox/state`` reports the
total as ``served_requests``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SERVED_FILE = "served_requests.log"


KINDS = ("stream", "worker", "whole")


def record_served(state_dir: Path | str | None, kind: str, model: str) -> None:
    """Count one request delivered whole, of ``kind`` (one of :data:`KINDS`); never raises:
    a count is no reason to fail a request."""
    if state_dir is None:
        return
    line = f"{time.time():.3f} {kind} {' '.join(model.split())[:200] or '-'}\n".encode()
    try:
        fd = os.open(Path(state_dir) / SERVED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


def count_served(state_dir: Path | str) -> dict[str, int]:
    """The requests served on the instance whose state directory this is, by kind (0 when none)."""
    counts = dict.fromkeys(KINDS, 0)
    try:
        with open(Path(state_dir) / SERVED_FILE, "rb") as handle:
            for line in handle:
                parts = line.split(b" ", 2)
                kind = parts[1].decode("ascii", "replace") if len(parts) == 3 and line.endswith(b"\n") else ""
                if kind in counts:
                    counts[kind] += 1
    except OSError:
        pass
    return counts


def served_fields(counts: dict[str, int]) -> dict[str, int]:
    """``/sandbox/state``'s two figures: ``served_requests`` (streamed and worker requests,
    what a load generator sends) and ``served_whole_answers`` (non-streamed: warm-ups, probes)."""
    return {"served_requests": counts.get("stream", 0) + counts.get("worker", 0),
            "served_whole_answers": counts.get("whole", 0)}
