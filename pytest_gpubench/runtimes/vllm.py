"""vLLM on an instance: locate, serve the cell's model, wait for ``/health``, warm up, stop.

:class:`VllmRuntime` implements the :class:`~.base.Runtime` protocol; its endpoint is
vLLM's OpenAI-compatible API (``/v1/chat/completions``).

vLLM serves one model per server and loads it at start, so "serving" is
``vllm serve {model} --port {port} {args}`` for the cell's model, and preparing the
model is nothing to pull: the load time is the time from the start to ``/health``.
Every string that reaches the shell (model, arguments) is validated and shlex-quoted.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..remote.ssh import Connection
from .base import Endpoint, PulledModel, ServingApi
from .restart import restart_once

DEFAULT_PORT = 8000
#: Hugging Face repo ids (``org/name``), local paths, or catalog names with a tag; nothing a shell expands.
MODEL_NAME = re.compile(r"^[A-Za-z0-9./_][A-Za-z0-9._/:-]*$")
#: One launch argument: printable, no newline or NUL (quoted anyway).
ARGUMENT = re.compile(r"^[\x20-\x7e]{1,500}$")
SERVE_LOG = "$HOME/.gpubench/vllm-serve.log"
#: The pid of the ``vllm serve`` this runtime started, so that it can be stopped.
SERVE_PID = "$HOME/.gpubench/vllm-serve.pid"
#: How long a SIGTERM'd server gets to exit before SIGKILL.
TERM_GRACE_SECONDS = 10.0


def check_model_name(model: str, stage: Stage = Stage.MODEL_PULL) -> str:
    """Return ``model`` if it is a plain repo id, path or name[:tag], else raise."""
    if not MODEL_NAME.fullmatch(model) or len(model) > 200 or ".." in model.split("/"):
        raise StageError(stage, f"refusing model name {model!r}: not a plain repo id, path or name")
    return model


def check_arguments(args: Sequence[str]) -> tuple[str, ...]:
    """The launch arguments, each a printable single line (they are quoted for the shell)."""
    for arg in args:
        if not isinstance(arg, str) or not ARGUMENT.fullmatch(arg):
            raise StageError(Stage.OLLAMA_INSTALL, f"refusing vllm serve argument {arg!r}: not one printable line")
    return tuple(args)


@dataclass
class VllmRuntime:
    """vLLM on one instance, driven through an SSH connection (a :class:`~.base.Runtime`)."""

    name: ClassVar[str] = "vllm"
    conn: Connection
    #: The model the server is started with (the cell's).
    model: str = ""
    #: Extra ``vllm serve`` arguments, after the model and port.
    args: tuple[str, ...] = ()
    version: str = ""
    remote_port: int = DEFAULT_PORT
    local_port: int = 0
    warmup_load_seconds: float | None = None
    cold_first_token_ms: float | None = None
    #: ``--max-num-seqs`` of a server started here; None for one found running.
    num_parallel: int | None = None
    started_here: bool = False
    wanted_parallel: int = 1
    restarts: int = 0
    #: Seconds from ``vllm serve`` to ``/health`` of the last start here (the model's load).
    load_seconds: float | None = None
    #: Models served and not removed, as :meth:`model_info` describes them.
    prepared: dict[str, PulledModel] = field(default_factory=dict)

    @classmethod
    def for_cell(cls, conn: Connection, cell: Cell) -> VllmRuntime:
        """The runtime for ``cell``'s model, on ``conn``."""
        return cls(conn, model=cell.model, args=tuple(cell.runtime_args))

    @property
    def endpoint(self) -> Endpoint:
        """vLLM's OpenAI chat API, on the instance and through the forward."""
        return Endpoint(remote_url=f"http://127.0.0.1:{self.remote_port}", local_url=self.url,
                        api=ServingApi.OPENAI_CHAT)

    @property
    def url(self) -> str:
        """The forwarded, local URL of the server."""
        return f"http://127.0.0.1:{self.local_port}"

    def canonical_model(self, model: str) -> str:
        """vLLM serves a model under the name it was started with."""
        return model

    # -- install, locate, serve ------------------------------------------------

    async def installed_version(self, timeout: float) -> str | None:
        result = await self.conn.run("vllm --version", stage=Stage.OLLAMA_INSTALL, what="vllm --version",
                                     timeout=timeout, check=False)
        if not result.ok:
            return None
        match = re.search(r"(\d+\.\d+[.\w+-]*)", result.stdout + result.stderr)
        return match.group(1) if match else "unknown"

    async def ensure_installed(self, timeout: float) -> bool:
        """vLLM is not installed by the plugin: a missing one is a clear error; its version is kept."""
        version = await self.installed_version(timeout)
        if version is None:
            raise StageError(Stage.OLLAMA_INSTALL, "vllm is not installed on the instance (`vllm --version` failed)",
                             hint="use an image with vLLM installed (such as vllm/vllm-openai) or install it "
                                  "with `pip install vllm` first")
        self.version = version
        return False

    async def locate(self, timeout: float) -> None:
        """Forward a local port to the server's port on the instance."""
        self.local_port = await self.conn.forward("127.0.0.1", self.remote_port)

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """Start ``vllm serve`` for the cell's model unless a server answers; return vLLM's version."""
        self.wanted_parallel = max(1, int(num_parallel))
        healthy = await self._healthy()
        if healthy and self.started_here and self.num_parallel not in (None, self.wanted_parallel):
            await self.stop(timeout, Stage.OLLAMA_INSTALL)
            healthy = False
        if not healthy:
            await self._serve(self.model, self.wanted_parallel, timeout, Stage.OLLAMA_INSTALL)
        if not self.version:
            self.version = await self.installed_version(timeout) or "unknown"
        return self.version

    def serve_command(self, model: str, parallel: int) -> str:
        """The shell command that starts the server in the background and keeps its pid and log."""
        argv = ["vllm", "serve", check_model_name(model), "--port", str(int(self.remote_port)),
                "--max-num-seqs", str(int(parallel)), *check_arguments(self.args)]
        # Two statements: "a && b &" would keep the SSH channel open for as long as the server runs.
        return (f'mkdir -p "$HOME/.gpubench"; nohup {shlex.join(argv)} > "{SERVE_LOG}" 2>&1 < /dev/null & '
                f'echo $! > "{SERVE_PID}"')

    async def _serve(self, model: str, parallel: int, timeout: float, stage: Stage) -> None:
        """Start ``vllm serve`` and wait for ``/health``; the log's tail in the error when it does not come."""
        started = time.monotonic()
        await self.conn.run(self.serve_command(model, parallel), stage=stage, what="starting vllm serve",
                            timeout=timeout)
        self.num_parallel, self.started_here = int(parallel), True
        await self._wait_healthy(started + timeout, stage)
        self.load_seconds = time.monotonic() - started
        self.model = model

    async def _alive(self) -> bool:
        result = await self.conn.run(f'kill -0 "$(cat "{SERVE_PID}" 2>/dev/null)" 2>/dev/null',
                                     stage=Stage.OLLAMA_INSTALL, what="checking vllm serve", timeout=30, check=False)
        return result.ok

    async def _wait_healthy(self, deadline: float, stage: Stage) -> None:
        delay = 0.05
        while time.monotonic() < deadline:
            if await self._healthy():
                return
            if not await self._alive():
                raise StageError(stage, f"vllm serve exited before /health answered{await self._log_tail(stage)}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise StageError(stage, f"vLLM did not answer /health within the stage timeout{await self._log_tail(stage)}",
                         hint=f"its log is {SERVE_LOG} on the instance")

    async def _log_tail(self, stage: Stage) -> str:
        log = await self.conn.run(f'tail -c 800 "{SERVE_LOG}" 2>/dev/null', stage=stage,
                                  what="reading the vllm serve log", timeout=10, check=False)
        return f"; its log ends: {log.stdout.strip()}" if log.stdout.strip() else ""

    async def _healthy(self) -> bool:
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
                return (await http.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def ensure_healthy(self, timeout: float, stage: Stage = Stage.BENCHMARK,
                             on_restart: Callable[[str], None] | None = None) -> bool:
        """``/health`` must answer; a server that does not is started again, once per runtime."""
        if await self._healthy():
            return False
        await restart_once(
            self, where=f"vLLM on port {self.remote_port} of the instance", probe="/health", log=SERVE_LOG,
            stage=stage, timeout=timeout, on_restart=on_restart,
            serve=lambda: self._serve(self.model, self.num_parallel or self.wanted_parallel, timeout, stage))
        return True

    async def stop(self, timeout: float, stage: Stage = Stage.OLLAMA_INSTALL) -> None:
        """SIGTERM the ``vllm serve`` this runtime (or an earlier one on the session) started, SIGKILL
        after :data:`TERM_GRACE_SECONDS`; one found running (no pid file of ours) is left alone."""
        grace = max(0.5, min(TERM_GRACE_SECONDS, timeout / 2))
        steps = int(grace / 0.1)
        await self.conn.run(
            f'pid=$(cat "{SERVE_PID}" 2>/dev/null); [ -n "$pid" ] || exit 0; kill -TERM "$pid" 2>/dev/null; '
            f'i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); done; '
            f'kill -KILL "$pid" 2>/dev/null; rm -f "{SERVE_PID}"; true',
            stage=stage, what="stopping the vllm serve started earlier", timeout=timeout)
        deadline = time.monotonic() + timeout
        while await self._healthy() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    # -- the model ---------------------------------------------------------------

    async def served_models(self) -> list[dict[str, Any]]:
        """``/v1/models``' entries; empty when the server does not answer."""
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
                data = (await http.get("/v1/models")).json().get("data", [])
            return [entry for entry in data if isinstance(entry, dict)]
        except (httpx.HTTPError, ValueError, AttributeError):
            return []

    async def pull(self, model: str, timeout: float,
                   on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Nothing to pull: vLLM loads at serve. A model other than the served one is served instead
        (the server restarted with it), when this runtime started the server."""
        check_model_name(model)
        if model not in await self.loaded_models():
            if not self.started_here and await self._healthy():
                raise StageError(Stage.MODEL_PULL, f"the vLLM server found running does not serve {model}")
            if self.started_here:
                await self.stop(timeout, Stage.MODEL_PULL)
            try:
                await self._serve(model, self.num_parallel or self.wanted_parallel, timeout, Stage.MODEL_PULL)
            except StageError as exc:
                raise StageError(Stage.MODEL_PULL, f"vLLM could not load {model}: {exc.message}") from None
        self.prepared[model] = await self._describe(model)
        if on_progress is not None:
            on_progress({"status": "success", "model": model, "load_seconds": self.load_seconds})

    async def _describe(self, model: str) -> PulledModel:
        """The served model, its size what the server holds in GPU memory (vLLM's weights and KV cache)."""
        used = await self.conn.run("nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits",
                                   stage=Stage.MODEL_PULL, what="reading GPU memory", timeout=30, check=False)
        mib = sum(int(x) for x in re.findall(r"\d+", used.stdout)) if used.ok else 0
        return PulledModel(name=model, size_bytes=mib * 1024 * 1024)

    async def model_info(self, model: str) -> PulledModel:
        """The model as served (or served earlier and not removed)."""
        if model in self.prepared:
            return self.prepared[model]
        if model in await self.loaded_models():
            self.prepared[model] = await self._describe(model)
            return self.prepared[model]
        raise StageError(Stage.MODEL_PULL, f"vLLM does not serve {model}")

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """One short chat request; the load time is the server's start-to-``/health`` time."""
        body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
                "stream": False}
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=timeout) as http:
                response = await http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise StageError(Stage.MODEL_PULL, f"warm-up of {model} failed: {exc or type(exc).__name__}") from None
        if response.status_code != 200:
            raise StageError(Stage.MODEL_PULL, f"warm-up of {model} answered {response.status_code}: "
                                               f"{response.text[:500]}")
        first_token_ms = (time.monotonic() - started) * 1000
        load = self.load_seconds or 0.0
        if cold_start:
            self.warmup_load_seconds, self.cold_first_token_ms = load, first_token_ms
        return load

    async def residency(self, model: str) -> dict[str, Any] | None:
        """vLLM keeps the whole model on the GPU (no CPU offload unless asked for)."""
        if model not in await self.loaded_models():
            return None
        size = (self.prepared.get(model) or await self._describe(model)).size_bytes
        return {"size": size, "size_vram": size, "fully_in_gpu": True}

    async def loaded_models(self) -> list[str]:
        """The names the server serves (``/v1/models``); empty when it does not answer."""
        return [str(entry.get("id", "")) for entry in await self.served_models()]

    async def unload(self, model: str) -> None:
        """vLLM cannot unload a model and keep serving: the server is stopped, if a gpubench runtime
        started it (its pid file); one found running is left alone."""
        if model in await self.loaded_models():
            await self.stop(60, Stage.MODEL_PULL)

    async def remove(self, model: str) -> None:
        """Forget ``model``: the weights stay in the instance's Hugging Face cache."""
        await self.unload(model)
        self.prepared.pop(model, None)
