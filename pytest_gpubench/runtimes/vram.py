"""Does the model fit the GPU the instance really has? Checked before pulling it.

The offer's ``vram_gb`` chose the machine, but a listing can be wrong, and a
model too large for the card only fails when Ollama loads it, after minutes of
download (seed 001: "OOM during model load | Check VRAM before loading"). The
memory ``nvidia-smi`` reports on the instance is the truth to compare with.
"""

from __future__ import annotations

from ..cloud.offers import VRAM_ROUNDING_GB
from ..remote.readings import HardwareInfo


def vram_shortfall(model: str, need_gb: float, hardware: HardwareInfo | None, gpus: int | None = None) -> str | None:
    """Why ``model`` (needing ``need_gb`` GB) cannot fit the cell's GPUs, or None.

    Memory is summed over the GPUs the cell spans (``gpus``, at most those nvidia-smi
    lists; None: all it lists): every runtime spreads a model over them. It is counted
    as the offers count it (MiB / 1024, within ``VRAM_ROUNDING_GB``), so a card
    that was good enough to rent is good enough here. Unknown memory is no reason
    to skip.
    """
    if hardware is None or hardware.gpu_memory_mib <= 0:
        return None
    count = max(1, hardware.gpu_count if gpus is None else min(gpus, hardware.gpu_count or gpus))
    total_gb = hardware.gpu_memory_mib * count / 1024
    if total_gb + VRAM_ROUNDING_GB >= need_gb:
        return None
    cards = f"{count} x " if count > 1 else ""
    return (f"{model} needs {need_gb:g} GB of VRAM, but nvidia-smi on the instance reports "
            f"{cards}{hardware.gpu_memory_mib} MiB ({hardware.gpu_name or 'unknown GPU'}, {total_gb:.1f} GB "
            "in all): not pulled")
