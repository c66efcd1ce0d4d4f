"""Checks of a real GPU machine (the ``gpu`` test tier): its sources agree, its figures match its
datasheet, and a run leaves it as it found it.

Three pieces, each plain logic over text the machine printed, so each is tested without a GPU:

* :func:`compare_facts`: what NVML said (``remote/nvml_probe.py``) against what ``nvidia-smi -q -x``
  or the ``--query-gpu`` CSV said (``remote/sysinfo.py`` parses all three): name, UUID, PCI bus id,
  memory, driver and CUDA versions, compute capability, power limit, max clocks. A figure one
  source cannot give is not compared ("where present"); :func:`missing_figures` says which a
  source left out, so a check can insist on the essentials.
* :func:`peak_shares`: stored microbenchmark figures as a share of the datasheet peak
  (``measure/microbench.py``), and :func:`outside_bounds` for the ones outside honest bounds.
* :class:`HostSnapshot` and :func:`host_differences`: what a run may not change, read only (GPU
  settings, memory in use, compute processes, the run's own processes, files outside its
  folders), before and after. Nothing here sets anything on the GPU: every command is a query.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..gpuinfo import parse_gpu_query_csv
from .microbench import GpuPeaks
from ..remote.sysinfo import GpuDevice, GpuFacts

__all__ = [
    "BOUNDS", "ESSENTIAL_FIGURES", "SETTINGS_FIELDS", "GpuState", "HostSnapshot", "PeakShare",
    "compare_facts", "gpu_absent_reason", "host_differences", "list_entries", "missing_figures", "outside_bounds",
    "parse_compute_apps", "parse_gpu_states", "peak_shares", "processes_with_marker", "query_compute_apps",
    "query_gpu_csv", "query_gpu_states",
]

# ----------------------------------------------------------------- sources agree

#: The figures every source must give on any card: without them "the sources agree" would be
#: vacuous. (A power limit or clocks some cards do not report are compared where present.)
ESSENTIAL_FIGURES = ("name", "uuid", "memory_total_mib")
#: Compared GPU figures: exact, except those with a tolerance (units differ: NVML counts bytes and
#: milliwatts, nvidia-smi MiB and watts with two decimals).
_EXACT = ("name", "uuid", "pci_bus_id", "compute_capability", "sm_clock_max_mhz", "mem_clock_max_mhz")
_TOLERANCE = {"memory_total_mib": 1.0, "power_limit_w": 0.5}


def _present(value: Any) -> bool:
    return value is not None and value != ""


def _norm(field: str, value: Any) -> Any:
    if field == "pci_bus_id" and isinstance(value, str):
        # NVML's busId has an 8-digit domain (00000000:19:00.0); old nvidia-smi prints 4 (0000:19:00.0).
        domain, _, rest = value.upper().partition(":")
        return f"{int(domain, 16):08X}:{rest}" if rest and re.fullmatch(r"[0-9A-F]+", domain) else value.upper()
    return value.strip() if isinstance(value, str) else value


def missing_figures(facts: GpuFacts, figures: Sequence[str] = ESSENTIAL_FIGURES) -> list[str]:
    """``"GPU 0: uuid"`` for each of ``figures`` a GPU of ``facts`` lacks, then ``driver_version`` if absent."""
    missing = [f"GPU {gpu.index}: {field}" for gpu in facts.gpus for field in figures
               if not _present(getattr(gpu, field))]
    if not facts.driver_version:
        missing.append("driver_version")
    return missing


def compare_facts(reference: GpuFacts, other: GpuFacts) -> list[str]:
    """Where ``other`` disagrees with ``reference`` (NVML, NVIDIA's stable interface): one line each.

    GPUs are paired by index (nvidia-smi and NVML number them alike); a different count is a
    difference. Versions are compared where both give one. Nothing is compared that either lacks.
    """
    where = f"{other.source} vs {reference.source}"
    differences = []
    if len(reference.gpus) != len(other.gpus):
        differences.append(f"{where}: {len(other.gpus)} GPUs against {len(reference.gpus)}")
    for field in ("driver_version", "cuda_version"):
        mine, theirs = getattr(reference, field), getattr(other, field)
        if mine and theirs and mine != theirs:
            differences.append(f"{where}: {field} {theirs!r} against {mine!r}")
    by_index = {gpu.index: gpu for gpu in other.gpus}
    for gpu in reference.gpus:
        peer = by_index.get(gpu.index)
        if peer is None:
            continue
        differences.extend(f"{where}: GPU {gpu.index} {line}" for line in _gpu_differences(gpu, peer))
    return differences


def _gpu_differences(reference: GpuDevice, other: GpuDevice) -> list[str]:
    lines = []
    for field in (*_EXACT, *_TOLERANCE):
        mine, theirs = getattr(reference, field), getattr(other, field)
        if not (_present(mine) and _present(theirs)):
            continue
        if field in _TOLERANCE:
            if abs(float(mine) - float(theirs)) > _TOLERANCE[field]:
                lines.append(f"{field} {theirs} against {mine}")
        elif _norm(field, mine) != _norm(field, theirs):
            lines.append(f"{field} {theirs!r} against {mine!r}")
    return lines


# ----------------------------------------------------------- against the datasheet

#: Honest bounds of a share of the datasheet peak, by figure kind. A copy reaches 80-95% of a
#: card's bandwidth, a large dense bf16/fp16 matmul 60-90% of its tensor peak (boost clocks are
#: not held under full load, and the peak is at the boost clock); above 105% the peak or the
#: timing is wrong. Below the floor the GPU is throttled, shared, or mismeasured.
BOUNDS: dict[str, tuple[float, float]] = {"memory_bandwidth": (0.50, 1.05), "matmul": (0.40, 1.05)}


@dataclass(frozen=True)
class PeakShare:
    """One measured figure beside its datasheet peak."""

    label: str
    kind: str
    value: float
    peak: float
    unit: str

    @property
    def share(self) -> float:
        """The measured value as a fraction of the peak (0.87 = 87%)."""
        return self.value / self.peak

    def line(self) -> str:
        """``matmul_bf16: 812.3 TFLOPS = 82.1% of 989.4`` (what the check prints)."""
        return f"{self.label}: {self.value:.1f} {self.unit} = {100 * self.share:.1f}% of {self.peak:g}"


def peak_shares(figures: Iterable[Any], peaks: GpuPeaks) -> list[PeakShare]:
    """Each measured figure (store ``MicrobenchRecord``-like: ``label``, ``kind``, ``precision``,
    ``value``, ``unit``) whose peak ``peaks`` knows; skipped figures and unknown peaks are left out."""
    shares = []
    for figure in figures:
        value = getattr(figure, "value", None)
        peak = peaks.peak(figure.kind, getattr(figure, "precision", None))
        if value is None or not peak:
            continue
        shares.append(PeakShare(figure.label, figure.kind, float(value), float(peak), figure.unit or ""))
    return shares


def outside_bounds(shares: Iterable[PeakShare],
                   bounds: Mapping[str, tuple[float, float]] = BOUNDS) -> list[str]:
    """The shares outside their kind's bounds, one line each (with the bounds)."""
    lines = []
    for share in shares:
        low, high = bounds.get(share.kind, (0.0, float("inf")))
        if not low <= share.share <= high:
            lines.append(f"{share.line()}: outside {100 * low:.0f}%-{100 * high:.0f}%")
    return lines


# ----------------------------------------------------------- the host as found

#: What a run must leave as it was, by ``nvidia-smi --query-gpu`` field: settings only an
#: administrator changes (``nvidia-smi -pm/-c/-pl/-ac/-lgc``, MIG, ECC). Read, never set.
SETTINGS_FIELDS = ("persistence_mode", "compute_mode", "power.limit", "enforced.power.limit",
                   "clocks.applications.graphics", "clocks.applications.memory", "mig.mode.current",
                   "ecc.mode.current")
_STATE_FIELDS = ("index", "uuid", "memory.used")
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


class GpuState(BaseModel):
    """One GPU's settings (text as nvidia-smi prints them) and the memory in use."""

    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str = ""
    memory_used_mib: int | None = None
    settings: dict[str, str] = {}


def parse_gpu_states(text: str, fields: Sequence[str]) -> tuple[GpuState, ...]:
    """``nvidia-smi --query-gpu=index,uuid,memory.used,<settings> --format=csv,noheader,nounits``."""
    states = []
    for row in parse_gpu_query_csv(text, list(fields)):
        index = row.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            continue
        used = row.get("memory.used")
        settings = {field: "" if row.get(field) is None else str(row.get(field))
                    for field in fields if field not in _STATE_FIELDS}
        states.append(GpuState(index=index, uuid=str(row.get("uuid") or ""),
                               memory_used_mib=int(used) if isinstance(used, (int, float)) else None,
                               settings=settings))
    return tuple(states)


def query_gpu_csv(fields: Sequence[str], *, keep: int = 0, nvidia_smi: str = "nvidia-smi",
                  timeout: float = 60) -> tuple[list[str], str]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` on this machine: the fields it
    answered and its output. A field this driver does not know (``Field "x" is not a valid field to
    query.``) is dropped and the query asked again, unless it is one of the first ``keep``;
    ``RuntimeError`` when nvidia-smi fails otherwise. A query, never a setting."""
    fields = list(fields)
    while True:
        done = subprocess.run([nvidia_smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode == 0:
            return fields, done.stdout
        unknown = _INVALID_FIELD.search(done.stdout + done.stderr)
        if unknown is None or unknown.group(1) not in fields[keep:]:
            raise RuntimeError(f"nvidia-smi --query-gpu failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr).strip()[-300:]}")
        fields.remove(unknown.group(1))


def query_gpu_states(nvidia_smi: str = "nvidia-smi", settings: Sequence[str] = SETTINGS_FIELDS,
                     timeout: float = 60) -> tuple[GpuState, ...]:
    """This machine's GPUs now (:func:`query_gpu_csv`: a setting this driver does not know is left out)."""
    fields, text = query_gpu_csv([*_STATE_FIELDS, *settings], keep=len(_STATE_FIELDS), nvidia_smi=nvidia_smi,
                                 timeout=timeout)
    return parse_gpu_states(text, fields)


def query_compute_apps(nvidia_smi: str = "nvidia-smi", timeout: float = 60) -> dict[int, int | None]:
    """The processes using a GPU now (:func:`parse_compute_apps`); ``RuntimeError`` when nvidia-smi fails."""
    done = subprocess.run([nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi --query-compute-apps failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr).strip()[-300:]}")
    return parse_compute_apps(done.stdout)


def parse_compute_apps(text: str) -> dict[int, int | None]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``: pid -> MiB."""
    apps: dict[int, int | None] = {}
    for row in parse_gpu_query_csv(text, ["pid", "used_memory"]):
        pid, used = row.get("pid"), row.get("used_memory")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            apps[pid] = int(used) if isinstance(used, (int, float)) else None
    return apps


def processes_with_marker(name: str, value: str, proc: Path = Path("/proc")) -> set[int]:
    """Pids of the processes whose environment has ``name=value``: a run's processes and every
    process they started, even those that left its process group or lost their parent.
    Processes of other users (unreadable environment) and ones that end meanwhile are skipped."""
    wanted = f"{name}={value}".encode()
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def list_entries(directories: Iterable[Path]) -> dict[str, frozenset[str]]:
    """The names directly in each directory (a missing one: empty)."""
    listing = {}
    for directory in directories:
        try:
            listing[str(directory)] = frozenset(os.listdir(directory))
        except OSError:
            listing[str(directory)] = frozenset()
    return listing


class HostSnapshot(BaseModel):
    """What :func:`host_differences` compares: read before a run and after it."""

    model_config = ConfigDict(frozen=True)

    gpus: tuple[GpuState, ...] = ()
    #: pid -> MiB of the processes using a GPU (``--query-compute-apps``).
    compute_apps: dict[int, int | None] = {}
    #: The run's processes still alive (:func:`processes_with_marker`).
    run_processes: frozenset[int] = frozenset()
    #: Watched directory -> its entries (:func:`list_entries`).
    files: dict[str, frozenset[str]] = {}


def host_differences(before: HostSnapshot, after: HostSnapshot, *, memory_tolerance_mib: int = 128,
                     allowed: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """What the run changed that it must not have, one line each; empty: left as found.

    A GPU setting that differs; memory in use above the starting level by more than
    ``memory_tolerance_mib``; a compute process that was not there before; any process of the
    run still alive; a new entry in a watched directory, unless ``allowed`` (directory ->
    names) lists it. Removed entries are not the run's doing to report (other programs
    clean up too); a GPU that appears or vanishes is.
    """
    lines = []
    after_by_uuid = {gpu.uuid or str(gpu.index): gpu for gpu in after.gpus}
    for gpu in before.gpus:
        now = after_by_uuid.get(gpu.uuid or str(gpu.index))
        if now is None:
            lines.append(f"GPU {gpu.index} ({gpu.uuid}) is gone")
            continue
        for field, value in gpu.settings.items():
            if field in now.settings and now.settings[field] != value:
                lines.append(f"GPU {gpu.index}: {field} is {now.settings[field]!r}, was {value!r}")
        if (gpu.memory_used_mib is not None and now.memory_used_mib is not None
                and now.memory_used_mib > gpu.memory_used_mib + memory_tolerance_mib):
            lines.append(f"GPU {gpu.index}: {now.memory_used_mib} MiB in use, was {gpu.memory_used_mib} MiB "
                         f"(tolerance {memory_tolerance_mib} MiB)")
    if len(after.gpus) > len(before.gpus):
        lines.append(f"{len(after.gpus)} GPUs listed, {len(before.gpus)} before")
    for pid in sorted(set(after.compute_apps) - set(before.compute_apps)):
        lines.append(f"process {pid} still uses a GPU ({after.compute_apps[pid]} MiB)")
    for pid in sorted(after.run_processes - before.run_processes):
        lines.append(f"process {pid} of the run is still running")
    allowed = {directory: set(names) for directory, names in (allowed or {}).items()}
    for directory, entries in after.files.items():
        new = entries - before.files.get(directory, frozenset()) - allowed.get(directory, set())
        lines.extend(f"left behind: {Path(directory) / name}" for name in sorted(new))
    return lines


# ------------------------------------------------------------ is there a GPU

#: Run by the Python that will run the benchmarks: NVML starts, torch sees a CUDA device. One JSON
#: line ``{"nvml": null or why not, "torch": null or why not}``. In a child process so that this
#: one never loads torch nor makes a CUDA context (the GPU's memory is measured around a run).
_PROBE = """
import json
why = {"nvml": None, "torch": None}
try:
    import pynvml
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if not count:
        why["nvml"] = "NVML lists no GPU"
except Exception as exc:
    why["nvml"] = f"NVML cannot be loaded ({type(exc).__name__}: {str(exc)[:200]}; pip install nvidia-ml-py)"
try:
    import torch
    if not torch.cuda.is_available():
        why["torch"] = f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
except Exception as exc:
    why["torch"] = f"torch cannot be imported ({type(exc).__name__}: {str(exc)[:200]})"
print(json.dumps(why))
"""


def gpu_absent_reason(python: str, environ: Mapping[str, str] | None = None, timeout: float = 180) -> str | None:
    """Why this machine cannot run the ``gpu`` tier, in one line; None when it can.

    It needs a real NVIDIA GPU: ``nvidia-smi`` on ``PATH`` (not the sandbox's stand-in), NVML
    loadable through ``nvidia-ml-py`` and ``torch.cuda.is_available()``, the last two in ``python``.
    """
    environ = os.environ if environ is None else environ
    if environ.get("GPUBENCH_SANDBOX_INSTANCE"):
        return "GPUBENCH_SANDBOX_INSTANCE is set: nvidia-smi here is the sandbox's stand-in, not a GPU"
    path = environ.get("PATH", os.defpath)
    if shutil.which("nvidia-smi", path=path) is None:
        return "no NVIDIA GPU: nvidia-smi is not on PATH"
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                              check=False, env=dict(environ))
        why = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return f"cannot probe NVML and torch with {python}: {exc}"
    if not isinstance(why, dict):
        return f"cannot probe NVML and torch with {python}: {(done.stderr or 'no output').strip()[-300:]}"
    reasons = [text for text in (why.get("nvml"), why.get("torch")) if text]
    return "; ".join(reasons) or None
