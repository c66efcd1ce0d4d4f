"""The ``Runtime`` seam: what a model server does for a cell, whichever server it is.

A cell's fixtures drive a runtime through one instance over SSH, in this order::

    ensure_installed -> locate -> ensure_serving        stage runtime_setup
    pull -> model_info -> warm_up                       stage model_pull
    ensure_healthy, endpoint (the load generator's)     stage benchmark
    residency, loaded_models, unload, remove, stop      results, and the next cell on a reused session

Everything above this folder (fixtures, the cell's benchmark, repeats, session
reuse) speaks :class:`Runtime`, never an implementation; :mod:`.registry` builds
the one a cell's ``runtime:`` names. The contract's checks (``run/runtime_contract.py``)
hold an implementation to it over real SSH; ``tests/e2e/test_runtime_contract.py`` runs
them on every built-in one against the sandbox.

Below the protocol, what every implementation shares: the GPUs a server runs on
(:class:`GpuPlacement`), the one restart a server gets (:func:`restart_once`) and the
VRAM check before a pull (:func:`vram_shortfall`).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Protocol

from ..cloud.offers import VRAM_ROUNDING_GB
from ..errors import Stage, StageError
from ..remote.readings import HardwareInfo
from ..remote.ssh import Connection


class ServingApi(str, Enum):
    """The HTTP API an endpoint speaks, which the load generator must speak too."""

    #: Ollama's native ``POST /api/generate``, streamed as NDJSON with the server's own counters.
    OLLAMA = "ollama"
    #: OpenAI's streaming ``POST /v1/chat/completions`` with ``stream_options.include_usage``.
    OPENAI_CHAT = "openai-chat"
    #: OpenAI's streaming ``POST /v1/completions``.
    OPENAI_COMPLETIONS = "openai-completions"
    #: Seed 004's container workers: JSON request lines on stdin, JSON events on stdout.
    WORKER = "worker"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Endpoint:
    """Where the load generator sends its requests, and in which API.

    The load generator runs on the instance when it has python3 (``remote_url``),
    else here through the SSH port forward (``local_url``).
    """

    remote_url: str
    local_url: str
    api: ServingApi
    #: The environment variable (where the load generator runs) holding a bearer token; None: no token.
    api_key_env: str | None = None
    #: A CA file an https:// endpoint's certificate is verified against; None: the system's trust store.
    ca_file: str | None = None
    #: ``WORKER`` only: the argv that starts one container (``docker run ... IMAGE``).
    worker_command: tuple[str, ...] = ()


@dataclass
class PulledModel:
    """What the runtime says of a model it has prepared (for the result's ``model`` section)."""

    name: str
    size_bytes: int = 0
    digest: str = ""
    family: str = ""
    parameter_size: str = ""
    quantization: str = ""


class Runtime(Protocol):
    """A model server on one instance, driven through an SSH connection.

    Timeouts are seconds for the whole call. Failures raise
    :class:`~pytest_gpubench.errors.StageError` at the stage named in each docstring.
    """

    #: The name a matrix's ``runtime:`` gives it (``ollama``); also the result's ``model.runtime``.
    name: ClassVar[str]
    #: The SSH connection to the instance (telemetry, disk checks and the load generator use it too).
    conn: Connection
    #: The server's version once it serves ("" before).
    version: str
    #: Whether the server was started by this runtime (or by an earlier cell's on the same session).
    started_here: bool
    #: The parallel requests a server started here accepts; None for one found running (unknown).
    num_parallel: int | None
    #: The first (cold) warm-up's model load time and first-token time; None before it.
    warmup_load_seconds: float | None
    cold_first_token_ms: float | None
    #: The GPUs a server started here spans and sees (:class:`GpuPlacement`, below).
    placement: GpuPlacement
    #: The tensor-parallel size a server started here gets; None when it spreads layers instead.
    tensor_parallel: int | None

    async def ensure_installed(self, timeout: float) -> bool:
        """Install the server unless it is there already (stage ``runtime_setup``); True if it installed."""
        ...

    async def locate(self, timeout: float) -> None:
        """Find where the server listens on the instance and forward a local port to it."""
        ...

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """Start the server unless it answers, for ``num_parallel`` requests at once; return its version."""
        ...

    async def ensure_healthy(self, timeout: float, stage: Stage = Stage.BENCHMARK,
                             on_restart: Callable[[str], None] | None = None) -> bool:
        """Check that the server answers; restart it once per runtime if not (``on_restart`` told why
        first). True if it was restarted; raises at ``stage`` when it does not come back."""
        ...

    async def pull(self, model: str, timeout: float,
                   on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Prepare ``model`` on the instance (download it), reporting progress (stage ``model_pull``)."""
        ...

    async def model_info(self, model: str) -> PulledModel:
        """Check that ``model`` is prepared and describe it (stage ``model_pull``)."""
        ...

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """Load ``model`` with one short request; return the load time in seconds. With ``cold_start``,
        keep its load and first-token times as the cell's cold-start figures (stage ``model_pull``)."""
        ...

    @property
    def endpoint(self) -> Endpoint:
        """Where, and in which API, the load generator sends its requests."""
        ...

    async def residency(self, model: str) -> dict[str, Any] | None:
        """``{size, size_vram, fully_in_gpu}`` of the loaded ``model``; None when the server cannot say."""
        ...

    async def loaded_models(self) -> list[str]:
        """Names of the models in GPU memory now; empty when the server cannot say."""
        ...

    def canonical_model(self, model: str) -> str:
        """The name under which this server knows ``model`` (Ollama: a bare name means ``:latest``)."""
        ...

    async def unload(self, model: str) -> None:
        """Free ``model``'s GPU memory now; it stays prepared on disk."""
        ...

    async def remove(self, model: str) -> None:
        """Delete the prepared ``model`` from the instance's disk."""
        ...

    async def stop(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> None:
        """End the server this runtime (or an earlier cell's on the session) started; one found
        running is left alone."""
        ...


# --------------------------------------------------------------------- GPUs
#
# Which GPUs a cell's server runs on: how many (the matrix's ``gpus:``) and which (a provider's lease).
#
# A provider that rents a whole machine leaves ``SshDetails.gpu_indices`` empty (the
# machine has exactly the cell's GPUs: offers are chosen by count); one that shares a
# machine (``hosts``, ``local``) fills it with the GPUs it leased to the cell. Every
# server a runtime starts gets ``CUDA_VISIBLE_DEVICES`` set to those indices when there
# are any (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: the indices are nvidia-smi's, in PCI bus
# order), so it never touches another cell's GPUs, and spans ``count`` GPUs its own
# way: a tensor-parallel flag (vLLM, SGLang, TGI), Ollama's ``OLLAMA_SCHED_SPREAD``, the
# layers llama.cpp splits over the GPUs it sees, Docker's ``--gpus "device=0,1"``.


@dataclass(frozen=True)
class GpuPlacement:
    """The GPUs of one machine a cell's server runs on."""

    #: GPUs the server spans (the cell's ``gpus``).
    count: int = 1
    #: The machine's GPUs (nvidia-smi indices) the cell's server runs on; empty: all of them.
    indices: tuple[int, ...] = ()

    @classmethod
    def of(cls, count: int = 1, indices: Iterable[int] = ()) -> GpuPlacement:
        """A checked placement: whole, distinct, non-negative indices, at least ``count`` of them when given.

        The server gets the first ``count`` of them: a runtime with one server per machine (Ollama, a
        worker) leases the whole machine so no other cell shares its server, but spans only the cell's GPUs."""
        given = tuple(indices)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in given) or len(set(given)) < len(given):
            raise StageError(Stage.RUNTIME_SETUP, f"GPU indices {list(given)} are not distinct whole numbers >= 0")
        if given and len(given) < count:
            raise StageError(Stage.RUNTIME_SETUP, f"the cell spans {count} GPUs but was given {len(given)}: "
                                                   f"{list(given)}")
        count = max(1, int(count))
        return cls(count=count, indices=given[:count])

    @property
    def visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES``'s value: ``"0,1"``; ``""`` when the cell may use every GPU."""
        return ",".join(map(str, self.indices))

    def owns(self, gpu: int) -> bool:
        """Whether nvidia-smi's GPU ``gpu`` is the cell's: any GPU without indices, else one of them."""
        return not self.indices or gpu in self.indices

    def environment(self) -> dict[str, str]:
        """The variables a server started for the cell gets: ``CUDA_VISIBLE_DEVICES`` with the indices,
        and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers the GPUs as nvidia-smi (and the lease) does;
        by default CUDA puts the fastest first, and on a machine with mixed GPUs ``1`` would be another card."""
        if not self.indices:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": self.visible_devices}

    def shell_prefix(self) -> str:
        """``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 `` before a command (quoted), or ``""``."""
        return "".join(f"{name}={shlex.quote(value)} " for name, value in self.environment().items())

    @property
    def docker_devices(self) -> str:
        """Docker's ``--gpus`` value: ``device=0`` or ``"device=0,1"`` (quoted: Docker reads the option as
        CSV, where a bare comma would split it); the given GPUs, else the first ``count``."""
        devices = ",".join(map(str, self.indices or range(self.count)))
        return f'"device={devices}"' if "," in devices else f"device={devices}"

    def describe(self, tensor_parallel: int | None) -> dict[str, Any]:
        """What the result records: the GPUs spanned, the tensor-parallel size (None: the server
        spreads layers instead), and the visible devices ("": all of the machine's)."""
        return {"count": self.count, "tensor_parallel": tensor_parallel, "visible_devices": self.visible_devices}


# --------------------------------------------------------------------- the one restart
#
# The one restart a runtime allows a server that stopped answering, shared by every implementation.


async def restart_once(runtime: Any, *, where: str, probe: str, log: str, stage: Stage, timeout: float,
                       on_restart: Callable[[str], None] | None, serve: Callable[[], Awaitable[None]]) -> None:
    """Start the server of ``runtime`` again after ``probe`` went unanswered: once per runtime.

    ``on_restart`` is told why first; a server this runtime started is stopped first, since
    a hung one (alive, not answering) would keep the port; one it found running it cannot
    tell from another process, and leaves alone. Raises at ``stage`` on a second failure or
    when ``serve`` does not bring the server back. ``runtime`` counts its ``restarts``.
    """
    if runtime.restarts:
        raise StageError(stage, f"{where} stopped answering again after its one restart",
                         hint=f"its log is {log} on the instance")
    runtime.restarts += 1
    reason = f"{where} did not answer {probe}"
    if on_restart is not None:
        on_restart(reason)
    if runtime.started_here:
        await runtime.stop(timeout, stage)
    try:
        await serve()
    except StageError as exc:
        raise StageError(stage, f"{reason} and did not come back after one restart: {exc.message}") from None


# --------------------------------------------------------------------- VRAM
#
# Does the model fit the GPU the instance really has? Checked before pulling it.
#
# The offer's ``vram_gb`` chose the machine, but a listing can be wrong, and a
# model too large for the card only fails when Ollama loads it, after minutes of
# download (seed 001: "OOM during model load | Check VRAM before loading"). The
# memory ``nvidia-smi`` reports on the instance is the truth to compare with.


def vram_shortfall(model: str, need_gb: float, hardware: HardwareInfo | None, gpus: int | None = None) -> str | None:
    """Why ``model`` (needing ``need_gb`` GB) cannot fit the cell's GPUs, or None.

    Memory is summed over the GPUs the cell spans (``gpus``, at most those nvidia-smi
    lists; None: all it lists): every runtime spreads a model over them. It is counted
    as the offers count it (MiB / 1024, within ``VRAM_ROUNDING_GB``), so a card
    that was good enough to rent is good enough here. Unknown memory is no reason
    to skip.
    """
    if hardware is None or hardware.gpu_memory_mib <= 0:
        return None
    count = max(1, hardware.gpu_count if gpus is None else min(gpus, hardware.gpu_count or gpus))
    total_gb = hardware.gpu_memory_mib * count / 1024
    if total_gb + VRAM_ROUNDING_GB >= need_gb:
        return None
    cards = f"{count} x " if count > 1 else ""
    return (f"{model} needs {need_gb:g} GB of VRAM, but nvidia-smi on the instance reports "
            f"{cards}{hardware.gpu_memory_mib} MiB ({hardware.gpu_name or 'unknown GPU'}, {total_gb:.1f} GB "
            "in all): not pulled")
