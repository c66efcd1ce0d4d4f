"""State the stand-ins share on one instance, as JSON files in its ``state_dir``.

Files, each written whole and atomically (temporary file, then rename) so a reader
never sees half of one:

``ollama_models.json``
    the pulled models; survives server restarts, like Ollama's model directory.
``ollama_runtime.json``
    what the running server has loaded and whether it is generating; rewritten on
    every change, read by ``nvidia-smi``. A restarted server starts with nothing
    loaded, as the real one does.
``ollama.pid``
    the serving process; a runtime file whose server is dead is ignored, so a
    killed server frees its emulated GPU memory.
``ollama_faults.json``
    stream faults armed by the sandbox (``stall_stream``, ``empty_output``): the
    server applies each to the generations it starts next.
``ollama_pull_faults.json``
    pull faults armed by the sandbox (``pull_error``): the server fails the pulls it
    starts next with their message.
``requests.jsonl``
    the request log: one JSON object per generation request a stand-in server received
    (:func:`record_request`), what tests read to prove what a load generator sent.
``ollama_downloads.json``
    bytes on disk of each blob of a pull not finished (in progress, or stopped by a
    full disk): ``df`` counts them, a new pull resumes them, a restarted server
    prunes them, as Ollama does with its ``-partial`` files.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .lifeline import process_alive

MODELS_FILE = "ollama_models.json"
RUNTIME_FILE = "ollama_runtime.json"
PID_FILE = "ollama.pid"
STREAM_FAULTS_FILE = "ollama_faults.json"
DOWNLOADS_FILE = "ollama_downloads.json"
PULL_FAULTS_FILE = "ollama_pull_faults.json"


class PulledModel(BaseModel):
    """A model on the instance's disk."""

    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    digest: str
    modified_at: datetime


class LoadedModel(BaseModel):
    """A model in (emulated) GPU memory."""

    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    size_vram: int
    digest: str
    expires_at: datetime | None = None
    #: The GPUs (nvidia-smi indices) its memory is spread over evenly; empty: every GPU of the machine.
    gpus: tuple[int, ...] = ()


class StreamFault(BaseModel):
    """A fault the Ollama stand-in applies to its next generations.

    ``stall``: after ``after_tokens`` tokens the stream goes silent until the
    client gives up (or ``stall_seconds`` pass). ``empty``: the answer ends at once,
    done with no token. Each fires for ``times`` generations (None: every one).
    """

    model_config = ConfigDict(frozen=True)

    id: int
    kind: Literal["stall", "empty"]
    after_tokens: int = 0
    times: int | None = None
    stall_seconds: float = 3600.0


class PullFault(BaseModel):
    """A fault the Ollama stand-in applies to its next pulls (``times``; None: every one)."""

    model_config = ConfigDict(frozen=True)

    id: int
    message: str
    times: int | None = None


class RuntimeState(BaseModel):
    """What the serving process is doing right now."""

    pid: int | None = None
    loaded: list[LoadedModel] = Field(default_factory=list)
    active_requests: int = 0
    # Wall-clock seconds (time.time()) of the last idle->busy and busy->idle
    # changes: nvidia-smi ramps temperature and power from them.
    busy_since: float | None = None
    idle_since: float | None = None


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON so that readers see the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_Fault = TypeVar("_Fault", bound=BaseModel)


def _read_faults(path: Path, model: type[_Fault]) -> list[_Fault]:
    """The armed faults of one kind in ``path`` (``{"faults": [...]}``); an entry that does not
    validate, or a file that is not that shape, is skipped."""
    data = _read_json(path) or {}
    faults = []
    for entry in data.get("faults", []) if isinstance(data, dict) else []:
        try:
            faults.append(model.model_validate(entry))
        except ValueError:
            continue
    return faults


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class StateStore:
    """Reads and writes the shared state files of one instance."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)

    @property
    def pid_path(self) -> Path:
        return self.state_dir / PID_FILE

    def read_pulled(self) -> dict[str, PulledModel]:
        """Pulled models by normalized name."""
        data = _read_json(self.state_dir / MODELS_FILE) or {}
        models: dict[str, PulledModel] = {}
        for entry in data.get("models", []):
            try:
                model = PulledModel.model_validate(entry)
            except ValueError:
                continue
            models[model.name] = model
        return models

    def write_pulled(self, models: dict[str, PulledModel]) -> None:
        payload = {"models": [m.model_dump(mode="json") for m in models.values()]}
        atomic_write_json(self.state_dir / MODELS_FILE, payload)

    def read_runtime(self, *, only_if_serving: bool = True) -> RuntimeState:
        """The runtime state; empty when no live server owns it (unless asked otherwise)."""
        data = _read_json(self.state_dir / RUNTIME_FILE)
        try:
            state = RuntimeState.model_validate(data or {})
        except ValueError:
            state = RuntimeState()
        if only_if_serving and (state.pid is None or not process_alive(state.pid)):
            return RuntimeState(idle_since=state.idle_since)
        return state

    def write_runtime(self, state: RuntimeState) -> None:
        atomic_write_json(self.state_dir / RUNTIME_FILE, state.model_dump(mode="json"))

    def write_pid(self, pid: int) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.pid_path, pid)

    def read_pid(self) -> int | None:
        value = _read_json(self.pid_path)
        return value if isinstance(value, int) else None

    @property
    def stream_faults_path(self) -> Path:
        return self.state_dir / STREAM_FAULTS_FILE

    def read_stream_faults(self) -> list[StreamFault]:
        return _read_faults(self.stream_faults_path, StreamFault)

    def write_stream_faults(self, faults: list[StreamFault]) -> None:
        atomic_write_json(self.stream_faults_path, {"faults": [f.model_dump(mode="json") for f in faults]})

    def read_downloads(self) -> dict[str, int]:
        """Bytes written so far by blob digest, for blobs of pulls not finished."""
        data = _read_json(self.state_dir / DOWNLOADS_FILE) or {}
        blobs = data.get("blobs") if isinstance(data, dict) else None
        if not isinstance(blobs, dict):
            return {}
        return {str(k): v for k, v in blobs.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}

    def write_downloads(self, blobs: dict[str, int]) -> None:
        atomic_write_json(self.state_dir / DOWNLOADS_FILE, {"blobs": blobs})

    def remove_pid(self, pid: int) -> None:
        """Remove the pid file if it is still ours (a newer server may have replaced it)."""
        if self.read_pid() == pid:
            self.pid_path.unlink(missing_ok=True)

    @property
    def pull_faults_path(self) -> Path:
        return self.state_dir / PULL_FAULTS_FILE

    def read_pull_faults(self) -> list[PullFault]:
        return _read_faults(self.pull_faults_path, PullFault)

    def write_pull_faults(self, faults: list[PullFault]) -> None:
        atomic_write_json(self.pull_faults_path, {"faults": [f.model_dump(mode="json") for f in faults]})


# ----------------------------------------------------------------------
#
# How many requests an instance's stand-ins served: what a soak checks the store against.
#
# Every server on an instance (``ollama serve``, the OpenAI launchers, the worker
# containers) appends one line to ``served_requests.log`` in the instance's state
# directory when a generation was delivered whole: the closing bytes of a stream
# written to a client still connected (``stream``), a worker's ``completed`` finish
# (``worker``), or a non-streamed answer (``whole``: what warm-ups and probes ask for;
# a load generator streams, to time each token). A request cut by the client, a
# stall or a fault is not served. The file is append-only and each line one ``write`` under ``O_APPEND``,
# so servers in several processes never interleave; the sandbox reads it when the
# instance stops (before its directory goes) and ``GET /sandbox/state`` reports the
# total as ``served_requests``.


SERVED_FILE = "served_requests.log"


KINDS = ("stream", "worker", "whole")


def record_served(state_dir: Path | str | None, kind: str, model: str) -> None:
    """Count one request delivered whole, of ``kind`` (one of :data:`KINDS`); never raises:
    a count is no reason to fail a request."""
    if state_dir is None:
        return
    _append_line(Path(state_dir) / SERVED_FILE,
                 f"{time.time():.3f} {kind} {' '.join(model.split())[:200] or '-'}\n".encode())


def _append_line(path: Path, line: bytes) -> None:
    """Append ``line`` with one ``write`` under ``O_APPEND`` (servers in several processes never
    interleave); a failure is swallowed: the served count and the request log never fail a request."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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


# ------------------------------------------------------------------ the request log
# Every generation request a stand-in server receives (Ollama's /api/generate and /api/chat,
# the OpenAI-compatible /v1/completions and /v1/chat/completions of every launcher) is one
# line of ``requests.jsonl`` in the instance's state directory: when it arrived (the host's
# wall clock, ``time.time()``, taken as the handler starts), the route, the model and what
# was asked (``messages``, or ``prompt`` and ``system``), the prompt tokens the server counted
# and the output cap. It is the server's side of the story: tests prove with it what the
# load generator sent (a conversation's history, a shared prefix, a trace's send times).
# Append-only, one ``write`` per line under ``O_APPEND`` like the served count; the sandbox
# keeps the file when the instance stops (:data:`REQUEST_LOG_FILE`, ``GET
# /sandbox/sessions/{id}/requests``).

REQUEST_LOG_FILE = "requests.jsonl"

#: What one request's entry keeps of the request body (the rest of it is not the log's business).
LOGGED_FIELDS = ("model", "messages", "prompt", "system", "max_tokens", "max_completion_tokens")


def record_request(state_dir: Path | str | None, received_at: float, route: str, body: dict[str, Any],
                   **counted: Any) -> None:
    """Append one request to the instance's request log; never raises (a log is no reason to
    fail a request). ``counted``: what the server worked out (``prompt_tokens`` ...)."""
    if state_dir is None:
        return
    entry = {"received_at": round(received_at, 6), "route": route,
             **{key: body[key] for key in LOGGED_FIELDS if key in body}, **counted}
    try:
        line = (json.dumps(entry, ensure_ascii=False, default=str) + "\n").encode()
    except (TypeError, ValueError):
        return
    _append_line(Path(state_dir) / REQUEST_LOG_FILE, line)


def read_requests(path: Path | str) -> list[dict[str, Any]]:
    """The entries of a request log (a state directory's, or a kept file), oldest first;
    a torn last line (a server killed mid-write) is skipped; no file: none."""
    file = Path(path)
    if file.is_dir():
        file = file / REQUEST_LOG_FILE
    entries = []
    try:
        with open(file, "rb") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    entries.append(entry)
    except OSError:
        pass
    return entries
