"""OpenAI-API servers launched on an instance from a command template: the shared implementation.

vLLM, SGLang, TGI and llama.cpp differ in a few facts, each runtime module's
:class:`LaunchSpec`: the launch command, the version command, the tensor-parallel
flag. Everything else is one :class:`OpenAIServerRuntime` (a
:class:`~.base.Runtime`): these servers serve one model per process and load it at
start, so "serving" is launching the server for the cell's model, preparing the
model is nothing to pull (another model restarts the server with it), the load time
is launch to ``GET /health`` answering 200, and the endpoint is the server's OpenAI
chat API (``/v1/chat/completions``). Every string that reaches the shell (model,
arguments) is validated and shlex-quoted; the server's pid, log and port are kept in
``$HOME/.gpubench/<name>-serve.{pid,log,port}`` on the instance.

Ports: with a matrix's ``runtime: {port: P}`` (or a ``remote_port`` set before
:meth:`~OpenAIServerRuntime.locate`, as GPU Shopper's entrypoint mode does) a
server already answering on P and serving the cell's model is used and left
running ("found running"), else one is started on P. Without, the server is
started on a free port picked on the instance (random in 20000-32767, checked
unused from the instance's shell, another one tried when the server exits with
"address already in use"), and a server found there is never adopted.

Below the runtime: the pid files every server the plugin starts is known by (Ollama's too),
and GPU Shopper's entrypoint mode, where the session's image started the server
(:func:`adopt_image_server`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from ..aio import http_client
from ..errors import Stage, StageError
from ..matrix import launch as image_launch
from ..matrix.cells import Cell
from ..runtime_facts import ImageServer, RuntimeFacts, SandboxImitation, facts_of
from ..remote.ssh import Connection
from .base import Endpoint, GpuPlacement, PulledModel, Runtime, ServingApi, restart_once

#: Hugging Face repo ids (``org/name``), local paths, or catalog names with a tag; nothing a shell expands.
MODEL_NAME = re.compile(r"^[A-Za-z0-9./_][A-Za-z0-9._/:-]*$")
#: One launch argument: printable, no newline or NUL (quoted anyway).
ARGUMENT = re.compile(r"^[\x20-\x7e]{1,500}$")
#: Where a picked port is drawn from: above common services, below Linux's ephemeral range.
PICKED_PORTS = range(20000, 32768)
#: How many ports a start tries when the one picked turns out taken.
PORT_ATTEMPTS = 3
#: How long a SIGTERM'd server gets to exit before SIGKILL.
TERM_GRACE_SECONDS = 10.0
#: Where a server the plugin starts listens, unless the matrix's ``runtime.host`` says otherwise: the
#: instance's loopback, reached through the SSH forward; never the network (vLLM's and TGI's default).
LOOPBACK = "127.0.0.1"


def reach_address(host: str) -> str:
    """Where a server listening on ``host`` is reached from its own machine: loopback for every
    interface (``0.0.0.0``, ``::``), else that address."""
    return LOOPBACK if ipaddress.ip_address(host).is_unspecified else host


def check_model_name(model: str, stage: Stage = Stage.MODEL_PULL) -> str:
    """Return ``model`` if it is a plain repo id, path or name[:tag], else raise."""
    if not MODEL_NAME.fullmatch(model) or len(model) > 200 or ".." in model.split("/"):
        raise StageError(stage, f"refusing model name {model!r}: not a plain repo id, path or name")
    return model


def check_arguments(args: Sequence[str], program: str = "server") -> tuple[str, ...]:
    """The launch arguments, each a printable single line (they are quoted for the shell)."""
    for arg in args:
        if not isinstance(arg, str) or not ARGUMENT.fullmatch(arg):
            raise StageError(Stage.RUNTIME_SETUP, f"refusing {program} argument {arg!r}: not one printable line")
    return tuple(args)


@dataclass(frozen=True)
class LaunchSpec:
    """What one OpenAI-API server's launcher is: the facts a runtime module checks against its docs."""

    #: The matrix's ``runtime:`` name.
    name: str
    #: How messages name the launcher (``vllm serve``).
    program: str
    #: The launch command's words: ``{model}``, ``{host}``, ``{port}`` and ``{parallel}`` are filled in,
    #: ``{args}`` stands for the matrix's ``runtime.args`` (each one word).
    argv: tuple[str, ...]
    #: A shell command whose output carries the version; failing means "not installed".
    version_command: str
    #: The version in that output (group 1).
    version_pattern: str
    #: What to do when it is not installed.
    install_hint: str
    #: The flag that spreads the model over N GPUs (None: the server has none, and spreads layers
    #: over the GPUs it sees); added before ``{args}`` for more than one GPU.
    tensor_parallel_flag: str | None = None
    health_path: str = "/health"
    api: ServingApi = ServingApi.OPENAI_CHAT
    #: Set per cell on a shared machine (``runtimes/registry.py``): its own log, pid and port files.
    file_tag: str = ""
    #: A word the server process's command line holds (default: the launch command's first word): a pid
    #: file naming a process without it is stale and never signalled (``openai_server.py``).
    process_word: str = ""

    def command(self, model: str, port: int, parallel: int, args: Sequence[str], gpus: int = 1,
                host: str = LOOPBACK) -> list[str]:
        """The launch command's words for ``model`` on ``host:port`` (validated, not yet quoted), spanning
        ``gpus`` GPUs with :attr:`tensor_parallel_flag` (the matrix's ``runtime.args`` come after it,
        so a ``-tp`` there wins)."""
        values = {"model": check_model_name(model), "host": str(ipaddress.ip_address(host)), "port": str(int(port)),
                  "parallel": str(int(parallel))}
        words: list[str] = []
        for word in self.argv:
            if word == "{args}":
                words.extend(self.parallel_words(gpus))
                words.extend(check_arguments(args, self.program))
            else:
                words.append(word.format(**values))
        return words

    def parallel_words(self, gpus: int) -> list[str]:
        """``["--tensor-parallel-size", "2"]`` for two GPUs; nothing for one, or without a flag."""
        return [self.tensor_parallel_flag, str(int(gpus))] if gpus > 1 and self.tensor_parallel_flag else []

    def files(self, suffix: str) -> str:
        """The instance path of this server's ``log``, ``pid``, ``start`` or ``port`` file."""
        return f"$HOME/.gpubench/{self.name}-serve{self.file_tag}.{suffix}"

    @property
    def process_pattern(self) -> str:
        """The ``case`` pattern the server process's command line matches (``openai_server.py``)."""
        return word_pattern(self.process_word or self.argv[0])


class _PortTaken(Exception):
    """The server exited because its port was in use."""


@dataclass
class OpenAIServerRuntime:
    """A launched OpenAI-API server on one instance, driven through SSH (a :class:`~.base.Runtime`).

    Subclasses set :attr:`name` and :attr:`spec` only.
    """

    name: ClassVar[str]
    spec: ClassVar[LaunchSpec]
    #: Where the server exposes Prometheus metrics (vLLM's ``/metrics``): read around a measured run
    #: for speculative decoding (``measure/spec_decode.py``); None: the runtime gives none.
    metrics_path: ClassVar[str | None] = None
    conn: Connection
    #: The model the server is started with (the cell's).
    model: str = ""
    #: Extra launch arguments, where the template's ``{args}`` is.
    args: tuple[str, ...] = ()
    #: The matrix's ``runtime.port``: a fixed port, where a server found running is used.
    port: int | None = None
    #: Where a server started here listens (the matrix's ``runtime.host``; default :data:`LOOPBACK`).
    host: str = LOOPBACK
    version: str = ""
    #: Where the server listens on the instance (0 until :meth:`locate` decides).
    remote_port: int = 0
    #: The port was picked here, free: a server answering on it is never adopted.
    port_picked: bool = False
    local_port: int = 0
    warmup_load_seconds: float | None = None
    cold_first_token_ms: float | None = None
    #: The parallel requests of a server started here; None for one found running.
    num_parallel: int | None = None
    started_here: bool = False
    #: The session's image started the server (GPU Shopper's entrypoint mode): it is measured as
    #: found and never replaced by one of the plugin's (``runtimes/openai_server.py`` sets it).
    image_served: bool = False
    wanted_parallel: int = 1
    restarts: int = 0
    #: Seconds from launch to ``/health`` of the last start here (the model's load).
    load_seconds: float | None = None
    #: Models served and not removed, as :meth:`model_info` describes them.
    prepared: dict[str, PulledModel] = field(default_factory=dict)
    #: The GPUs a server started here spans and sees (``CUDA_VISIBLE_DEVICES``).
    placement: GpuPlacement = GpuPlacement()
    #: Where a finding goes as a progress line (``status("STALE_PID_FILE", file=..., ...)``): the cell's
    #: progress file, set by the plugin; None: nowhere.
    on_status: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def for_cell(cls, conn: Connection, cell: Cell, placement: GpuPlacement = GpuPlacement()) -> OpenAIServerRuntime:
        """The runtime for ``cell``'s model, launch arguments and port, on ``conn``, on ``placement``'s GPUs."""
        return cls(conn, model=cell.model, args=tuple(cell.runtime_args), port=cell.runtime_port,
                   host=cell.runtime_host or LOOPBACK, placement=placement)

    @property
    def tensor_parallel(self) -> int | None:
        """The tensor-parallel size a server started here gets; None when the server has no such flag."""
        return self.placement.count if self.spec.tensor_parallel_flag else None

    @property
    def endpoint(self) -> Endpoint:
        """The server's OpenAI API, on the instance and through the forward."""
        return Endpoint(remote_url=f"http://{self.remote_address}:{self.remote_port}", local_url=self.url,
                        api=self.spec.api)

    @property
    def remote_address(self) -> str:
        """Where the server is reached on the instance (the forward's and the load generator's target)."""
        host = reach_address(self.host)
        return f"[{host}]" if ":" in host else host

    @property
    def url(self) -> str:
        """The forwarded, local URL of the server."""
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def where(self) -> str:
        return f"{self.spec.program} on port {self.remote_port} of the instance"

    def canonical_model(self, model: str) -> str:
        """These servers serve a model under the name it was started with."""
        return model

    # -- install, locate, serve ------------------------------------------------

    async def installed_version(self, timeout: float) -> str | None:
        """The version the launcher reports; None when it is not there."""
        result = await self.conn.run(self.spec.version_command, stage=Stage.RUNTIME_SETUP,
                                     what=self.spec.version_command, timeout=timeout, check=False)
        if not result.ok:
            return None
        match = re.search(self.spec.version_pattern, result.stdout + result.stderr)
        return match.group(1) if match else "unknown"

    async def ensure_installed(self, timeout: float) -> bool:
        """The server is not installed by the plugin: a missing one is a clear error; its version is kept."""
        version = await self.installed_version(timeout)
        if version is None:
            raise StageError(Stage.RUNTIME_SETUP, f"{self.name} is not installed on the instance "
                                                   f"(`{self.spec.version_command}` failed)",
                             hint=self.spec.install_hint)
        self.version = version
        return False

    async def locate(self, timeout: float) -> None:
        """Decide the server's port (given, the one a server taken over uses, or a free one picked)
        and forward a local port to it."""
        if not self.remote_port:
            if self.port is not None:
                self.remote_port = self.port
            elif self.started_here:  # taken over from an earlier cell: its server's port
                self.remote_port = await self._recorded_port()
            if not self.remote_port:
                self.remote_port, self.port_picked = await self._pick_port(timeout), True
        self.local_port = await self.conn.forward(reach_address(self.host), self.remote_port)

    async def _recorded_port(self) -> int:
        result = await self.conn.run(f'cat "{self.spec.files("port")}" 2>/dev/null', stage=Stage.RUNTIME_SETUP,
                                     what=f"reading the {self.name} server's port", timeout=30, check=False)
        text = result.stdout.strip()
        return int(text) if text.isdigit() else 0

    async def _pick_port(self, timeout: float) -> int:
        """A port nothing on the instance listens on (bash's ``/dev/tcp`` connects to each
        candidate); without bash the first candidate, and the start's retry covers a taken one."""
        candidates = random.sample(PICKED_PORTS, 8)
        script = (f"for p in {' '.join(map(str, candidates))}; do "
                  '(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; exit 0; }; done; exit 1')
        result = await self.conn.run(f"bash -c {shlex.quote(script)}", stage=Stage.RUNTIME_SETUP,
                                     what="finding a free port", timeout=min(30.0, max(timeout, 5.0)), check=False)
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else candidates[0]

    async def _move_port(self, timeout: float) -> None:
        """Another free port, and the forward to it."""
        self.remote_port, self.port_picked = await self._pick_port(timeout), True
        self.local_port = await self.conn.forward(reach_address(self.host), self.remote_port)

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """Launch the server for the cell's model unless one of ours (or, on a given port, one
        serving that model) answers; return the server's version."""
        self.wanted_parallel = max(1, int(num_parallel))
        healthy = await self._healthy()
        if healthy and not self.started_here:
            if self.port_picked:  # someone else's server on the port picked: never adopted
                await self._move_port(timeout)
                healthy = False
            elif self.model and self.model not in (served := await self.loaded_models()):
                raise StageError(Stage.RUNTIME_SETUP, f"a server found running on port {self.remote_port} "
                                                       f"serves {', '.join(served) or 'no model'}, not {self.model}",
                                 hint="stop it, or give runtime.port another port")
        if healthy and self.started_here and self.num_parallel not in (None, self.wanted_parallel):
            await self.stop(timeout, Stage.RUNTIME_SETUP)
            healthy = False
        if not healthy:
            if not self.started_here:  # an earlier gpubench server would share the GPU: ended first
                await self.stop(timeout, Stage.RUNTIME_SETUP)
            await self._serve(self.model, self.wanted_parallel, timeout, Stage.RUNTIME_SETUP)
        if not self.version:
            self.version = await self.installed_version(timeout) or "unknown"
        return self.version

    def serve_command(self, model: str, parallel: int) -> str:
        """The shell command that starts the server in the background and keeps its pid, port and log."""
        argv = self.spec.command(model, self.remote_port, parallel, self.args, self.placement.count, self.host)
        files = self.spec.files
        # Two statements: "a && b &" would keep the SSH channel open for as long as the server runs.
        return (f'mkdir -p "$HOME/.gpubench"; {self.placement.shell_prefix()}nohup {shlex.join(argv)} '
                f'> "{files("log")}" 2>&1 < /dev/null & '
                f'{record(files("pid"))}; echo {int(self.remote_port)} > "{files("port")}"')

    async def _serve(self, model: str, parallel: int, timeout: float, stage: Stage) -> None:
        """Launch the server and wait for its health path; the log's tail in the error when it does not
        come. On a picked port the server found taken, another one is tried."""
        if self.image_served:  # entrypoint mode: the image's server is the one measured, never replaced
            raise StageError(stage, f"the {self.spec.program} the session's image started does not answer "
                                    f"{self.spec.health_path} on port {self.remote_port}",
                             hint="in entrypoint mode the plugin starts no server of its own: check the image, "
                                  "its model and runtime.launch.api_port")
        deadline = time.monotonic() + timeout
        for attempt in range(PORT_ATTEMPTS):
            started = time.monotonic()
            await self.conn.run(self.serve_command(model, parallel), stage=stage,
                                what=f"starting {self.spec.program}", timeout=timeout)
            self.num_parallel, self.started_here = int(parallel), True
            try:
                await self._wait_healthy(deadline, stage)
            except _PortTaken as taken:
                if not self.port_picked or attempt == PORT_ATTEMPTS - 1:
                    raise StageError(stage, f"{self.spec.program} could not listen on port {self.remote_port}: "
                                            f"{taken}") from None
                await self._move_port(timeout)
                continue
            self.load_seconds = time.monotonic() - started
            self.model = model
            return

    async def _alive(self, stage: Stage) -> bool:
        result = await self.conn.run(f'kill -0 "$(cat "{self.spec.files("pid")}" 2>/dev/null)" 2>/dev/null',
                                     stage=stage, what=f"checking {self.spec.program}", timeout=30, check=False)
        return result.ok

    async def _wait_healthy(self, deadline: float, stage: Stage) -> None:
        delay = 0.05
        while time.monotonic() < deadline:
            if await self._healthy():
                return
            if not await self._alive(stage):
                tail = await self._log_tail(stage)
                if "address already in use" in tail.lower():
                    raise _PortTaken(tail.strip())
                ends = f"; its log ends: {tail}" if tail else ""
                raise StageError(stage, f"{self.spec.program} exited before {self.spec.health_path} answered{ends}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        tail = await self._log_tail(stage)
        raise StageError(stage, f"{self.spec.program} did not answer {self.spec.health_path} within the stage "
                                f"timeout{'; its log ends: ' + tail if tail else ''}",
                         hint=f"its log is {self.spec.files('log')} on the instance")

    async def _log_tail(self, stage: Stage) -> str:
        log = await self.conn.run(f'tail -c 800 "{self.spec.files("log")}" 2>/dev/null', stage=stage,
                                  what=f"reading the {self.spec.program} log", timeout=10, check=False)
        return log.stdout.strip()

    async def _healthy(self) -> bool:
        if not self.local_port:
            return False
        try:
            async with http_client(self.url, 5) as http:
                return (await http.get(self.spec.health_path)).status_code == 200
        except httpx.HTTPError:
            return False

    async def ensure_healthy(self, timeout: float, stage: Stage = Stage.BENCHMARK,
                             on_restart: Callable[[str], None] | None = None) -> bool:
        """The health path must answer; a server that does not is started again, once per runtime."""
        if await self._healthy():
            return False
        await restart_once(
            self, where=self.where, probe=self.spec.health_path, log=self.spec.files("log"),
            stage=stage, timeout=timeout, on_restart=on_restart,
            serve=lambda: self._serve(self.model, self.num_parallel or self.wanted_parallel, timeout, stage))
        return True

    async def stop(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> None:
        """SIGTERM the server this runtime (or an earlier one on the session) started, SIGKILL
        after :data:`TERM_GRACE_SECONDS`; one found running (no pid file of ours) is left alone, and
        so is a process a stale pid file names (not the server started: its start time or command
        line differ), whose file is dropped and reported (``STALE_PID_FILE``)."""
        grace = max(0.5, min(TERM_GRACE_SECONDS, timeout / 2))
        pid_file = self.spec.files("pid")
        result = await self.conn.run(stop_script(pid_file, self.spec.process_pattern, grace_steps=int(grace / 0.1)),
                                     stage=stage, what=f"stopping the {self.spec.program} started earlier",
                                     timeout=timeout)
        self._report_stale(result.stdout, pid_file)
        if "stopped" not in result.stdout:
            return  # nothing of ours ran: a server answering is someone else's
        deadline = time.monotonic() + timeout
        while await self._healthy() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    def _report_stale(self, output: str, pid_file: str) -> None:
        stale = stale_in(output)
        if stale is not None and self.on_status is not None:
            self.on_status("STALE_PID_FILE", **stale.fields(pid_file))

    # -- the model ---------------------------------------------------------------

    async def served_models(self) -> list[dict[str, Any]]:
        """``/v1/models``' entries; empty when the server does not answer."""
        if not self.local_port:
            return []
        try:
            async with http_client(self.url, 30) as http:
                data = (await http.get("/v1/models")).json().get("data", [])
            return [entry for entry in data if isinstance(entry, dict)]
        except (httpx.HTTPError, ValueError, AttributeError):
            return []

    async def prometheus_text(self) -> str | None:
        """The server's Prometheus exposition (``metrics_path``, over the same forward as the API);
        None when the runtime has none or the server does not answer it."""
        if self.metrics_path is None or not self.local_port:
            return None
        try:
            async with http_client(self.url, 30) as http:
                response = await http.get(self.metrics_path)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    async def pull(self, model: str, timeout: float,
                   on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Nothing to pull: the server loads at launch. A model other than the served one is served
        instead (the server restarted with it), when this runtime started the server."""
        check_model_name(model)
        if model not in await self.loaded_models():
            if not self.started_here and await self._healthy():
                raise StageError(Stage.MODEL_PULL, f"the {self.name} server found running does not serve {model}")
            if self.started_here:
                await self.stop(timeout, Stage.MODEL_PULL)
            try:
                await self._serve(model, self.num_parallel or self.wanted_parallel, timeout, Stage.MODEL_PULL)
            except StageError as exc:
                raise StageError(Stage.MODEL_PULL, f"{self.name} could not load {model}: {exc.message}") from None
        self.prepared[model] = await self._describe(model)
        if on_progress is not None:
            on_progress({"status": "success", "model": model, "load_seconds": self.load_seconds})

    async def _describe(self, model: str) -> PulledModel:
        """The served model, its size what the server holds in GPU memory (weights and KV cache) on the
        cell's GPUs (``-i``: on a shared machine, other cells' servers are not ours)."""
        only = f"-i {self.placement.visible_devices} " if self.placement.indices else ""
        used = await self.conn.run(f"nvidia-smi {only}--query-compute-apps=used_memory --format=csv,noheader,nounits",
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
        raise StageError(Stage.MODEL_PULL, f"{self.name} does not serve {model}")

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """One short chat request; the load time is the server's launch-to-health time."""
        body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
                "stream": False}
        started = time.monotonic()
        try:
            async with http_client(self.url, timeout) as http:
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
        """These servers keep the whole model on the GPU (no CPU offload unless asked for)."""
        if model not in await self.loaded_models():
            return None
        size = (self.prepared.get(model) or await self._describe(model)).size_bytes
        return {"size": size, "size_vram": size, "fully_in_gpu": True}

    async def loaded_models(self) -> list[str]:
        """The names the server serves (``/v1/models``); empty when it does not answer."""
        return [str(entry.get("id", "")) for entry in await self.served_models()]

    async def unload(self, model: str) -> None:
        """These servers cannot unload a model and keep serving: the server is stopped, if a gpubench
        runtime started it (its pid file); one found running is left alone."""
        if model in await self.loaded_models():
            await self.stop(60, Stage.MODEL_PULL)

    async def remove(self, model: str) -> None:
        """Forget ``model``: its weights stay in the instance's cache."""
        await self.unload(model)
        self.prepared.pop(model, None)


def declare(runtime: type[OpenAIServerRuntime], *, image: ImageServer | None = None,
            sandbox: SandboxImitation | None = None) -> RuntimeFacts:
    """The declaration (``RUNTIME``) of an OpenAI-API server runtime: its launch facts are its
    :class:`LaunchSpec`'s, and it starts a server of its own per cell (a free port, files of its own)."""
    spec = runtime.spec
    return RuntimeFacts(name=runtime.name, runtime=runtime, server_per_cell=True, launch=spec.argv,
                        health_path=spec.health_path, version_command=spec.version_command,
                        tensor_parallel_flag=spec.tensor_parallel_flag, image=image, sandbox=sandbox)


# --------------------------------------------------------------------- pid files
#
# The pid files of the servers gpubench starts on an instance, and the check before one is signalled.
#
# A pid file (``$HOME/.gpubench/<runtime>-serve.pid``) outlives its server: a run killed
# before its teardown, or a reboot, leaves it behind, and the pid in it may since have
# been given to another process. Before a signal goes to it, the process must still be
# the server gpubench started (issue 21 item 5): its start time (``/proc/PID/stat``'s
# 22nd field, kept beside the pid when the server starts, in ``<runtime>-serve.start``)
# is the same, and its command line names the server's program. A process that is not
# is left alone and the file dropped ("stale"); the caller says so in the progress file.
# A pid file written before start times were kept is checked on its command line alone.
#
# Everything here is shell run on the instance; only constants and quoted paths reach it.


#: The start time of ``$pid`` in clock ticks since boot (field 22 of ``/proc/PID/stat``; the
#: command name before it may hold spaces, hence everything up to ``) `` is cut first).
_START_OF_PID = 'sed "s/.*) //" "/proc/$pid/stat" 2>/dev/null | cut -d" " -f20'


def start_file(pid_file: str) -> str:
    """Where the start time of the process in ``pid_file`` is kept."""
    return pid_file[: -len(".pid")] + ".start" if pid_file.endswith(".pid") else pid_file + ".start"


def record(pid_file: str) -> str:
    """Shell run right after ``nohup SERVER ... &``: keeps ``$!`` and its start time."""
    return (f'echo $! > "{pid_file}"; pid=$!; {_START_OF_PID} > "{start_file(pid_file)}"')


def identify(pid_file: str, pattern: str) -> str:
    """Shell that prints what the pid file names, on one line: ``none`` (no file), ``gone`` (its
    process has ended; the file is removed), ``stale pid=N comm=NAME REASON`` (another process: the
    file is removed, the process left alone), or ``ours N`` (``$pid`` is then set). ``pattern`` is a
    shell ``case`` pattern the server's command line (its words joined by spaces, a space at each
    end) matches, such as ``*vllm*``."""
    pid_file_q, start_q = f'"{pid_file}"', f'"{start_file(pid_file)}"'
    return (
        f'pid=$(cat {pid_file_q} 2>/dev/null); '
        f'if [ -z "$pid" ]; then rm -f {start_q}; echo none; '
        f'else case "$pid" in *[!0-9]*) rm -f {pid_file_q} {start_q}; echo "stale pid=? comm=? not a pid"; '
        f'pid="";; esac; fi; '
        f'if [ -n "$pid" ]; then '
        f'if [ ! -r "/proc/$pid/stat" ]; then rm -f {pid_file_q} {start_q}; echo gone; pid=""; '
        f'else cmd=" $(tr "\\0" " " < "/proc/$pid/cmdline" 2>/dev/null) "; now=$({_START_OF_PID}); '
        f'was=$(cat {start_q} 2>/dev/null); comm=$(cat "/proc/$pid/comm" 2>/dev/null); why=""; '
        f'if [ -n "$was" ] && [ "$was" != "$now" ]; then why="started at another time than the server"; '
        f'else case "$cmd" in {pattern}) ;; *) why="its command line is not the server'"'"'s";; esac; fi; '
        f'if [ -n "$why" ]; then rm -f {pid_file_q} {start_q}; echo "stale pid=$pid comm=$comm $why"; pid=""; '
        f'else echo "ours $pid"; fi; fi; fi'
    )


def stop_script(pid_file: str, pattern: str, *, grace_steps: int) -> str:
    """Shell that signals the process in ``pid_file`` only when :func:`identify` says it is ours:
    SIGTERM, up to ``grace_steps`` tenths of a second to exit, SIGKILL; then prints ``stopped``
    (0 steps: SIGKILL at once). Prints :func:`identify`'s line first."""
    term = (f'kill -TERM "$pid" 2>/dev/null; i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt {int(grace_steps)} ]; '
            f'do sleep 0.1; i=$((i+1)); done; ') if grace_steps > 0 else ""
    return (f'{identify(pid_file, pattern)}; if [ -n "$pid" ]; then {term}kill -KILL "$pid" 2>/dev/null; '
            f'rm -f "{pid_file}" "{start_file(pid_file)}"; echo stopped; fi')


def word_pattern(word: str) -> str:
    """A ``case`` pattern for a command line that holds ``word`` (quoted: matched literally)."""
    return f"*{shlex.quote(word)}*"


@dataclass(frozen=True)
class Stale:
    """A pid file that named another process: what the progress file says about it."""

    pid: str
    #: ``/proc/PID/comm`` of the process it names now (instance output: only a name's characters kept).
    comm: str
    reason: str

    def fields(self, pid_file: str) -> dict[str, str]:
        """The progress line's fields (``STATUS: STALE_PID_FILE file=... pid=... now=... reason=...``)."""
        return {"file": pid_file, "pid": self.pid, "now": self.comm or "?", "reason": self.reason}


_STALE = re.compile(r"^stale pid=(\S*) comm=(.*?) (not a pid|started at another time than the server|"
                    r"its command line is not the server's)$", re.M)


def stale_in(output: str) -> Stale | None:
    """The :class:`Stale` finding :func:`identify` printed in ``output``, if any."""
    match = _STALE.search(output)
    if match is None:
        return None
    pid = match.group(1) if match.group(1).isdigit() else "?"
    comm = re.sub(r"[^A-Za-z0-9._:+-]", "", match.group(2))[:32]
    return Stale(pid=pid, comm=comm, reason=match.group(3))


# --------------------------------------------------------------------- a server the image started
#
# A runtime on a session whose image serves the model (GPU Shopper's entrypoint mode).
#
# In entrypoint mode (``runtime.launch.mode: entrypoint``, matrix/launch.py) the
# instance's image started the server (``vllm serve`` in ``vllm/vllm-openai``, TGI's
# launcher) for the cell's model, and the GPU Shopper server reported the session
# ``running`` only once its ``/health`` answered. The cell's runtime then uses that
# server: it is found running on the API port, not started, and never stopped by the
# plugin (its ``stop`` and ``unload`` leave a server without a pid file of theirs alone).
# The load generator still runs on the instance over SSH and targets the port there.


def adopt_image_server(runtime: Runtime, launch: image_launch.LaunchSpec | None) -> bool:
    """Point ``runtime`` at the image's server; True when it did (an entrypoint launch).

    The port is the one the image listens on inside the instance (``api_port``, sent
    first in ``exposed_ports``). The session's ``api_port``/``api_endpoint`` are the
    address outside, which on Vast.ai is a mapped port: the load generator runs
    inside, so it uses the image's own port.
    """
    if launch is None or not launch.entrypoint:
        return False
    if facts_of(runtime.name).image is None or launch.api_port is None:
        raise StageError(Stage.RUNTIME_SETUP, f"runtime {runtime.name!r} cannot use a server its image started",
                         hint="use runtime vllm or tgi with `launch: {mode: entrypoint}`, or `mode: ssh`")
    runtime.remote_port = launch.api_port  # type: ignore[attr-defined]  # the image runtimes' server port
    runtime.image_served = True  # type: ignore[attr-defined]  # never replaced by a server of ours
    runtime.started_here = False
    return True
