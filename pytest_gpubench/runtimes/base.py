"""The ``Runtime`` seam: what a model server does for a cell, whichever server it is.

A cell's fixtures drive a runtime through one instance over SSH, in this order::

    ensure_installed -> locate -> ensure_serving        stage runtime_setup
    pull -> model_info -> warm_up                       stage model_pull
    ensure_healthy, endpoint (the load generator's)     stage benchmark
    residency, loaded_models, unload, remove, stop      results, and the next cell on a reused session

Everything above this folder (fixtures, the cell's benchmark, repeats, session
reuse) speaks :class:`Runtime`, never an implementation; :mod:`.registry` builds
the one a cell's ``runtime:`` names. ``tests/e2e/test_runtime_contract.py`` runs the
same suite against every registered implementation over real SSH to the sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Protocol

from ..errors import Stage
from ..remote.ssh import Connection
from .gpus import GpuPlacement


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
    #: The GPUs a server started here spans and sees (``runtimes/gpus.py``).
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
