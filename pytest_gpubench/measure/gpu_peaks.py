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

from pydantic import BaseModel, ConfigDict

from ..matrix.microbench import PRECISIONS  # noqa: F401 - the order reports show them in
from ..matrix.selection import compact_gpu

__all__ = ["PEAKS", "PRECISIONS", "GpuPeaks", "peaks_for", "percent_of_peak"]

_AMPERE_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_RTX_BLACKWELL = ("https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
                  "nvidia-rtx-blackwell-gpu-architecture.pdf")
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"


class GpuPeaks(BaseModel):
    """One GPU's datasheet peaks and where they come from."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    memory_gb_per_s: float
    #: Dense TFLOPS (INT8: TOPS) by precision; a precision without a tensor-core path is absent.
    tflops: dict[str, float]
    source: str
    note: str = ""

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
    GpuPeaks(gpu="H200 NVL", memory_gb_per_s=4800,
             tflops={"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5, "int8": 1670.5},
             source=_H200, note="H200 NVL column; the datasheet's tensor figures are with sparsity: halved"),
    GpuPeaks(gpu="H200 SXM", memory_gb_per_s=4800,
             tflops={"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0, "int8": 1979.0},
             source=_H200, note="H200 SXM column; the datasheet's tensor figures are with sparsity: halved"),
)

_BY_NAME = {compact_gpu(entry.gpu).lower(): entry for entry in PEAKS}


def peaks_for(gpu: str) -> GpuPeaks | None:
    """The peaks of ``gpu`` as a matrix or an offer writes it (``RTX 4090``, ``rtx4090``); None if unknown."""
    return _BY_NAME.get(compact_gpu(gpu).lower())


def percent_of_peak(value: float | None, peak: float | None) -> float | None:
    """``value`` as a percentage of ``peak``; None when either is unknown (or the peak is 0)."""
    if value is None or not peak:
        return None
    return 100.0 * value / peak
