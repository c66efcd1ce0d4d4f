"""Datasheet peaks of the GPUs the project knows: what a microbenchmark is a percentage of.

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

import re

from pydantic import BaseModel, ConfigDict

from ..gpuinfo import gpu_type_of
from ..matrix.cells import PRECISIONS  # noqa: F401 - the order reports show them in
from ..matrix.selection import compact_gpu

__all__ = ["PEAKS", "PRECISIONS", "GpuPeaks", "peaks_for", "peaks_for_product", "percent_of_peak"]

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
