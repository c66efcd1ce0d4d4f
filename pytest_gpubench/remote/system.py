"""System info from an instance: nvidia-smi confirms the GPU we paid for."""

from __future__ import annotations

from ..errors import Stage, StageError
from .gpuinfo import gpu_name_matches, parse_gpu_query_csv, parse_nvidia_smi_xml
from ..measure.results import HardwareInfo
from .ssh import Connection

GPU_FIELDS = "name,memory.total,driver_version"
#: CPU model, core count and memory, from any Linux without extra tools.
HOST_PROBE = (
    "nproc 2>/dev/null || echo 0; "
    "sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1; "
    "sed -n 's/^MemTotal:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/meminfo 2>/dev/null"
)


async def compute_capability(conn: Connection, timeout: float) -> str:
    """``8.9`` for an RTX 4090; empty when the driver is too old to say."""
    result = await conn.run("nvidia-smi --query-gpu=compute_cap --format=csv,noheader,nounits",
                            stage=Stage.SSH_CONNECT, what="nvidia-smi compute_cap", timeout=timeout, check=False)
    lines = result.stdout.strip().splitlines() if result.ok else []
    return lines[0].strip() if lines and lines[0].strip()[:1].isdigit() else ""


async def probe_system(conn: Connection, expected_gpu: str, timeout: float, *, gpu_count: int = 1,
                       gpu_indices: tuple[int, ...] = ()) -> HardwareInfo:
    """Describe the machine; fail at ``ssh_connect`` if it is not ``expected_gpu``.

    ``gpu_indices``: the GPUs the cell was given (nvidia-smi indices; empty: all of them);
    there must be ``gpu_count`` of them and each must be ``expected_gpu``.
    """
    query = await conn.run(
        f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits",
        stage=Stage.SSH_CONNECT, what="nvidia-smi", timeout=timeout, check=False,
    )
    if query.exit_status == 127 or "command not found" in query.stderr:
        # The shell's own "command not found": no NVIDIA driver at all, so no GPU to benchmark.
        raise StageError(
            Stage.SSH_CONNECT,
            f"nvidia-smi is not installed on the instance: not a GPU machine (expected a {expected_gpu})",
            hint="the offer did not deliver an NVIDIA GPU, or its image lacks the driver; the session is "
            "released: rerun the cell, and report the offer to its provider if it happens again",
        )
    if not query.ok:
        raise StageError(
            Stage.SSH_CONNECT,
            f"nvidia-smi failed on the instance (exit {query.exit_status}): "
            f"{(query.stderr or query.stdout).strip()[-300:] or 'no output'}",
            hint="the instance has no working NVIDIA driver",
        )
    listed = parse_gpu_query_csv(query.stdout, GPU_FIELDS)
    if not listed:
        raise StageError(Stage.SSH_CONNECT, "nvidia-smi lists no GPU")
    missing = [i for i in gpu_indices if not 0 <= i < len(listed)]
    if missing:
        raise StageError(Stage.SSH_CONNECT, f"the cell was given GPU(s) {missing} but nvidia-smi lists "
                                            f"{len(listed)} GPU(s)")
    gpus = [listed[i] for i in gpu_indices] if gpu_indices else listed
    if len(gpus) < gpu_count:
        raise StageError(Stage.SSH_CONNECT, f"expected {gpu_count} x {expected_gpu} but nvidia-smi lists "
                                            f"{len(gpus)} GPU(s)")
    for gpu in gpus:
        name = str(gpu.get("name") or "")
        if not gpu_name_matches(expected_gpu, name):
            raise StageError(Stage.SSH_CONNECT, f"expected a {expected_gpu} but nvidia-smi reports {name!r}")
    name = str(gpus[0].get("name") or "")
    xml = await conn.run("nvidia-smi -q -x", stage=Stage.SSH_CONNECT, what="nvidia-smi -q -x",
                         timeout=timeout, check=False)
    cuda = ""
    if xml.ok:
        try:
            cuda = parse_nvidia_smi_xml(xml.stdout).get("cuda_version") or ""
        except ValueError:
            cuda = ""
    host = await conn.run(HOST_PROBE, stage=Stage.SSH_CONNECT, what="reading CPU and memory",
                          timeout=timeout, check=False)
    cores, cpu_model, mem_kib = (host.stdout.splitlines() + ["", "", ""])[:3]
    return HardwareInfo(
        gpu_name=name,
        gpu_memory_mib=int(gpus[0].get("memory.total") or 0),
        gpu_count=len(gpus),
        driver_version=str(gpus[0].get("driver_version") or ""),
        cuda_version=str(cuda),
        cpu_model=cpu_model.strip(),
        cpu_cores=int(cores) if cores.strip().isdigit() else 0,
        ram_gib=int(mem_kib) // (1024 * 1024) if mem_kib.strip().isdigit() else 0,
    )


#: Free space where Ollama keeps its models (OLLAMA_MODELS, else ~/.ollama, else home).
FREE_DISK_PROBE = (
    'd="${OLLAMA_MODELS:-$HOME/.ollama}"; [ -d "$d" ] || d="$HOME"; df -Pk "$d" | tail -n 1'
)


def parse_df_available(text: str) -> int | None:
    """Bytes available from the last line of ``df -Pk`` (its fourth column, in KiB)."""
    fields = text.strip().splitlines()[-1].split() if text.strip() else []
    if len(fields) < 6 or not fields[3].isdigit():
        return None
    return int(fields[3]) * 1024


async def free_disk_bytes(conn: Connection, timeout: float) -> int | None:
    """Free bytes on the disk that holds Ollama's models; None when ``df`` cannot say."""
    result = await conn.run(FREE_DISK_PROBE, stage=Stage.MODEL_PULL, what="df (free disk)", timeout=timeout,
                            check=False)
    return parse_df_available(result.stdout) if result.ok else None
