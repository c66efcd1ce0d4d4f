"""What one emulated instance is: the JSON file named by ``GPUBENCH_SANDBOX_INSTANCE``.

The sandbox API writes this file when it creates an instance; the programs that run
on the instance (the ``ollama``, ``nvidia-smi`` and ``df`` stand-ins) read it to know
which GPU they pretend to be, which models can be pulled and how fast they run, how
big the disk is, and where to keep their shared state.

``time_scale`` shrinks emulated *waits* (pull time, model load time) so that a
sandbox run takes seconds. It never touches token rate or time to first token: those
are the truths a benchmark measures, so they stay real. ``batch_ceiling_factor``
says how they change when requests run in parallel (:mod:`.ollama_engine`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

INSTANCE_ENV = "GPUBENCH_SANDBOX_INSTANCE"

MIB = 1024 * 1024
GIB = 1024 * MIB
# What each emulated card holds before any model (driver and CUDA context): the
# engine keeps it free when fitting models and nvidia-smi reports it as used.
BASELINE_MIB = 300
#: System memory the operating system and the runtime keep for themselves.
BASELINE_RAM_MIB = 1024


class _Value(BaseModel):
    # Extra keys are ignored so that the sandbox API can grow the file without
    # breaking stand-ins already running on older instances.
    model_config = ConfigDict(frozen=True, extra="ignore")


class GpuSpec(_Value):
    """The GPU the instance pretends to have (``count`` identical cards)."""

    gpu_type: str
    name: str
    memory_mib: int = Field(gt=0)
    count: int = Field(default=1, ge=0)
    driver_version: str
    cuda_version: str
    power_limit_w: float = Field(gt=0)
    compute_capability: str
    #: Highest SM and memory clocks (MHz); None: N/A.
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None


class GpuTools(_Value):
    """How the instance's driver answers system detection (the ``gpu_driver`` fault).

    ``nvml``: ``nvidia-ml-py`` is installed (the stand-in ``pynvml`` answers); ``xml_log``:
    ``nvidia-smi -q -x`` works; ``refused_fields``: ``--query-gpu`` fields this driver
    does not know yet.
    """

    nvml: bool = False
    xml_log: bool = True
    refused_fields: tuple[str, ...] = ()


class HostSpec(_Value):
    """The machine around the GPU."""

    cpu_model: str
    cpu_cores: int
    ram_gib: float


class OllamaSpec(_Value):
    """The Ollama release the instance carries and how fast its registry is."""

    version: str
    pull_mb_per_s: float = Field(gt=0)
    install_seconds: float = Field(default=0.0, ge=0)


class DiskSpec(_Value):
    """The instance's disk: one filesystem on ``/`` that Ollama's models fill.

    Sizes are GiB (``df -h`` shows a 50 GB disk as ``50G``). ``system_gb`` is what
    the image and the operating system already use before any model. The defaults
    are a Vast.ai session that asked for no ``disk_gb`` (an instance file written
    before disks were emulated reads as one).
    """

    size_gb: float = Field(default=50, gt=0)
    system_gb: float = Field(default=15, ge=0)
    filesystem: str = "overlay"

    @property
    def size_bytes(self) -> int:
        """The whole disk, in bytes."""
        return int(self.size_gb * GIB)

    @property
    def system_bytes(self) -> int:
        """What the system uses, in bytes (never more than the disk)."""
        return min(int(self.system_gb * GIB), self.size_bytes)


class ModelSpec(_Value):
    """One model of the emulated registry, with the truths the benchmark should find."""

    size_bytes: int = Field(gt=0)
    family: str
    parameter_size: str
    quantization_level: str
    digest: str
    tokens_per_second: float = Field(gt=0)
    ttft_ms: float = Field(ge=0)
    load_seconds: float = Field(ge=0)
    #: Thinking-capable: reasons first unless a request says ``think: false``.
    thinking: bool = False
    #: Aggregate throughput ceiling of parallel requests over ``tokens_per_second``
    #: (the catalog's batching model); None: parallel requests cost nothing (an
    #: instance file written by hand, or before the model existed).
    batch_ceiling_factor: float | None = Field(default=None, gt=0)
    #: The same for each runtime, by the program that serves it (``ollama``, ``vllm``,
    #: ``llama-server``, ...); one left out gets ``batch_ceiling_factor`` (an instance file
    #: written before runtimes had their own).
    batch_ceiling_factors: dict[str, float] = Field(default_factory=dict)
    #: The share of the built-in accuracy problems it answers right (the catalog's ``accuracy``).
    accuracy: float = Field(default=1.0, ge=0, le=1)

    def ceiling_factor(self, program: str) -> float | None:
        """``F`` under ``program`` (docs/sandbox.md, "Batching and power law"); None: batching is free."""
        return self.batch_ceiling_factors.get(program, self.batch_ceiling_factor)

    @property
    def digest_hex(self) -> str:
        """The digest without its ``sha256:`` prefix, as ``/api/tags`` shows it."""
        return self.digest.split(":", 1)[-1]


class InstanceSpec(_Value):
    """The whole instance description."""

    session_id: str
    time_scale: float = Field(default=1.0, ge=0)
    gpu: GpuSpec
    gpu_tools: GpuTools = Field(default_factory=GpuTools)
    host: HostSpec
    ollama: OllamaSpec
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    state_dir: Path
    #: Speed of the part of a model that runs from system memory, against the GPU's
    #: (the catalog's ``offload_penalty``): a layer on the CPU decodes ~8x slower.
    offload_penalty: float = Field(default=0.12, gt=0, le=1)
    disk: DiskSpec = Field(default_factory=DiskSpec)
    #: Image sizes in bytes by repository for the ``docker`` stand-in's pulls (``default`` for the rest).
    docker_images: dict[str, int] = Field(default_factory=dict)

    def find_model(self, name: str) -> tuple[str, ModelSpec] | None:
        """The catalog entry for ``name`` (tag defaulting to ``latest``), or None."""
        wanted = normalize_model_name(name)
        for key, spec in self.models.items():
            if normalize_model_name(key) == wanted:
                return wanted, spec
        return None

    def scaled(self, seconds: float) -> float:
        """An emulated wait, shrunk by the time scale."""
        return seconds * self.time_scale


def normalize_model_name(name: str) -> str:
    """``qwen2`` -> ``qwen2:latest``; registry prefixes and case are dropped.

    Ollama treats ``registry.ollama.ai/library/qwen2:7b``, ``library/qwen2:7b`` and
    ``qwen2:7b`` as one model, and names are case-insensitive.
    """
    name = name.strip().lower()
    for prefix in ("https://", "http://", "registry.ollama.ai/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        name += ":latest"
    return name


#: The variable CUDA programs read to see only some GPUs (nvidia-smi ignores it, as the stand-in does).
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def visible_gpus(gpu: GpuSpec, environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The GPUs (nvidia-smi indices) a CUDA program on the instance sees, in its order.

    All of them without ``CUDA_VISIBLE_DEVICES``; else its comma-separated indices,
    ending, as CUDA's enumeration does, at the first entry that names no GPU of the
    machine (or one named already): ``""`` and ``"9"`` on a 2-GPU machine leave none.
    """
    env = os.environ if environ is None else environ
    value = env.get(VISIBLE_DEVICES_ENV)
    if value is None:
        return tuple(range(gpu.count))
    seen: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= gpu.count or int(part) in seen:
            break
        seen.append(int(part))
    return tuple(seen)


def load_instance_spec(environ: Mapping[str, str] | None = None) -> InstanceSpec:
    """Read the instance file named by ``GPUBENCH_SANDBOX_INSTANCE``.

    Raises ``RuntimeError`` with a one-line message when the variable is missing or
    the file cannot be read or validated, so the stand-ins can print it as ``Error:``.
    """
    env = os.environ if environ is None else environ
    path = env.get(INSTANCE_ENV)
    if not path:
        raise RuntimeError(f"{INSTANCE_ENV} is not set: this program only runs on a sandbox instance")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RuntimeError(f"cannot read instance file {path}: {exc.strerror}") from exc
    try:
        return InstanceSpec.model_validate_json(text)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise RuntimeError(f"invalid instance file {path}: {' '.join(first[:3])}") from exc
