"""The report's Hardware section as a table, the same in the Markdown and the HTML report."""

from __future__ import annotations

from .hardware import MachineRow
from .tables import Figure, Table, Value

__all__ = ["HARDWARE_INTRO", "NO_HARDWARE", "hardware_table"]

HARDWARE_INTRO = ("The machines measured on, as system detection found them (docs/hardware.md): one row per "
                  "machine, its first GPU's figures; Source says what answered (nvml, nvidia-smi-xml, "
                  "nvidia-smi-csv).")
NO_HARDWARE = "No system was detected in these runs (older runs, imports and endpoints have none)."
GIB = 1024 ** 3


def _number(value: float | None, text: str) -> Figure:
    return Figure(text if value is not None else "-", value)


def _gib(mib: int | None) -> Figure:
    return _number(mib, f"{mib / 1024:.0f}" if mib is not None else "")


def _disk(row: MachineRow) -> str:
    if row.disk_total_bytes is None:
        return "-"
    free = f"{row.disk_free_bytes / GIB:.0f}" if row.disk_free_bytes is not None else "?"
    return f"{free} / {row.disk_total_bytes / GIB:.0f}"


def _gpus(row: MachineRow) -> str:
    return f"{row.gpu_count} x {row.gpu_name}" if row.gpu_count != 1 else row.gpu_name or "-"


def hardware_table(rows: list[MachineRow]) -> Table:
    """GPU and provider, the GPUs with their memory, compute capability, max clocks and power limit,
    driver and CUDA, the host (CPU, RAM, OS, kernel, free / total disk), the source and sessions."""
    body: list[tuple[Value, ...]] = [
        (row.gpu_type, row.provider_label, _gpus(row), _gib(row.memory_mib), row.compute_capability or "-",
         _number(row.sm_clock_max_mhz, str(row.sm_clock_max_mhz)),
         _number(row.mem_clock_max_mhz, str(row.mem_clock_max_mhz)),
         _number(row.power_limit_w, f"{row.power_limit_w:.0f}" if row.power_limit_w is not None else ""),
         row.driver_version or "-", row.cuda_version or "-",
         f"{row.cpu_model or '?'} ({row.cpu_cores} cores)" if row.cpu_cores else (row.cpu_model or "-"),
         _gib(row.ram_mib), row.os or "-", row.kernel or "-", _disk(row), row.source,
         Figure(str(row.sessions), row.sessions))
        for row in rows
    ]
    return Table(("GPU", "Provider", "GPUs", "GPU memory (GiB)", "Compute cap.", "Max SM MHz", "Max memory MHz",
                  "Power limit (W)", "Driver", "CUDA", "CPU", "RAM (GiB)", "OS", "Kernel", "Disk free / total (GiB)",
                  "Source", "Sessions"), body)
