"""The machines a report's runs measured on, for its Hardware section (docs/report.md).

System detection records each session's machine once (the store's ``systems``);
here they become one row per machine: sessions of the same GPU type, provider and
machine (the offer's machine id, a host's name) whose GPUs, driver, CPU and OS agree fold into one row (``sessions`` counts them,
the disk figures are the latest session's), and a different machine under the same
GPU type and provider gets a row of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from ..remote.sysinfo import SystemInfo
from ..store.base import Store
from ..store.records import SystemRecord

__all__ = ["MachineRow", "machines"]


class MachineRow(BaseModel):
    """One machine: its GPUs (the first one's figures: the cell's GPUs are alike) and its host."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    provider: str
    #: Which of the provider's machines (the offer's machine id; a host's name); "": unknown.
    machine: str = ""
    gpu_name: str
    gpu_count: int
    memory_mib: int | None
    compute_capability: str
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    power_limit_w: float | None
    driver_version: str
    cuda_version: str
    cpu_model: str
    cpu_cores: int
    ram_mib: int | None
    os: str
    kernel: str
    disk_total_bytes: int | None
    disk_free_bytes: int | None
    #: Which source answered: ``nvml``, ``nvidia-smi-xml`` or ``nvidia-smi-csv``.
    source: str
    #: Sessions detected on such a machine.
    sessions: int = 1

    @classmethod
    def of(cls, record: SystemRecord, sessions: int = 1) -> MachineRow:
        system: SystemInfo = record.system
        gpu, host = system.first, system.host
        return cls(
            gpu_type=record.gpu_type, provider=record.provider, machine=record.machine,
            gpu_name=gpu.name if gpu else "",
            gpu_count=len(system.gpus), memory_mib=gpu.memory_total_mib if gpu else None,
            compute_capability=gpu.compute_capability if gpu else "",
            sm_clock_max_mhz=gpu.sm_clock_max_mhz if gpu else None,
            mem_clock_max_mhz=gpu.mem_clock_max_mhz if gpu else None,
            power_limit_w=gpu.power_limit_w if gpu else None, driver_version=system.driver_version,
            cuda_version=system.cuda_version, cpu_model=host.cpu_model, cpu_cores=host.cpu_cores,
            ram_mib=host.ram_mib, os=host.os, kernel=host.kernel, disk_total_bytes=host.disk_total_bytes,
            disk_free_bytes=host.disk_free_bytes, source=system.source, sessions=sessions,
        )

    @property
    def provider_label(self) -> str:
        """The provider and, when known and not its own name, the machine: ``hosts (lab1)``."""
        return f"{self.provider} ({self.machine})" if self.machine and self.machine != self.provider \
            else self.provider

    @property
    def identity(self) -> tuple[object, ...]:
        """What makes two sessions the same machine (the disk's free space does not)."""
        return (self.gpu_type, self.provider, self.machine, self.gpu_name, self.gpu_count, self.memory_mib,
                self.compute_capability, self.sm_clock_max_mhz, self.mem_clock_max_mhz, self.power_limit_w,
                self.driver_version, self.cuda_version, self.cpu_model, self.cpu_cores, self.ram_mib, self.os,
                self.kernel, self.source)


def machines(store: Store, run_ids: Sequence[str]) -> list[MachineRow]:
    """The machines of ``run_ids``, by GPU type and provider; the latest session's figures for each."""
    records = sorted((record for run_id in run_ids for record in store.systems(run_id)),
                     key=lambda record: record.recorded_at or "")
    found: dict[tuple[object, ...], MachineRow] = {}
    for record in records:
        row = MachineRow.of(record)
        earlier = found.get(row.identity)
        found[row.identity] = row if earlier is None else row.model_copy(update={"sessions": earlier.sessions + 1})
    return sorted(found.values(), key=lambda row: (row.gpu_type, row.provider, row.machine, row.gpu_count,
                                                   row.gpu_name))
