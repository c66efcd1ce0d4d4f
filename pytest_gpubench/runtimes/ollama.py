"""Ollama on an instance: install if missing, serve, pull, verify, warm up.

:class:`OllamaRuntime` implements the :class:`~.base.Runtime` protocol; its
endpoint is Ollama's native API (``/api/generate``).

Shell commands are constants or quoted; the Ollama API itself is reached over an
SSH port forward to the instance's ``OLLAMA_HOST``, so no command line ever
carries a model name or prompt.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from ..aio import http_client
from ..errors import RemoteCommandError, Stage, StageError
from ..matrix.cells import Cell
from ..remote.ssh import Connection
from ..runtime_facts import RuntimeFacts, SandboxImitation
from ..settings import DEFAULT_OLLAMA_INSTALL
from .base import Endpoint, GpuPlacement, PulledModel, ServingApi, restart_once
from .openai_server import LOOPBACK, identify, reach_address, record, stale_in, stop_script

#: Ollama model references: name[:tag], optionally namespaced. Nothing a shell
#: or a URL would treat specially.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*(:[A-Za-z0-9._-]+)?$")
DEFAULT_PORT = 11434
#: Download tools an install command may need; a missing one is named in the error.
DOWNLOADERS = ("curl", "wget")
SERVE_LOG = "$HOME/.gpubench/ollama-serve.log"
#: The pid of the ``ollama serve`` this runtime started, so that a hung one can be ended.
SERVE_PID = "$HOME/.gpubench/ollama-serve.pid"
#: What the command line of an ``ollama serve`` matches (``openai_server.py``, "pid files"): a word naming ollama, then
#: ``serve`` (the sandbox's stand-in runs as ``python -m ...ollama_standin serve``).
SERVE_PATTERN = '*ollama*" serve "*'


def check_model_name(model: str) -> str:
    """Return ``model`` if it is a plain Ollama reference, else raise."""
    if not MODEL_NAME.fullmatch(model) or len(model) > 200:
        raise StageError(Stage.MODEL_PULL, f"refusing model name {model!r}: not a plain name[:tag]")
    return model


def with_tag(model: str) -> str:
    """``qwen2`` -> ``qwen2:latest``: Ollama's meaning of a bare name."""
    last = model.rsplit("/", 1)[-1]
    return model if ":" in last else f"{model}:latest"


@dataclass
class OllamaRuntime:
    """Ollama on one instance, driven through an SSH connection (a :class:`~.base.Runtime`)."""

    name: ClassVar[str] = "ollama"
    conn: Connection
    #: Run when ``ollama --version`` fails: the matrix's ``runtime.ollama_install`` or Ollama's own.
    install_command: str = DEFAULT_OLLAMA_INSTALL
    version: str = ""
    #: Where a server started here listens (the matrix's ``runtime.host``): the instance's loopback unless
    #: the matrix says otherwise; it is reached there (loopback for every interface).
    bind_host: str = LOOPBACK
    remote_host: str = LOOPBACK
    remote_port: int = DEFAULT_PORT
    local_port: int = 0
    warmup_load_seconds: float | None = None
    #: OLLAMA_NUM_PARALLEL of the server: set when this runtime started it,
    #: None when the server was already running (its setting is unknown).
    num_parallel: int | None = None
    started_here: bool = False
    cold_first_token_ms: float | None = None
    #: The last warm-up's first-token time less any load (ms): what a lone request waits before its first token.
    first_token_ms: float | None = None
    #: OLLAMA_NUM_PARALLEL asked for: what a restarted server gets.
    wanted_parallel: int = 1
    #: Restarts after a failed health check (at most one per runtime).
    restarts: int = 0
    #: The GPUs a server started here sees (``CUDA_VISIBLE_DEVICES``) and spreads the model over.
    placement: GpuPlacement = GpuPlacement()
    #: Ollama splits layers over GPUs; it has no tensor parallelism.
    tensor_parallel: ClassVar[None] = None
    #: Where a finding goes as a progress line (``STALE_PID_FILE``): the cell's progress file, set by
    #: the plugin; None: nowhere.
    on_status: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def for_cell(cls, conn: Connection, cell: Cell, placement: GpuPlacement = GpuPlacement()) -> OllamaRuntime:
        """The runtime a cell's matrix asks for, on ``conn``, on ``placement``'s GPUs."""
        host = cell.runtime_host or LOOPBACK
        return cls(conn, install_command=cell.ollama_install or DEFAULT_OLLAMA_INSTALL, placement=placement,
                   bind_host=host, remote_host=reach_address(host))

    def server_environment(self, parallel: int) -> str:
        """The variables ``ollama serve`` starts with: ``OLLAMA_HOST`` (where it listens: the instance's
        loopback unless the matrix's ``runtime.host`` says otherwise, whatever the instance's own
        ``OLLAMA_HOST`` names, on that one's port), ``OLLAMA_NUM_PARALLEL``, the cell's GPUs
        (``CUDA_VISIBLE_DEVICES``) and, on more than one, ``OLLAMA_SCHED_SPREAD=1``: Ollama otherwise
        keeps a model that fits one GPU on that one, and the cell would measure one GPU."""
        spread = "OLLAMA_SCHED_SPREAD=1 " if self.placement.count > 1 else ""
        host = ipaddress.ip_address(self.bind_host)
        listen = f"[{host}]" if host.version == 6 else str(host)
        return (f"OLLAMA_HOST={listen}:{int(self.remote_port)} OLLAMA_NUM_PARALLEL={int(parallel)} "
                f"{spread}{self.placement.shell_prefix()}")

    @property
    def endpoint(self) -> Endpoint:
        """Ollama's native API, on the instance and through the forward."""
        return Endpoint(remote_url=self.remote_url, local_url=self.url, api=ServingApi.OLLAMA)

    def canonical_model(self, model: str) -> str:
        """Ollama's name of ``model``: a bare name means ``:latest``."""
        return with_tag(model)

    @property
    def url(self) -> str:
        """The forwarded, local URL of the instance's Ollama API."""
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def remote_url(self) -> str:
        """The URL of the Ollama API as seen on the instance."""
        host = f"[{self.remote_host}]" if ":" in self.remote_host else self.remote_host
        return f"http://{host}:{self.remote_port}"

    async def installed_version(self, timeout: float) -> str | None:
        result = await self.conn.run(
            "ollama --version", stage=Stage.RUNTIME_SETUP, what="ollama --version",
            timeout=timeout, check=False,
        )
        if not result.ok:
            return None
        match = re.search(r"(\d+\.\d+\.\d+\S*)", result.stdout + result.stderr)
        return match.group(1) if match else "unknown"

    async def ensure_installed(self, timeout: float) -> bool:
        """Install Ollama unless it is already there. Returns True if it installed.

        :attr:`install_command` is the user's own shell command (matrix or option),
        run as written: it is configuration, not data.
        """
        install_command = self.install_command
        deadline = time.monotonic() + timeout
        if await self.installed_version(timeout) is not None:
            return False
        try:
            await self.conn.run(
                install_command, stage=Stage.RUNTIME_SETUP, what="the Ollama install command",
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except RemoteCommandError:
            await self._explain_missing_downloader(install_command)
            raise
        if await self.installed_version(max(1.0, deadline - time.monotonic())) is None:
            # `curl ... | sh` without curl "succeeds": sh reads an empty script.
            await self._explain_missing_downloader(install_command)
            raise StageError(
                Stage.RUNTIME_SETUP,
                "the install command succeeded but `ollama --version` still fails",
                hint="check the command given by runtime.ollama_install or --gpubench-ollama-install",
            )
        return True

    async def _explain_missing_downloader(self, install_command: str) -> None:
        """Raise a clear error when the install command needs curl or wget and the instance lacks it."""
        for tool in DOWNLOADERS:
            if not re.search(rf"(?:^|[\s|;&(]){tool}(?:\s|$)", install_command):
                continue
            found = await self.conn.run(f"command -v {tool}", stage=Stage.RUNTIME_SETUP,
                                        what=f"looking for {tool}", timeout=30, check=False)
            if not found.ok:
                then = DEFAULT_OLLAMA_INSTALL if tool == "curl" else "<your install command>"
                raise StageError(
                    Stage.RUNTIME_SETUP,
                    f"{tool} is not installed on the instance, and the Ollama install command uses it "
                    "to download the installer",
                    hint=f"use an image with {tool} or with Ollama preinstalled, or set runtime.ollama_install "
                    f"(or --gpubench-ollama-install) to a command that installs {tool} first, such as "
                    f"`apt-get update && apt-get install -y {tool} && {then}`",
                )

    async def locate(self, timeout: float) -> None:
        """Read the port of the instance's OLLAMA_HOST and forward a local port to it, on the address
        a server started here listens on (:attr:`bind_host`; the instance's loopback by default)."""
        result = await self.conn.run(
            'printf "%s" "${OLLAMA_HOST:-}"', stage=Stage.RUNTIME_SETUP,
            what="reading OLLAMA_HOST", timeout=timeout,
        )
        _, self.remote_port = parse_ollama_host(result.stdout.strip())
        self.remote_host = reach_address(self.bind_host)
        self.local_port = await self.conn.forward(self.remote_host, self.remote_port)

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """Start ``ollama serve`` unless it answers; return its version.

        Ollama serves one request at a time per model unless started with
        ``OLLAMA_NUM_PARALLEL``: a server started here gets ``num_parallel``.
        """
        self.wanted_parallel = max(1, int(num_parallel))
        version = await self._version()
        if version is not None and not self.started_here and await self._left_by_gpubench():
            # Started by gpubench and known to no cell now: a run that died before its teardown left it
            # (on a shared machine the lease says nobody else holds it). Ours to end, not to adopt and
            # leave running: restarted with this cell's settings, and stopped at the end like any we start.
            await self.stop(timeout, Stage.RUNTIME_SETUP)
            version = None
        if version is not None and self.started_here and self.num_parallel not in (None, self.wanted_parallel):
            # A server an earlier cell started on this session (session reuse) with another
            # OLLAMA_NUM_PARALLEL: this cell's concurrency needs its own setting.
            await self.stop(timeout, Stage.RUNTIME_SETUP)
            version = None
        if version is None:
            version = await self._serve(self.wanted_parallel, timeout, Stage.RUNTIME_SETUP)
        self.version = version
        return version

    async def stop(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> None:
        """Kill the ``ollama serve`` this runtime (or an earlier one on the session) started.

        One found running (no pid file of ours) is left alone: it cannot be told from another process;
        so is a process a stale pid file names (``openai_server.py``, "pid files"), whose file is dropped and reported.
        """
        result = await self.conn.run(stop_script(SERVE_PID, SERVE_PATTERN, grace_steps=0), stage=stage,
                                     what="ending the ollama serve started earlier", timeout=timeout)
        self._report_stale(result.stdout)
        deadline = time.monotonic() + timeout
        while await self._version() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    def _report_stale(self, output: str) -> None:
        stale = stale_in(output)
        if stale is not None and self.on_status is not None:
            self.on_status("STALE_PID_FILE", **stale.fields(SERVE_PID))

    async def _left_by_gpubench(self) -> bool:
        """Whether the process in gpubench's pid file is the ``ollama serve`` gpubench started there
        (its start time and command line: a pid the system gave to another process since is not taken
        for it, and its file is dropped)."""
        result = await self.conn.run(identify(SERVE_PID, SERVE_PATTERN), stage=Stage.RUNTIME_SETUP,
                                     what="looking for an ollama serve gpubench left", timeout=30, check=False)
        self._report_stale(result.stdout)
        return result.ok and result.stdout.startswith("ours ")

    async def _serve(self, parallel: int, timeout: float, stage: Stage) -> str:
        """Start ``ollama serve`` in the background and wait until it answers."""
        # Two statements: "a && b &" would background a subshell that keeps
        # the SSH channel's stdout open for as long as the server runs.
        command = (
            f'mkdir -p "$HOME/.gpubench"; {self.server_environment(parallel)}'
            f'nohup ollama serve > "{SERVE_LOG}" 2>&1 < /dev/null & {record(SERVE_PID)}'
        )
        await self.conn.run(command, stage=stage, what="starting ollama serve", timeout=timeout)
        version = await self._wait_version(timeout, stage)
        self.num_parallel, self.started_here = int(parallel), True
        return version

    async def ensure_healthy(
        self, timeout: float, stage: Stage = Stage.BENCHMARK, on_restart: Callable[[str], None] | None = None,
    ) -> bool:
        """Health check: ``/api/version`` must answer. Returns True if Ollama had to be restarted.

        An Ollama that does not answer (crashed, killed, hung) is started again, once
        per runtime, and ``on_restart`` is told why first; a hung server this runtime
        started is killed first so that it frees the port (one it found running, it
        cannot tell from another process, and leaves alone). Raises ``StageError`` at
        ``stage`` when it does not come back, or stops answering a second time.
        """
        if await self._version() is not None:
            return False

        async def serve() -> None:
            self.version = await self._serve(self.num_parallel or self.wanted_parallel, timeout, stage)

        await restart_once(self, where=f"Ollama at {self.remote_url} on the instance", probe="/api/version",
                           log=SERVE_LOG, stage=stage, timeout=timeout, on_restart=on_restart, serve=serve)
        return True

    async def residency(self, model: str) -> dict[str, Any] | None:
        """What ``/api/ps`` says of ``model``: size, size_vram and whether it is fully on the GPU.

        A model spilling to CPU (size_vram < size) is why 24 GB cards collapse to
        a few tokens/s on 32B models: such a measurement is not a GPU figure.
        """
        wanted = with_tag(model)
        try:
            async with http_client(self.url, 30) as http:
                response = await http.get("/api/ps")
            entries = response.json().get("models", [])
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        for entry in entries:
            if with_tag(str(entry.get("name") or entry.get("model") or "")) == wanted:
                size, vram = int(entry.get("size") or 0), int(entry.get("size_vram") or 0)
                return {"size": size, "size_vram": vram, "fully_in_gpu": size > 0 and vram >= size}
        return None

    async def _version(self) -> str | None:
        try:
            async with http_client(self.url, 5) as http:
                response = await http.get("/api/version")
            if response.status_code == 200:
                return str(response.json().get("version", "unknown"))
        except (httpx.HTTPError, ValueError):
            return None
        return None

    async def _wait_version(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> str:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            version = await self._version()
            if version is not None:
                return version
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        log = await self.conn.run(
            f'tail -c 600 "{SERVE_LOG}" 2>/dev/null', stage=stage,
            what="reading the serve log", timeout=10, check=False,
        )
        raise StageError(
            stage,
            f"Ollama did not answer /api/version within {timeout:.0f} s after `ollama serve`"
            + (f"; its log ends: {log.stdout.strip()}" if log.stdout.strip() else ""),
        )

    async def pull(
        self, model: str, timeout: float, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        """Pull ``model`` through the API, reporting progress as it streams."""
        check_model_name(model)
        try:
            async with http_client(self.url, httpx.Timeout(timeout, read=timeout)) as http:
                async with http.stream("POST", "/api/pull", json={"model": model, "stream": True}) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise StageError(Stage.MODEL_PULL, f"pull of {model} answered "
                                                           f"{response.status_code}: {_error_text(response)}")
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        status = _stream_object(line)
                        if status is None:
                            raise StageError(Stage.MODEL_PULL, f"pull of {model}: the server's stream is not "
                                                               f"Ollama's (a line that is not a JSON object: "
                                                               f"{_one_line(line, 120)!r})")
                        if "error" in status:
                            raise StageError(Stage.MODEL_PULL,
                                             f"pull of {model} failed: {_one_line(status['error'], 500)}")
                        if on_progress is not None:
                            on_progress(status)
                        if status.get("status") == "success":
                            return
        except httpx.HTTPError as exc:
            raise StageError(Stage.MODEL_PULL, f"pull of {model} broke off: {exc or type(exc).__name__}") from None
        raise StageError(Stage.MODEL_PULL, f"pull of {model} ended without success")

    async def loaded_models(self) -> list[str]:
        """Names of the models in GPU memory now (``/api/ps``); empty when it cannot say."""
        try:
            async with http_client(self.url, 30) as http:
                entries = (await http.get("/api/ps")).json().get("models", [])
        except (httpx.HTTPError, ValueError, RecursionError, AttributeError):
            return []
        if not isinstance(entries, list):
            return []
        return [str(entry.get("name") or entry.get("model") or "") for entry in entries if isinstance(entry, dict)]

    async def unload(self, model: str) -> None:
        """Free ``model``'s GPU memory now (``keep_alive: 0``), as ``ollama stop`` does."""
        body = {"model": check_model_name(model), "keep_alive": 0}
        async with http_client(self.url, 60) as http:
            await http.post("/api/generate", json=body)

    async def remove(self, model: str) -> None:
        """Delete ``model`` from the instance's disk, as ``ollama rm`` does."""
        async with http_client(self.url, 60) as http:
            response = await http.request("DELETE", "/api/delete", json={"model": check_model_name(model)})
        if response.status_code not in (200, 404):
            raise StageError(Stage.MODEL_PULL, f"removing {model} answered {response.status_code}: "
                                               f"{_error_text(response)}")

    async def model_info(self, model: str) -> PulledModel:
        """Verify ``model`` is listed by ``/api/tags`` and describe it."""
        wanted = with_tag(model)
        async with http_client(self.url, 30) as http:
            response = await http.get("/api/tags")
        for entry in response.json().get("models", []):
            if with_tag(entry.get("name", "")) == wanted:
                details = entry.get("details") or {}
                return PulledModel(
                    name=entry["name"], size_bytes=int(entry.get("size") or 0),
                    digest=str(entry.get("digest", "")), family=str(details.get("family", "")),
                    parameter_size=str(details.get("parameter_size", "")),
                    quantization=str(details.get("quantization_level", "")),
                )
        raise StageError(Stage.MODEL_PULL, f"{model} was pulled but /api/tags does not list it")

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """Load the model with one short request; return its load time in seconds.

        A model that cannot load (too large for the GPU) fails here, before
        the benchmark starts. With ``cold_start`` (the first load) its load time and
        first-token time are kept as the cell's cold-start figures.
        """
        body = {"model": model, "prompt": "Hello", "stream": False, "options": {"num_predict": 1}}
        try:
            async with http_client(self.url, timeout) as http:
                response = await http.post("/api/generate", json=body)
        except httpx.HTTPError as exc:
            raise StageError(Stage.MODEL_PULL, f"warm-up of {model} failed: {exc or type(exc).__name__}") from None
        if response.status_code != 200:
            raise StageError(Stage.MODEL_PULL, f"{model} could not be loaded: {_error_text(response)}")
        answer = response.json()
        load_seconds = int(answer.get("load_duration") or 0) / 1e9
        # A one-token answer less its load: the model's first-token time, cold or warm (the stall floor).
        self.first_token_ms = max(0.0, int(answer.get("total_duration") or 0) / 1e6 - load_seconds * 1000)
        if cold_start:
            self.warmup_load_seconds = load_seconds
            # A one-token request on a cold model: its total time is the cold TTFT.
            self.cold_first_token_ms = int(answer.get("total_duration") or 0) / 1e6
        return load_seconds


def parse_ollama_host(value: str) -> tuple[str, int]:
    """Parse OLLAMA_HOST as Ollama does: ``host``, ``host:port`` or a URL."""
    value = value.strip()
    if not value:
        return "127.0.0.1", DEFAULT_PORT
    if "://" in value:
        value = value.split("://", 1)[1]
    value = value.rstrip("/")
    host, _, port = value.rpartition(":") if value.count(":") == 1 or value.startswith("[") else ("", "", "")
    if not host:
        host, port = value, ""
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    try:
        return host, int(port) if port else DEFAULT_PORT
    except ValueError:
        return host, DEFAULT_PORT


def _stream_object(line: str) -> dict[str, Any] | None:
    """One line of an Ollama NDJSON stream as its object; None when it is not a JSON object
    (RecursionError: JSON nested past the interpreter's limit)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _one_line(value: Any, limit: int) -> str:
    """A server's text in a message: one line, at most ``limit`` characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    return _one_line(body.get("error", response.text) if isinstance(body, dict) else response.text, 500)



#: One ``ollama serve`` per machine, on its ``OLLAMA_HOST`` (a cell on a machine the run does not own
#: leases every GPU of it); it spreads a model over the GPUs it sees with ``OLLAMA_SCHED_SPREAD``, no
#: tensor-parallel flag; the sandbox has an Ollama stand-in of its own (``sandbox/ollama_standin.py``).
RUNTIME = RuntimeFacts(name="ollama", runtime=OllamaRuntime, server_per_cell=False, launch=("ollama", "serve"),
                       health_path="/api/version", version_command="ollama --version",
                       sandbox=SandboxImitation(program="ollama", stand_in="ollama_standin", kind="own"))
