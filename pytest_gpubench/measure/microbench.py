"""GPU microbenchmarks: the script run on the instance, its events as statistics, and their % of peak.

:func:`ensure_torch` (stage ``runtime_setup``, installing the cell's "runtime") finds a
Python that imports torch: the instance's ``python3``, else a venv under
``~/.gpubench/torch-venv`` made earlier, else it makes that venv and ``pip install``\\ s
torch into it (``PIP_INDEX_URL``, ``PIP_FIND_LINKS`` and the like in the instance's
environment apply), all within the stage timeout. :func:`run_microbench` (stage
``benchmark``) sends ``remote/microbench_script.py`` as that Python's stdin, as the load
generator is sent, and returns the JSON events it printed.

:func:`figures_from_events` turns them into figures:
each ``figure`` event (one value per timed run) becomes a :class:`MicrobenchFigure` with
the runs' :class:`~.results.RunStatistics` (mean, sample std, CV, Tukey outliers, bootstrap
CI), and each ``skipped`` event a figure without statistics but with its reason. The
figure a report shows is the mean of the runs; its % of peak uses the datasheet peaks (below).

Datasheet peaks of the GPUs the project knows: what a microbenchmark is a percentage of
---------------------------------------------------------------------------------------

One :class:`GpuPeaks` per GPU (the sandbox catalog's and the seeds' cards): memory
bandwidth in GB/s and dense (no structured sparsity) matmul throughput in TFLOPS (TOPS
for INT8) per precision, each with the vendor document it comes from. Where a datasheet
gives only a sparse figure, the dense one is half of it; where a GeForce sheet gives only
"AI TOPS" (FP4 with sparsity), the per-precision figures follow by the architecture's
whitepaper ratios (FP4 -> FP8 -> FP16 halve, and GeForce cards run FP8/FP16 with FP32
accumulation at half the FP16-accumulate rate): the ``note`` says so.

FP16, BF16 and FP8 peaks are the ones **with FP32 accumulation**, which is what torch's
matmuls use (cuBLAS's default compute type), so a GeForce card is held to the figure it
can reach. A precision a GPU has no tensor-core path for is absent (None), not 0.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..errors import RemoteCommandError, Stage, StageError
from ..gpuinfo import gpu_type_of
from ..matrix.cells import PRECISIONS  # noqa: F401 - the order reports show them in
from ..matrix.selection import compact_gpu
from .results import RunStatistics

if TYPE_CHECKING:  # only annotations: the store reads MicrobenchRun and must not load asyncssh
    from ..remote.ssh import Connection

__all__ = ["MICROBENCH_SOURCE", "PEAKS", "PRECISIONS", "TORCH_VENV", "GpuPeaks", "MicrobenchFigure", "MicrobenchRun",
           "TorchPython", "ensure_torch", "figures_from_events", "peaks_for", "peaks_for_product", "percent_of_peak",
           "run_microbench"]

UNITS = {"memory_bandwidth": "GB/s", "matmul": "TFLOPS"}


class MicrobenchFigure(BaseModel):
    """One measured figure of a GPU (memory bandwidth, or matmul throughput at a precision)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    #: The matmul's precision (``fp16``...); None for memory bandwidth.
    precision: str | None = None
    unit: str
    #: The timed runs' statistics; None when the figure was skipped.
    stats: RunStatistics | None = None
    #: Why it was not measured (the GPU's compute capability, or what torch said).
    skipped: str | None = None

    @property
    def label(self) -> str:
        """``memory_bandwidth`` or ``matmul_fp16``: the figure's name in reports and the store."""
        return self.kind if self.precision is None else f"{self.kind}_{self.precision}"

    @property
    def value(self) -> float | None:
        """The figure: the mean over the timed runs (None when skipped)."""
        return self.stats.mean if self.stats is not None else None

    def percent_of_peak(self, gpu: str) -> float | None:
        """The mean as a % of ``gpu``'s datasheet peak (:mod:`.microbench`); None if no peak is known."""
        peaks = peaks_for(gpu)
        return percent_of_peak(self.value, peaks.peak(self.kind, self.precision) if peaks else None)


class MicrobenchRun(BaseModel):
    """Everything one microbenchmark cell measured, and on what."""

    model_config = ConfigDict(frozen=True)

    device: str = ""
    capability: str = ""
    torch_version: str = ""
    #: ``CUDA_VISIBLE_DEVICES`` the script ran with (the leased GPU on a shared machine); "": every GPU.
    visible_devices: str = ""
    figures: tuple[MicrobenchFigure, ...] = ()


def figures_from_events(events: list[dict[str, Any]]) -> MicrobenchRun:
    """The script's events as a :class:`MicrobenchRun` (figures in the order measured).

    A ``figure`` event without a single finite value is kept as skipped, with that said,
    rather than averaged as 0.
    """
    device: dict[str, Any] = next((e for e in events if e.get("event") == "device"), {})
    figures = []
    for event in events:
        kind, precision = event.get("kind"), event.get("precision")
        if event.get("event") == "skipped":
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=UNITS.get(kind, ""),
                                            skipped=str(event.get("reason") or "not measured")))
        elif event.get("event") == "figure":
            unit = str(event.get("unit") or UNITS.get(kind, ""))
            try:
                stats = RunStatistics.from_values(event.get("values") or [])
            except ValueError as exc:
                figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit,
                                                skipped=f"no usable run: {exc}"))
                continue
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit, stats=stats))
    capability = device.get("capability") or []
    return MicrobenchRun(device=str(device.get("name") or ""),
                         capability=".".join(str(part) for part in capability),
                         torch_version=str(device.get("torch") or ""),
                         visible_devices=str(device.get("visible_devices") or ""), figures=tuple(figures))


# ------------------------------------ on the instance: torch, then the script

MICROBENCH_SOURCE = resources.files("pytest_gpubench.remote").joinpath("microbench_script.py").read_text()
#: Where torch is installed when the instance's Python has none (relative to the login's HOME).
TORCH_VENV = ".gpubench/torch-venv"
_FOUND, _INSTALLED = "gpubench-torch", "gpubench-torch-installed"

# Each branch prints the marker and the Python to use; pip's chatter goes to stderr.
_ENSURE = f"""\
if python3 -c 'import torch' >/dev/null 2>&1; then echo "{_FOUND} $(command -v python3)"; exit 0; fi
venv="$HOME/{TORCH_VENV}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "{_FOUND} $venv/bin/python"; exit 0
fi
command -v python3 >/dev/null 2>&1 || {{ echo "no python3 on the instance: cannot install torch" >&2; exit 4; }}
mkdir -p "$HOME/.gpubench"
python3 -m venv "$venv" >&2 || {{
  echo "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 5; }}
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch >&2 || exit 6
"$venv/bin/python" -c 'import torch' >&2 || exit 7
echo "{_INSTALLED} $venv/bin/python"
"""


@dataclass(frozen=True)
class TorchPython:
    """The instance's Python that imports torch, and whether torch was installed just now."""

    python: str
    installed: bool


async def ensure_torch(conn: Connection, timeout: float) -> TorchPython:
    """A Python on the instance that imports torch, installing it into a venv when needed;
    a failure or the timeout is a stage ``runtime_setup`` error naming what went wrong."""
    done = await conn.run(_ENSURE, stage=Stage.RUNTIME_SETUP, what="installing torch for the microbenchmarks",
                          timeout=timeout, check=False)
    for line in done.stdout.splitlines():
        marker, _, python = line.strip().partition(" ")
        if marker in (_FOUND, _INSTALLED) and python:
            return TorchPython(python=python, installed=marker == _INSTALLED)
    raise RemoteCommandError(Stage.RUNTIME_SETUP, "installing torch for the microbenchmarks (python3 -m venv "
                             f"~/{TORCH_VENV} && pip install torch)", done.exit_status, done.stderr or done.stdout)


async def run_microbench(conn: Connection, python: str, plan: dict[str, Any], timeout: float, *,
                        env_prefix: str = "") -> list[dict[str, Any]]:
    """Run the microbenchmark script with ``python`` on ``plan``; its events, in order.

    ``env_prefix`` goes before the command: ``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 `` where the
    cell leased GPU 1 (``runtimes/gpus.GpuPlacement.shell_prefix``), so the script's ``cuda:0`` is that GPU.

    A script that reports an error, or ends without its ``done`` event, is a stage
    ``benchmark`` error with its message or stderr's tail.
    """
    command = f"{env_prefix}{shlex.quote(python)} - {shlex.quote(json.dumps(plan))}"
    done = await conn.run(command, stage=Stage.BENCHMARK, what="the GPU microbenchmarks", timeout=timeout,
                          stdin=MICROBENCH_SOURCE, check=False)
    events = []
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a library's own print: not ours
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    failed = next((e for e in events if e["event"] == "error"), None)
    if failed is not None:
        raise StageError(Stage.BENCHMARK, f"the GPU microbenchmarks could not run: {failed.get('message')}")
    if not any(e["event"] == "done" for e in events):
        raise RemoteCommandError(Stage.BENCHMARK, "the GPU microbenchmarks", done.exit_status,
                                 done.stderr or done.stdout)
    return events


# ------------------------------------------------------------ datasheet peaks

_AMPERE_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_RTX_BLACKWELL = ("https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
                  "nvidia-rtx-blackwell-gpu-architecture.pdf")
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_H100_SHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"


class GpuPeaks(BaseModel):
    """One GPU's datasheet peaks and where they come from."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    memory_gb_per_s: float
    #: Dense TFLOPS (INT8: TOPS) by precision; a precision without a tensor-core path is absent.
    tflops: dict[str, float]
    source: str
    note: str = ""
    #: Other names of the same card: what ``nvidia-smi`` calls it, reduced as ``cloud: local`` and
    #: ``cloud: hosts`` name a machine's GPU type (``gpuinfo.gpu_type_of``): "NVIDIA H200" is "H200".
    #: Only names that are this card and no other (the H100 PCIe's "H100" is not: clouds say it of both).
    aliases: tuple[str, ...] = ()

    def peak(self, kind: str, precision: str | None = None) -> float | None:
        """The peak a measured figure of ``kind`` (and ``precision``) is compared with."""
        if kind == "memory_bandwidth":
            return self.memory_gb_per_s
        return self.tflops.get(precision or "")


PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks(gpu="RTX 3090", memory_gb_per_s=936,
             tflops={"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0, "int8": 284.0},
             source=_AMPERE_GA102,
             note="GA102 whitepaper, GeForce RTX 3090 column: dense, FP16/BF16 with FP32 accumulate"),
    GpuPeaks(gpu="RTX 4090", memory_gb_per_s=1008,
             tflops={"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3, "int8": 660.6},
             source=_ADA, note="Ada whitepaper, GeForce RTX 4090 column: dense, FP8/FP16/BF16 with FP32 accumulate"),
    GpuPeaks(gpu="RTX 5090", memory_gb_per_s=1792,
             tflops={"fp32": 104.8, "tf32": 104.8, "fp16": 209.5, "bf16": 209.5, "fp8": 419.0, "int8": 838.0},
             source=_RTX_BLACKWELL,
             note="RTX Blackwell whitepaper, GeForce RTX 5090 column: dense, FP8/FP16/BF16 with FP32 accumulate"),
    GpuPeaks(gpu="RTX 5070", memory_gb_per_s=672,
             tflops={"fp32": 30.9, "tf32": 30.9, "fp16": 61.8, "bf16": 61.8, "fp8": 123.5, "int8": 247.0},
             source=_RTX_BLACKWELL,
             note="988 AI TOPS (FP4, sparse) by the whitepaper's ratios: dense halves, FP4->FP8->FP16 halve, "
                  "FP32 accumulate halves FP8/FP16"),
    GpuPeaks(gpu="RTX 5060 Ti", memory_gb_per_s=448,
             tflops={"fp32": 23.7, "tf32": 23.7, "fp16": 47.4, "bf16": 47.4, "fp8": 94.9, "int8": 189.8},
             source=_RTX_BLACKWELL,
             note="759 AI TOPS (FP4, sparse) by the whitepaper's ratios: dense halves, FP4->FP8->FP16 halve, "
                  "FP32 accumulate halves FP8/FP16"),
    GpuPeaks(gpu="A100 80GB", memory_gb_per_s=1935,
             tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
             source=_A100, note="A100 80GB PCIe column, dense figures; the SXM card has 2039 GB/s"),
    GpuPeaks(gpu="H100 SXM", memory_gb_per_s=3350,
             tflops={"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9},
             source=_H100, aliases=("H100 80GB", "H100 SXM5", "H100 SXM5 80GB"),
             note="Hopper whitepaper, H100 SXM5 column (dense, FP32 accumulate); 3.35 TB/s from the H100 "
                  "datasheet. nvidia-smi names it \"NVIDIA H100 80GB HBM3\""),
    GpuPeaks(gpu="H100 PCIe", memory_gb_per_s=2000,
             tflops={"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0, "int8": 1513.0},
             source=_H100, aliases=("H100 PCIe 80GB",),
             note="Hopper whitepaper, H100 PCIe column (dense, FP32 accumulate); 2 TB/s from the H100 "
                  "datasheet. nvidia-smi names it \"NVIDIA H100 PCIe\""),
    GpuPeaks(gpu="H100 NVL", memory_gb_per_s=3900,
             tflops={"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5, "int8": 1670.5},
             source=_H100_SHEET, note="H100 NVL column of the H100 datasheet (94 GB); its tensor figures are "
                                      "with sparsity: halved"),
    GpuPeaks(gpu="H200 NVL", memory_gb_per_s=4800,
             tflops={"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5, "int8": 1670.5},
             source=_H200, note="H200 NVL column; the datasheet's tensor figures are with sparsity: halved"),
    GpuPeaks(gpu="H200 SXM", memory_gb_per_s=4800,
             tflops={"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0, "int8": 1979.0},
             source=_H200, aliases=("H200", "H200 141GB"),
             note="H200 SXM column (141 GB HBM3e); the datasheet's tensor figures are with sparsity: halved. "
                  "nvidia-smi names it \"NVIDIA H200\" (the NVL card \"NVIDIA H200 NVL\")"),
)

_BY_NAME = {compact_gpu(name).lower(): entry for entry in PEAKS for name in (entry.gpu, *entry.aliases)}
#: Words of nvidia-smi's product names that are no part of a card's name here (vendor, brand
#: line, memory type); the form factor (PCIe, SXM) and the memory size stay: they tell H100s apart.
_VENDOR_WORDS = re.compile(r"(?i)\b(nvidia|geforce|tesla|quadro|hbm2e?|hbm3e?|gddr6x?|gddr7)\b")


def peaks_for(gpu: str) -> GpuPeaks | None:
    """The peaks of ``gpu`` as a matrix or an offer writes it (``RTX 4090``, ``rtx4090``); None if unknown."""
    return _BY_NAME.get(compact_gpu(gpu).lower())


def peaks_for_product(product_name: str) -> GpuPeaks | None:
    """The peaks of the card ``nvidia-smi`` (or NVML) names ``product_name``; None if unknown.

    The vendor and memory-type words go, the form factor and memory size stay:
    "NVIDIA H100 PCIe" is the H100 PCIe, "NVIDIA H100 80GB HBM3" the SXM5 card,
    "NVIDIA H200" the H200 SXM, "NVIDIA GeForce RTX 4090" the RTX 4090. A name that is
    still unknown is read as a machine's GPU type (``gpuinfo.gpu_type_of``: "NVIDIA
    A100-SXM4-80GB" is "A100 80GB").
    """
    stripped = _VENDOR_WORDS.sub(" ", product_name.replace("-", " "))
    return peaks_for(stripped) or peaks_for(gpu_type_of(product_name))


def percent_of_peak(value: float | None, peak: float | None) -> float | None:
    """``value`` as a percentage of ``peak``; None when either is unknown (or the peak is 0)."""
    if value is None or not peak:
        return None
    return 100.0 * value / peak
