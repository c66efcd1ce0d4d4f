"""System detection on an instance: the GPU we paid for, confirmed, and the machine described.

:func:`detect_system` asks three sources in order and records which answered
(:class:`~.sysinfo.SystemInfo`): NVML through ``pynvml`` when the instance's python3
imports it (the shipped ``nvml_probe.py``), else ``nvidia-smi -q -x``, else the CSV
query (fields the driver does not know are dropped and asked again). A machine whose
GPUs are not the offer's fails at ``ssh_connect``. :func:`hardware_of` gives the result's
``HardwareInfo`` from it.
"""

from __future__ import annotations

import re
from importlib import resources

from ..errors import Stage, StageError
from ..gpuinfo import gpu_name_matches, parse_gpu_query_csv
from .readings import HardwareInfo
from .ssh import Connection
from .sysinfo import (
    CSV_FIELDS,
    DISK_PROBE,
    HOST_PROBE,
    GpuFacts,
    SystemInfo,
    gpu_facts_from_csv,
    gpu_facts_from_nvml,
    gpu_facts_from_xml,
    parse_cuda_banner,
    parse_host_probe,
)

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
    """Free bytes on the disk that holds Ollama's models (:data:`~.sysinfo.DISK_PROBE`); None when ``df`` cannot say."""
    result = await conn.run(DISK_PROBE, stage=Stage.MODEL_PULL, what="df (free disk)", timeout=timeout,
                            check=False)
    return parse_host_probe(result.stdout).disk_free_bytes if result.ok else None
