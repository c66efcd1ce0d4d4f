"""What an instance is: its GPUs (from NVML, ``nvidia-smi -q -x`` or the CSV query) and its host,
detected over SSH: the GPU we paid for, confirmed, and the machine described.

:class:`SystemInfo` is recorded once per session (the store's ``systems``) and shown in
the report's hardware table; :func:`detect_system` gathers it over SSH. The
parsers here never raise on odd values: a figure a source cannot give is ``None`` (or
``""`` for text), and :attr:`GpuFacts.source` says which source answered.

:func:`detect_system` asks three sources in order and records which answered
(:class:`SystemInfo`): NVML through ``pynvml`` when the instance's python3
imports it (the shipped ``nvml_probe.py``), else ``nvidia-smi -q -x``, else the CSV
query (fields the driver does not know are dropped and asked again). A machine whose
GPUs are not the offer's fails at ``ssh_connect``. :func:`hardware_of` gives the result's
``HardwareInfo`` from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import Stage, StageError
from ..gpuinfo import gpu_name_matches, parse_gpu_query_csv, parse_nvidia_smi_xml
from .readings import HardwareInfo

if TYPE_CHECKING:  # only annotations: the store and the report read SystemInfo and must not load asyncssh
    from .ssh import Connection

__all__ = [
    "CSV_FIELDS", "DISK_PROBE", "GpuDevice", "GpuFacts", "GpuSource", "HOST_PROBE", "HostFacts", "NVML_PROBE",
    "NVML_PROBE_SOURCE", "SystemInfo", "detect_system", "facts_by_source", "free_disk_bytes", "gpu_facts",
    "gpu_facts_from_csv", "gpu_facts_from_nvml", "gpu_facts_from_xml", "hardware_of", "parse_cuda_banner", "parse_df",
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


# --------------------------------------------------------- detection over SSH

#: The NVML script, sent as the stdin of ``python3 -`` (stdlib and pynvml only).
NVML_PROBE_SOURCE = resources.files("pytest_gpubench.remote").joinpath("nvml_probe.py").read_text()
NVML_PROBE = "command -v python3 >/dev/null 2>&1 || exit 3; python3 -"
_UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field')


def _no_driver(expected_gpu: str) -> StageError:
    # The shell's own "command not found": no NVIDIA driver at all, so no GPU to benchmark.
    return StageError(
        Stage.SSH_CONNECT,
        f"nvidia-smi is not installed on the instance: not a GPU machine (expected a {expected_gpu})",
        hint="the offer did not deliver an NVIDIA GPU, or its image lacks the driver; the session is "
        "released: rerun the cell, and report the offer to its provider if it happens again",
    )


async def _from_nvml(conn: Connection, timeout: float) -> GpuFacts | None:
    result = await conn.run(NVML_PROBE, stage=Stage.SSH_CONNECT, what="NVML (pynvml)", timeout=timeout,
                            stdin=NVML_PROBE_SOURCE, check=False)
    return gpu_facts_from_nvml(result.stdout) if result.ok else None


async def _from_csv(conn: Connection, timeout: float, expected_gpu: str) -> GpuFacts:
    """The CSV query, without the fields an older driver refuses (it names them one at a time)."""
    fields = list(CSV_FIELDS)
    while True:
        query = await conn.run(f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits",
                               stage=Stage.SSH_CONNECT, what="nvidia-smi", timeout=timeout, check=False)
        if query.exit_status == 127 or "command not found" in query.stderr:
            raise _no_driver(expected_gpu)
        refused = _UNKNOWN_FIELD.search(query.stdout + query.stderr) if not query.ok else None
        if refused and refused.group(1) in fields and refused.group(1) not in ("name", "memory.total"):
            fields.remove(refused.group(1))
            continue
        if not query.ok:
            raise StageError(
                Stage.SSH_CONNECT,
                f"nvidia-smi failed on the instance (exit {query.exit_status}): "
                f"{(query.stderr or query.stdout).strip()[-300:] or 'no output'}",
                hint="the instance has no working NVIDIA driver",
            )
        break
    banner = await conn.run("nvidia-smi", stage=Stage.SSH_CONNECT, what="nvidia-smi (CUDA version)",
                            timeout=timeout, check=False)
    return gpu_facts_from_csv(parse_gpu_query_csv(query.stdout, fields), parse_cuda_banner(banner.stdout))


async def gpu_facts(conn: Connection, timeout: float, expected_gpu: str) -> GpuFacts:
    """The machine's GPUs from the first source that answers: NVML, the XML log, the CSV query."""
    facts = await _from_nvml(conn, timeout)
    if facts is not None:
        return facts
    facts = await _from_xml(conn, timeout, expected_gpu)
    if facts is not None:
        return facts
    return await _from_csv(conn, timeout, expected_gpu)


async def _from_xml(conn: Connection, timeout: float, expected_gpu: str) -> GpuFacts | None:
    xml = await conn.run("nvidia-smi -q -x", stage=Stage.SSH_CONNECT, what="nvidia-smi -q -x",
                         timeout=timeout, check=False)
    if xml.exit_status == 127 or "command not found" in xml.stderr:
        raise _no_driver(expected_gpu)
    if not xml.ok:
        return None
    try:
        facts = gpu_facts_from_xml(xml.stdout)
    except ValueError:
        return None
    return facts if facts.gpus else None


async def facts_by_source(conn: Connection, timeout: float, expected_gpu: str = "NVIDIA GPU",
                          ) -> dict[str, GpuFacts | None]:
    """What each source says, every one asked (``gpu_facts`` stops at the first that answers): for
    checking that they agree on a real machine (``gpucheck.compare_facts``, the ``gpu`` test tier).
    A source that cannot answer is None; no driver at all is the stage error ``gpu_facts`` raises."""
    return {"nvml": await _from_nvml(conn, timeout),
            "nvidia-smi-xml": await _from_xml(conn, timeout, expected_gpu),
            "nvidia-smi-csv": await _from_csv(conn, timeout, expected_gpu)}


async def detect_system(conn: Connection, expected_gpu: str, timeout: float, *, gpu_count: int = 1,
                        gpu_indices: tuple[int, ...] = ()) -> SystemInfo:
    """Describe the machine; fail at ``ssh_connect`` if it is not ``expected_gpu``.

    ``gpu_indices``: the GPUs the cell was given (nvidia-smi indices; empty: all of them);
    there must be ``gpu_count`` of them and each must be ``expected_gpu``.
    """
    facts = await gpu_facts(conn, timeout, expected_gpu)
    listed = facts.gpus
    if not listed:
        raise StageError(Stage.SSH_CONNECT, "nvidia-smi lists no GPU")
    by_index = {gpu.index: gpu for gpu in listed}
    missing = [i for i in gpu_indices if i not in by_index]
    if missing:
        raise StageError(Stage.SSH_CONNECT, f"the cell was given GPU(s) {missing} but nvidia-smi lists "
                                            f"{len(listed)} GPU(s)")
    gpus = [by_index[i] for i in gpu_indices] if gpu_indices else list(listed)
    if len(gpus) < gpu_count:
        raise StageError(Stage.SSH_CONNECT, f"expected {gpu_count} x {expected_gpu} but nvidia-smi lists "
                                            f"{len(gpus)} GPU(s)")
    for gpu in gpus:
        if not gpu_name_matches(expected_gpu, gpu.name):
            raise StageError(Stage.SSH_CONNECT, f"expected a {expected_gpu} but nvidia-smi reports {gpu.name!r}")
    host = await conn.run(HOST_PROBE, stage=Stage.SSH_CONNECT, what="reading CPU, memory, OS and disk",
                          timeout=timeout, check=False)
    return SystemInfo.of(facts, parse_host_probe(host.stdout), gpus)


def hardware_of(system: SystemInfo) -> HardwareInfo:
    """The result's ``hardware`` section (GPU Shopper's shape) from what was detected."""
    first, host = system.first, system.host
    return HardwareInfo(
        gpu_name=first.name if first else "",
        gpu_memory_mib=(first.memory_total_mib or 0) if first else 0,
        gpu_count=len(system.gpus),
        driver_version=system.driver_version,
        cuda_version=system.cuda_version,
        cpu_model=host.cpu_model,
        cpu_cores=host.cpu_cores,
        ram_gib=(host.ram_mib or 0) // 1024,
    )


async def free_disk_bytes(conn: Connection, timeout: float) -> int | None:
    """Free bytes on the disk that holds Ollama's models (:data:`DISK_PROBE`); None when ``df`` cannot say."""
    result = await conn.run(DISK_PROBE, stage=Stage.MODEL_PULL, what="df (free disk)", timeout=timeout,
                            check=False)
    return parse_host_probe(result.stdout).disk_free_bytes if result.ok else None
