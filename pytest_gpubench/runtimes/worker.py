"""Container workers (seed 004) on an instance: Docker, the model's image, one container per request slot.

:class:`WorkerRuntime` implements the :class:`~.base.Runtime` protocol for
``runtime: {name: worker, presets: model_presets.yaml}``: the cell's model is a
key of the presets file (:mod:`..matrix.worker_presets`), whose ``docker_image``,
``command`` and ``env_vars`` make the container::

    docker run --rm -i --gpus device=N --label gpubench-worker
        -e MODEL_NAME=... -e MODEL_PATH=/models -e GPU_DEVICE=0 [-e preset env...]
        [runtime.args...] IMAGE [command...]

The request contract, and why: a worker answers requests it reads on **stdin**, one
JSON line each (``{"prompt", "max_tokens", "model"}``, ``ignore_eos`` when the
workload asks), with seed-004 events on stdout ending in ``finish``. A *session*
worker then reads the next line; a *one-off* worker exits after ``finish`` (the
seed's "exit when complete"), and the next request starts a new container. This is
the simplest contract both kinds of seed-004 worker can meet without a server of
their own (no port, no HTTP), and the honest one for measuring: the load
generator keeps one container per in-flight request slot, starts them before the
run clock, and times each request from the moment its line is written, so
container start and model load never count as TTFT. A one-off worker's start does
happen inside the run; it is kept apart as the record's ``startup_ms`` (and shows
in the send lag, not in TTFT). Nothing else reaches the instance's shell but
validated, ``shlex``-quoted words.

Docker is not installed by the plugin (``docker --version`` missing is a stage
``runtime_setup`` error), and the load generator must run on the instance (python3
there), since it drives the containers. ``pull`` is ``docker pull IMAGE`` unless
``docker image inspect`` finds it; the warm-up is one request to one container.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import MatrixError, Stage, StageError
from ..matrix.cells import Cell
from ..matrix.worker_presets import WorkerPreset, load_presets
from ..remote.loadgen import parse_worker_line
from ..remote.ssh import Connection
from ..runtime_facts import RuntimeFacts, SandboxImitation
from .base import Endpoint, GpuPlacement, PulledModel, ServingApi, restart_once
from .openai_server import check_arguments

#: Every container gpubench starts carries it, so :meth:`WorkerRuntime.stop` finds what a run left.
LABEL = "gpubench-worker"
MODEL_PATH = "/models"
#: ``docker pull`` progress as the sandbox (and ``--progress plain`` tools) print it.
_PULLED = re.compile(r"([\d.]+)\s*([kMG]B)\s*/\s*([\d.]+)\s*([kMG]B)")
_UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass
class WorkerRuntime:
    """A seed-004 container worker on one instance, driven through an SSH connection (a :class:`~.base.Runtime`)."""

    name: ClassVar[str] = "worker"
    #: The model lives only in the containers of a benchmark's request slots, so nothing stays
    #: loaded to list or describe: ``loaded_models`` is empty and ``residency`` None ("cannot say").
    keeps_models_loaded: ClassVar[bool] = False
    conn: Connection
    #: Every worker of the presets file, by model name.
    presets: dict[str, WorkerPreset]
    #: The cell's model: the endpoint's containers run its worker.
    model: str
    #: Extra ``docker run`` flags (the matrix's ``runtime.args``), before the image.
    args: tuple[str, ...] = ()
    #: The GPUs each container gets (``--gpus device=0`` or ``"device=0,1"``).
    placement: GpuPlacement = GpuPlacement()
    version: str = ""
    warmup_load_seconds: float | None = None
    cold_first_token_ms: float | None = None
    num_parallel: int | None = None
    started_here: bool = False
    restarts: int = 0
    #: ``stop`` was called: the containers were removed and nothing serves until started again.
    stopped: bool = False
    prepared: dict[str, PulledModel] = field(default_factory=dict)

    #: A worker spreads its model over its container's GPUs its own way: no flag of ours.
    tensor_parallel: ClassVar[None] = None

    @classmethod
    def for_cell(cls, conn: Connection, cell: Cell, placement: GpuPlacement = GpuPlacement()) -> WorkerRuntime:
        """The worker of ``cell``'s model in its presets file."""
        if not cell.runtime_presets:
            raise StageError(Stage.RUNTIME_SETUP, "runtime worker needs `presets: model_presets.yaml`")
        try:
            presets = load_presets(cell.runtime_presets)
        except MatrixError as exc:
            raise StageError(Stage.RUNTIME_SETUP, str(exc)) from None
        return cls(conn, presets=presets, model=cell.model, args=check_arguments(cell.runtime_args, "docker run"),
                   placement=placement)

    def preset(self, model: str | None = None, stage: Stage = Stage.MODEL_PULL) -> WorkerPreset:
        """The worker of ``model`` (default: the cell's), or a clear error naming the presets' models."""
        model = self.model if model is None else model
        if model not in self.presets:
            raise StageError(stage, f"no worker for {model} in the presets file; models there: "
                                    f"{', '.join(sorted(self.presets))}")
        return self.presets[model]

    # -- the container -------------------------------------------------------------

    def environment(self, model: str | None = None) -> dict[str, str]:
        """The container's variables: seed 004's three, the preset's (MODEL_NAME may be overridden).

        ``GPU_DEVICE`` numbers the GPUs as the container sees them (Docker renumbers the
        ``--gpus`` devices from 0): ``0``, or ``0,1`` for a worker on two GPUs."""
        preset = self.preset(model)
        return {"MODEL_NAME": preset.model, **dict(preset.env_vars), "MODEL_PATH": MODEL_PATH,
                "GPU_DEVICE": ",".join(map(str, range(self.placement.count)))}

    def docker_command(self, model: str | None = None) -> list[str]:
        """``docker run`` for one container, as argv (the load generator runs it without a shell)."""
        preset = self.preset(model)
        argv = ["docker", "run", "--rm", "-i", "--gpus", self.placement.docker_devices, "--label", LABEL]
        for name, value in self.environment(model).items():
            argv += ["-e", f"{name}={value}"]
        return [*argv, *self.args, preset.docker_image, *preset.command]

    @property
    def endpoint(self) -> Endpoint:
        """No URL: the load generator runs the containers itself (``worker_command``)."""
        where = f"docker://{self.preset().docker_image}"
        return Endpoint(remote_url=where, local_url=where, api=ServingApi.WORKER,
                        worker_command=tuple(self.docker_command()))

    def canonical_model(self, model: str) -> str:
        return model

    # -- install, serve ------------------------------------------------------------

    async def _docker_version(self, timeout: float, stage: Stage) -> str | None:
        result = await self.conn.run("docker --version", stage=stage, what="docker --version", timeout=timeout,
                                     check=False)
        if not result.ok:
            return None
        match = re.search(r"(\d+\.\d+[.\w+-]*)", result.stdout)
        return match.group(1) if match else "unknown"

    async def ensure_installed(self, timeout: float) -> bool:
        """Docker and python3 must be there (the plugin installs neither)."""
        version = await self._docker_version(timeout, Stage.RUNTIME_SETUP)
        if version is None:
            raise StageError(Stage.RUNTIME_SETUP, "docker is not installed on the instance (`docker --version` "
                                                   "failed)", hint="rent an offer whose image has Docker with the "
                                                                   "NVIDIA container toolkit")
        python = await self.conn.run("command -v python3", stage=Stage.RUNTIME_SETUP, what="looking for python3",
                                     timeout=timeout, check=False)
        if not python.ok:
            raise StageError(Stage.RUNTIME_SETUP, "runtime worker needs python3 on the instance: the load "
                                                   "generator runs there, next to the containers it starts")
        self.version = version
        return False

    async def locate(self, timeout: float) -> None:
        """Nothing listens: the containers are started per request slot."""

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """Nothing to start before the benchmark; one container per parallel request then."""
        if not self.version:
            self.version = await self._docker_version(timeout, Stage.RUNTIME_SETUP) or "unknown"
        self.num_parallel, self.started_here, self.stopped = max(1, int(num_parallel)), True, False
        return self.version

    async def ensure_healthy(self, timeout: float, stage: Stage = Stage.BENCHMARK,
                             on_restart: Callable[[str], None] | None = None) -> bool:
        """Docker must answer, and the runtime not be stopped; a stopped one is started again once."""
        if not self.stopped and await self._docker_version(min(timeout, 30), stage) is not None:
            return False

        async def serve() -> None:
            await self.ensure_serving(timeout, self.num_parallel or 1)
        await restart_once(self, where="docker on the instance", probe="docker --version", log="docker's own log",
                           stage=stage, timeout=timeout, on_restart=on_restart, serve=serve)
        return True

    async def stop(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> None:
        """Remove any container of ours still running (the load generator ends its own; this is the net)."""
        await self.conn.run(f"docker ps -q --filter label={LABEL} | xargs -r docker rm -f >/dev/null 2>&1; true",
                            stage=stage, what="removing leftover worker containers", timeout=timeout, check=False)
        self.stopped = True

    # -- the image -------------------------------------------------------------------

    async def pull(self, model: str, timeout: float,
                   on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``docker pull`` the model's image unless it is there, its progress passed on."""
        name = self.preset(model).docker_image
        image = shlex.quote(name)
        present = await self.conn.run(f"docker image inspect {image} >/dev/null 2>&1", stage=Stage.MODEL_PULL,
                                      what="docker image inspect", timeout=60, check=False)
        if present.ok:
            if on_progress is not None:
                on_progress({"status": f"{name} is on the instance already"})
            return

        async def follow() -> None:
            async for line in self.conn.stream_lines(f"docker pull {image} 2>&1", stdin=""):
                done = _PULLED.search(line)
                if done is not None and on_progress is not None:
                    on_progress({"status": line, "completed": int(float(done[1]) * _UNITS[done[2]]),
                                 "total": int(float(done[3]) * _UNITS[done[4]])})
        try:
            await asyncio.wait_for(follow(), timeout)
        except asyncio.TimeoutError:
            raise StageError(Stage.MODEL_PULL, f"docker pull {name} did not finish within "
                                               f"the stage timeout ({timeout:.0f} s)") from None
        if self.conn.last_exit_status:
            raise StageError(Stage.MODEL_PULL, f"docker pull {name} failed "
                                               f"(exit {self.conn.last_exit_status})")

    async def model_info(self, model: str) -> PulledModel:
        """The image as Docker describes it (size and id)."""
        if model in self.prepared:
            return self.prepared[model]
        image = self.preset(model).docker_image
        result = await self.conn.run(f"docker image inspect {shlex.quote(image)}",
                                     stage=Stage.MODEL_PULL, what="docker image inspect", timeout=60, check=False)
        try:
            info = json.loads(result.stdout)[0] if result.ok else None
        except (ValueError, IndexError, TypeError):
            info = None
        if not isinstance(info, dict):
            raise StageError(Stage.MODEL_PULL, f"the image {image} of {model} is not on the "
                                               "instance")
        self.prepared[model] = PulledModel(name=model, size_bytes=int(info.get("Size") or 0),
                                           digest=str(info.get("Id") or ""), family="container worker")
        return self.prepared[model]

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """One request to one container: the load time is its start to its first event."""
        request = json.dumps({"prompt": "Hello", "max_tokens": 1, "model": model})
        started = time.monotonic()
        first_event = first_delta = None
        outcome = await self._one_request(model, request, timeout)
        for at, event in outcome:
            first_event = first_event if first_event is not None else at
            if event["event"] == "text_delta" and first_delta is None:
                first_delta = at
        load = (first_event or started) - started
        if cold_start:
            self.warmup_load_seconds = load
            self.cold_first_token_ms = ((first_delta or started) - started) * 1000
        return load

    async def _one_request(self, model: str, request: str, timeout: float) -> list[tuple[float, dict[str, Any]]]:
        """Run one container of ``model`` for ``request``; its events with their arrival times, or why it failed."""
        events: list[tuple[float, dict[str, Any]]] = []
        command = shlex.join(self.docker_command(model))

        async def read() -> None:
            async for line in self.conn.stream_lines(command, stdin=request + "\n"):
                if line.strip():
                    events.append((time.monotonic(), parse_worker_line(line)))
        try:
            await asyncio.wait_for(read(), timeout)
        except asyncio.TimeoutError:
            raise StageError(Stage.MODEL_PULL, f"the worker sent no finish within the stage timeout "
                                               f"({timeout:.0f} s)") from None
        except ValueError as exc:
            raise StageError(Stage.MODEL_PULL, f"the worker's warm-up answer: malformed worker output: {exc}") \
                from None
        return check_finished(events, self.conn.last_exit_status, self.conn.last_stderr)

    # -- what the server holds ---------------------------------------------------------

    async def residency(self, model: str) -> dict[str, Any] | None:
        """Containers end with each request slot: nothing stays resident to describe."""
        return None

    async def loaded_models(self) -> list[str]:
        return []

    async def unload(self, model: str) -> None:
        """Nothing stays loaded between benchmarks (the containers end with the load generator)."""

    async def remove(self, model: str) -> None:
        """Delete the model's image from the instance's disk (``docker image rm``)."""
        image = shlex.quote(self.preset(model).docker_image)
        await self.conn.run(f"docker image rm {image} >/dev/null 2>&1; true", stage=Stage.MODEL_PULL,
                            what="docker image rm", timeout=60, check=False)
        self.prepared.pop(model, None)


def check_finished(events: list[tuple[float, dict[str, Any]]], exit_status: int | None,
                   stderr: str) -> list[tuple[float, dict[str, Any]]]:
    """The events of one finished container run, or a :class:`StageError` (``model_pull``) saying why not."""
    tail = stderr.strip()[-300:]
    said = f"; its stderr ends: {tail}" if tail else ""
    finish = next((event for _, event in events if event["event"] == "finish"), None)
    if finish is None:
        if not events:
            raise StageError(Stage.MODEL_PULL, f"the worker did not start: it exited with status {exit_status} "
                                               f"before its first event{said}")
        raise StageError(Stage.MODEL_PULL, f"the worker exited with status {exit_status} before its finish "
                                           f"event{said}")
    if finish.get("status", "completed") != "completed":
        raise StageError(Stage.MODEL_PULL, f"the worker finished with status {finish.get('status')}: "
                                           f"{finish.get('message') or 'no message'}")
    return events


#: One container per request slot, started by the load generator (no server, no health path); a cell on a
#: machine the run does not own leases every GPU of it; the sandbox's ``docker`` stand-in runs its workers.
RUNTIME = RuntimeFacts(name="worker", runtime=WorkerRuntime, server_per_cell=False, version_command="docker --version",
                       sandbox=SandboxImitation(program="docker", stand_in="docker_standin", kind="own"))
