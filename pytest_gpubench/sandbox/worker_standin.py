"""The worker inside the sandbox's containers: a seed-004 worker that streams like the catalog model.

``docker run ... IMAGE`` on a sandbox instance (:mod:`.docker_standin`) runs this
module as the container. It follows the request contract of ``docs/runtimes.md``
("Container workers"): events on stdout, one JSON object per line (seed 004)::

    {"event": "connection", "status": "connected"}
    {"event": "worker", "status": "loading", "message": "Loading qwen2:7b on GPU 0 ..."}
    {"event": "worker", "status": "ready", "message": "..."}
    then, for each request line {"prompt", "max_tokens", ...} read on stdin:
    {"event": "text_delta", "delta": "Hello "} ...  {"event": "text", "content": "..."}
    {"event": "finish", "status": "completed"}

``WORKER_MODE=one-off`` (an ``env_vars`` entry of the preset) answers one request
and exits, after a ``worker`` ``cleaning_up`` event; the default is a session worker
that answers until its stdin ends. Timing is the Ollama stand-in engine's single
stream: the model's load time (time-scaled) before ``ready``, its TTFT before the
first delta, then one delta per ``1 / tokens_per_second`` on absolute times, the
answer's tokens from :func:`.ollama_common.plan_output`. Each container is one
stream: containers on one GPU do not slow each other here (the stand-in has no
shared batch between processes).

Faults (armed through ``/sandbox/faults``, kept in the instance's state directory,
each firing ``times`` times across all containers, on requests whose answer reaches
``after_tokens`` deltas, so a short warm-up passes): ``worker_crash`` exits 3 after
``after_tokens`` deltas with a CUDA error on stderr; ``worker_malformed`` writes a
line that is not JSON there; ``worker_failed`` ends the request with a failed
``finish``. Outside a sandbox instance (no instance file) ``GPUBENCH_WORKER_TTFT_MS``,
``GPUBENCH_WORKER_TPS`` and ``GPUBENCH_WORKER_LOAD_S`` give the timing.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .instance_spec import load_instance_spec
from .ollama_common import plan_output
from .standin_state import record_served

FAULTS_FILE = "worker_faults.json"
WORKER_FAULTS = ("worker_crash", "worker_malformed", "worker_failed")


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def arm_fault(state_dir: Path, fault: dict[str, Any]) -> dict[str, Any]:
    """Add a worker fault (``kind``, ``after_tokens``, ``times``: None for every request); it gets an ``id``."""
    armed: list[dict[str, Any]] = []

    def add(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
        armed.append({**fault, "id": max((f.get("id", 0) for f in faults), default=0) + 1})
        return [*faults, armed[0]]
    _update_faults(state_dir, add)
    return armed[0]


def clear_faults(state_dir: Path) -> int:
    """Disarm every worker fault of the instance; how many there were."""
    if not (Path(state_dir) / FAULTS_FILE).exists():
        return 0
    removed: list[int] = []

    def clear(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
        removed.append(len(faults))
        return []
    _update_faults(state_dir, clear)
    return removed[0]


def armed_fault(state_dir: Path) -> dict[str, Any] | None:
    """The first fault still armed, without counting a firing (a request checks once, at its start)."""
    path = Path(state_dir) / FAULTS_FILE
    try:
        faults = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return next((f for f in faults if f.get("times") is None or f["times"] > 0), None)


def take_fault(state_dir: Path, fault_id: int) -> bool:
    """Count one firing of fault ``fault_id``, across containers; False when it is no longer armed."""
    taken: list[bool] = []

    def take(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for fault in faults:
            if fault.get("id") == fault_id and (fault.get("times") is None or fault["times"] > 0):
                taken.append(True)
                if fault.get("times") is not None:
                    fault["times"] -= 1
        return [f for f in faults if f.get("times") is None or f["times"] > 0]
    _update_faults(state_dir, take)
    return bool(taken)


def _update_faults(state_dir: Path, change: Any) -> None:
    path = Path(state_dir) / FAULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            faults = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        except ValueError:
            faults = []
        before = json.dumps(faults)
        after = json.dumps(change(faults))
        if after != before or not path.exists():
            # Atomically: a request reads the file without the lock (armed_fault).
            path.with_suffix(".tmp").write_text(after, encoding="utf-8")
            path.with_suffix(".tmp").replace(path)


class Timing:
    """The model's figures: load seconds (already scaled), TTFT and decode rate."""

    def __init__(self, model: str) -> None:
        self.state_dir: Path | None = None
        try:
            spec = load_instance_spec()
        except RuntimeError:
            spec = None
        found = spec.find_model(model) if spec is not None else None
        if spec is not None:
            self.state_dir = spec.state_dir
        if found is not None:
            entry = found[1]
            self.load = spec.scaled(entry.load_seconds)
            self.ttft = entry.ttft_ms / 1000
            self.tps = entry.tokens_per_second
        else:
            self.load = float(os.environ.get("GPUBENCH_WORKER_LOAD_S", "0"))
            self.ttft = float(os.environ.get("GPUBENCH_WORKER_TTFT_MS", "50")) / 1000
            self.tps = float(os.environ.get("GPUBENCH_WORKER_TPS", "100"))
        self.known = found is not None or spec is None


def answer(request: dict[str, Any], model: str, timing: Timing, *, last: bool = False) -> bool:
    """Stream one request's answer (``last``: a one-off worker's, cleaning up before its
    ``finish``); False when the worker must exit (a crash fault)."""
    fault = armed_fault(timing.state_dir) if timing.state_dir is not None else None
    fires_at = int(fault.get("after_tokens", 0)) if fault is not None else -1
    max_tokens = request.get("max_tokens")
    plan = plan_output(str(request.get("prompt", "")), int(max_tokens) if max_tokens is not None else None,
                       model=model)
    started = time.perf_counter()
    due = started + timing.ttft
    text = []
    for count, token in enumerate(plan.tokens):
        if count == fires_at and take_fault(timing.state_dir, fault["id"]):
            return _fire(fault)
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        emit("text_delta", delta=token)
        text.append(token)
        due += 1 / timing.tps
    emit("text", content="".join(text))
    if last:
        emit("worker", status="cleaning_up", message="Unloading model")
    emit("finish", status="completed", tokens=len(text), finish_reason=plan.done_reason)
    record_served(timing.state_dir, "worker", model)
    return True


def _fire(fault: dict[str, Any]) -> bool:
    kind = fault.get("kind")
    if kind == "worker_malformed":
        sys.stdout.write("Loading checkpoint shards: 100%|##########| 2/2 [00:03<00:00]\n")  # a library's print
        sys.stdout.flush()
        return True
    if kind == "worker_failed":
        emit("finish", status="failed", message="CUDA error: an illegal memory access was encountered")
        return True
    sys.stderr.write("RuntimeError: CUDA error: device-side assert triggered\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(3)


def main() -> int:
    model = os.environ.get("MODEL_NAME", "")
    device = os.environ.get("GPU_DEVICE", "0")
    one_off = os.environ.get("WORKER_MODE", "session") == "one-off"
    emit("connection", status="connected")
    timing = Timing(model)
    if not timing.known:
        emit("worker", status="error", message=f"unknown model {model!r}")
        emit("finish", status="failed", message=f"model {model!r} not found in {os.environ.get('MODEL_PATH', '')}")
        return 1
    emit("worker", status="loading", message=f"Loading {model} on GPU {device} "
                                            f"(command: {os.environ.get('GPUBENCH_WORKER_COMMAND', '')})")
    time.sleep(timing.load)
    emit("worker", status="ready", message=f"{model} loaded")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            emit("finish", status="failed", message="the request is not JSON")
            continue
        if not answer(request if isinstance(request, dict) else {}, model, timing, last=one_off):
            return 3
        if one_off:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
