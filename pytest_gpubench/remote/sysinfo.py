"""What an instance is: its GPUs (from NVML, ``nvidia-smi -q -x`` or the CSV query) and its host.

:class:`SystemInfo` is recorded once per session (the store's ``systems``) and shown in
the report's hardware table; :func:`~.system.detect_system` gathers it over SSH. The
parsers here never raise on odd values: a figure a source cannot give is ``None`` (or
``""`` for text), and :attr:`GpuFacts.source` says which source answered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..gpuinfo import parse_nvidia_smi_xml

__all__ = [
    "CSV_FIELDS", "DISK_PROBE", "GpuDevice", "GpuFacts", "GpuSource", "HOST_PROBE", "HostFacts", "SystemInfo",
    "gpu_facts_from_csv", "gpu_facts_from_nvml", "gpu_facts_from_xml", "parse_cuda_banner", "parse_df",
    "parse_host_probe",
]

#: Which source answered, in the order they are asked.
GpuSource = Literal["nvml", "nvidia-smi-xml", "nvidia-smi-csv"]

#: ``nvidia-smi --query-gpu`` fields of the CSV fallback, each a :class:`GpuDevice` field.
CSV_FIELDS: dict[str, str] = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "pci.bus_id": "pci_bus_id",
    "memory.total": "memory_total_mib",
    "driver_version": "driver_version",
    "compute_cap": "compute_capability",
    "clocks.max.sm": "sm_clock_max_mhz",
    "clocks.max.memory": "mem_clock_max_mhz",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "power.limit": "power_limit_w",
}

#: The disk models go to (OLLAMA_MODELS, else ~/.ollama, else home) as ``disk_path=`` and
#: ``df=`` (``df -Pk``'s last line) lines: part of :data:`HOST_PROBE`, and alone before a pull
#: (``system.free_disk_bytes``); :func:`parse_host_probe` reads both.
DISK_PROBE = (
    'd="${OLLAMA_MODELS:-$HOME/.ollama}"; [ -d "$d" ] || d="$HOME"; echo "disk_path=$d"; '
    'echo "df=$(df -Pk "$d" 2>/dev/null | tail -n 1)"'
)

#: Host facts as ``key=value`` lines, from any Linux without extra tools, then :data:`DISK_PROBE`.
HOST_PROBE = (
    'echo "cores=$(nproc 2>/dev/null)"; '
    "echo \"cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)\"; "
    "echo \"mem_kib=$(sed -n 's/^MemTotal:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/meminfo 2>/dev/null)\"; "
    "echo \"os=$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | head -n 1)\"; "
    'echo "kernel=$(uname -r 2>/dev/null)"; ' + DISK_PROBE
)


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class GpuDevice(_Value):
    """One GPU: ``index`` is nvidia-smi's (and NVML's) index on the machine."""

    index: int
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    memory_total_mib: int | None = None
    compute_capability: str = ""
    #: Highest SM and memory clocks the card can run (MHz), and the clocks when detected.
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    #: The power limit in force (W): NVML's enforced limit, nvidia-smi's current one.
    power_limit_w: float | None = None


class GpuFacts(_Value):
    """What one source said about the machine's GPUs."""

    source: GpuSource
    driver_version: str = ""
    cuda_version: str = ""
    gpus: tuple[GpuDevice, ...] = ()


class HostFacts(_Value):
    """The machine around the GPUs."""

    cpu_model: str = ""
    cpu_cores: int = 0
    ram_mib: int | None = None
    #: ``/etc/os-release``'s PRETTY_NAME ("Ubuntu 22.04.4 LTS") and ``uname -r``.
    os: str = ""
    kernel: str = ""
    #: The disk that holds the models: its directory, size and free space.
    disk_path: str = ""
    disk_total_bytes: int | None = None
    disk_free_bytes: int | None = None


class SystemInfo(_Value):
    """The machine a cell ran on: its GPUs (the cell's), the source that named them, the host.

    ``gpus`` are the GPUs the cell was given (all of the machine's unless a provider
    leased some); ``machine_gpu_count`` counts every GPU the source listed.
    """

    source: GpuSource
    driver_version: str = ""
    cuda_version: str = ""
    gpus: tuple[GpuDevice, ...] = ()
    machine_gpu_count: int = 0
    host: HostFacts = HostFacts()

    @classmethod
    def of(cls, facts: GpuFacts, host: HostFacts, gpus: Sequence[GpuDevice]) -> SystemInfo:
        """The cell's ``gpus`` among ``facts``, with the ``host``."""
        return cls(source=facts.source, driver_version=facts.driver_version, cuda_version=facts.cuda_version,
                   gpus=tuple(gpus), machine_gpu_count=len(facts.gpus), host=host)

    @property
    def first(self) -> GpuDevice | None:
        """The cell's first GPU (they are alike: the name check saw to it)."""
        return self.gpus[0] if self.gpus else None


# ------------------------------------------------------------------------ sources


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _device(index: int, values: Mapping[str, Any]) -> GpuDevice:
    """A GpuDevice from loosely typed values: a wrong kind is a missing figure, never an error."""
    return GpuDevice(
        index=_int(values.get("index")) if _int(values.get("index")) is not None else index,
        name=_str(values.get("name")),
        uuid=_str(values.get("uuid")),
        pci_bus_id=_str(values.get("pci_bus_id")),
        memory_total_mib=_int(values.get("memory_total_mib")),
        compute_capability=_str(values.get("compute_capability")),
        sm_clock_max_mhz=_int(values.get("sm_clock_max_mhz")),
        mem_clock_max_mhz=_int(values.get("mem_clock_max_mhz")),
        sm_clock_mhz=_int(values.get("sm_clock_mhz")),
        mem_clock_mhz=_int(values.get("mem_clock_mhz")),
        power_limit_w=_float(values.get("power_limit_w")),
    )


def gpu_facts_from_nvml(text: str) -> GpuFacts | None:
    """The ``nvml_probe.py`` script's JSON; None when it is not JSON or names no GPU."""
    try:
        answer = json.loads(text.strip() or "null")
    except ValueError:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("gpus"), list):
        return None
    gpus = []
    for index, gpu in enumerate(answer["gpus"]):
        if not isinstance(gpu, dict):
            continue
        total = _int(gpu.get("memory_total_bytes"))
        gpus.append(_device(index, {**gpu, "memory_total_mib": total // (1024 * 1024) if total else None}))
    if not gpus:
        return None
    return GpuFacts(source="nvml", driver_version=_str(answer.get("driver_version")),
                    cuda_version=_str(answer.get("cuda_version")), gpus=tuple(gpus))


def gpu_facts_from_xml(text: str) -> GpuFacts:
    """``nvidia-smi -q -x``; ``ValueError`` when it is not XML."""
    parsed = parse_nvidia_smi_xml(text)
    gpus = tuple(_device(gpu["index"], {**gpu, "name": gpu.get("product_name")}) for gpu in parsed["gpus"])
    return GpuFacts(source="nvidia-smi-xml", driver_version=_str(parsed.get("driver_version")),
                    cuda_version=_str(parsed.get("cuda_version")), gpus=gpus)


def gpu_facts_from_csv(rows: Sequence[Mapping[str, Any]], cuda_version: str = "") -> GpuFacts:
    """Rows of ``parse_gpu_query_csv`` over (some of) :data:`CSV_FIELDS`; the CUDA version
    comes from elsewhere (:func:`parse_cuda_banner`): the query has no field for it."""
    gpus = []
    for index, row in enumerate(rows):
        values = {CSV_FIELDS[field]: value for field, value in row.items() if field in CSV_FIELDS}
        # "8.9" is text to keep, but the CSV parser reads it as a number.
        capability = values.get("compute_capability")
        if isinstance(capability, (int, float)) and not isinstance(capability, bool):
            values["compute_capability"] = str(capability)
        gpus.append(_device(index, values))
    driver = next((_str(row.get("driver_version")) for row in rows if _str(row.get("driver_version"))), "")
    return GpuFacts(source="nvidia-smi-csv", driver_version=driver, cuda_version=cuda_version, gpus=tuple(gpus))


_CUDA_BANNER = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")


def parse_cuda_banner(text: str) -> str:
    """The ``CUDA Version: 12.4`` of plain ``nvidia-smi``'s table; empty when absent."""
    match = _CUDA_BANNER.search(text)
    return match.group(1) if match else ""


def parse_df(text: str) -> tuple[int | None, int | None]:
    """Total and available bytes from ``df -Pk``'s last line; None for what it does not say."""
    lines = text.strip().splitlines()
    fields = lines[-1].split() if lines else []
    # df -Pk: filesystem, 1024-blocks, used, available, capacity, mounted on
    if len(fields) < 6:
        return None, None

    def kib(value: str) -> int | None:
        return int(value) * 1024 if value.isdigit() else None

    return kib(fields[1]), kib(fields[3])


def parse_host_probe(text: str) -> HostFacts:
    """:data:`HOST_PROBE`'s ``key=value`` lines; anything unreadable is left out."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and key.strip() not in values:
            values[key.strip()] = value.strip()
    cores = values.get("cores", "")
    mem_kib = values.get("mem_kib", "")
    total, free = parse_df(values.get("df", ""))
    try:
        return HostFacts(
            cpu_model=values.get("cpu", ""),
            cpu_cores=int(cores) if cores.isdigit() else 0,
            ram_mib=int(mem_kib) // 1024 if mem_kib.isdigit() else None,
            os=values.get("os", "").strip().strip("\"'"),
            kernel=values.get("kernel", ""),
            disk_path=values.get("disk_path", ""),
            disk_total_bytes=total,
            disk_free_bytes=free,
        )
    except ValidationError:  # cannot happen with the values above; never crash on a probe
        return HostFacts()
