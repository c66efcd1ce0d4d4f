"""``pynvml`` (the ``nvidia-ml-py`` package) on a sandbox instance: NVML faked where no GPU exists.

Every instance has a ``pynvml.py`` on its ``PYTHONPATH`` (:func:`shim_source`) that
hands its module to :func:`install`. Unless the instance's driver has NVML (the
``gpu_driver`` fault with ``driver: nvml``), the import fails as it does where
``nvidia-ml-py`` is not installed, so the sandbox never reaches a real NVML library of
the machine it runs on. With NVML, the functions system detection calls answer from
the catalog entry and the live readings ``nvidia-smi`` shows (:mod:`.nvidia_smi_standin`),
in nvidia-ml-py's units: bytes, MHz, milliwatts, the CUDA version as ``1000 * major +
10 * minor``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .instance_spec import MIB, InstanceSpec, load_instance_spec
from .nvidia_smi_standin import GpuReading, read_gpus

# nvmlClockType_t (nvml.h): graphics, SM, memory, video.
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO = 0, 1, 2, 3


class NVMLError(Exception):
    """nvidia-ml-py's error type (one class here; the real one has a subclass per code)."""


@dataclass(frozen=True)
class Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class PciInfo:
    busId: str  # noqa: N815 - nvidia-ml-py's name


class FakeNvml:
    """The NVML of one instance."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec

    def _gpu(self, handle: int) -> GpuReading:
        gpus = read_gpus(self.spec)
        if not isinstance(handle, int) or not 0 <= handle < len(gpus):
            raise NVMLError("Invalid Argument")
        return gpus[handle]

    def functions(self) -> dict[str, Any]:
        spec, gpu = self.spec, self._gpu
        major, _, minor = spec.gpu.cuda_version.partition(".")

        def max_clock(handle: int, kind: int) -> int:
            gpu(handle)
            value = {NVML_CLOCK_GRAPHICS: spec.gpu.sm_clock_max_mhz, NVML_CLOCK_SM: spec.gpu.sm_clock_max_mhz,
                     NVML_CLOCK_MEM: spec.gpu.mem_clock_max_mhz}.get(kind)
            if value is None:
                raise NVMLError("Not Supported")
            return value

        def clock(handle: int, kind: int) -> int:
            reading = gpu(handle)
            if kind not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM):
                raise NVMLError("Not Supported")
            return reading.mem_clock_mhz if kind == NVML_CLOCK_MEM else reading.sm_clock_mhz

        def memory(handle: int) -> Memory:
            reading = gpu(handle)
            return Memory(total=reading.memory_total_mib * MIB, used=reading.memory_used_mib * MIB,
                          free=reading.memory_free_mib * MIB)

        def capability(handle: int) -> tuple[int, int]:
            gpu(handle)
            cc_major, _, cc_minor = spec.gpu.compute_capability.partition(".")
            return int(cc_major), int(cc_minor or 0)

        return {
            "NVMLError": NVMLError,
            "NVML_CLOCK_GRAPHICS": NVML_CLOCK_GRAPHICS, "NVML_CLOCK_SM": NVML_CLOCK_SM,
            "NVML_CLOCK_MEM": NVML_CLOCK_MEM, "NVML_CLOCK_VIDEO": NVML_CLOCK_VIDEO,
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: spec.gpu.driver_version,
            "nvmlSystemGetCudaDriverVersion": lambda: int(major) * 1000 + int(minor or 0) * 10,
            "nvmlDeviceGetCount": lambda: spec.gpu.count,
            "nvmlDeviceGetHandleByIndex": lambda index: gpu(index).index,
            "nvmlDeviceGetName": lambda handle: gpu(handle).name,
            "nvmlDeviceGetUUID": lambda handle: gpu(handle).uuid,
            "nvmlDeviceGetPciInfo": lambda handle: PciInfo(busId=gpu(handle).bus_id),
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetCudaComputeCapability": capability,
            "nvmlDeviceGetMaxClockInfo": max_clock,
            "nvmlDeviceGetClockInfo": clock,
            "nvmlDeviceGetEnforcedPowerLimit": lambda handle: round(gpu(handle).power_limit_w * 1000),
            "nvmlDeviceGetPowerManagementLimit": lambda handle: round(gpu(handle).power_limit_w * 1000),
            "nvmlDeviceGetPowerUsage": lambda handle: round(gpu(handle).power_draw_w * 1000),
            "nvmlDeviceGetTemperature": lambda handle, sensor=0: gpu(handle).temperature_c,
        }


def install(namespace: MutableMapping[str, Any]) -> None:
    """Fill the instance's ``pynvml`` module; ``ModuleNotFoundError`` when its driver has no NVML."""
    try:
        spec = load_instance_spec()
    except RuntimeError as exc:
        raise ModuleNotFoundError(f"No module named 'pynvml' ({exc})", name="pynvml") from None
    if not spec.gpu_tools.nvml:
        raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")
    namespace.update(FakeNvml(spec).functions())


def shim_source(package_root: Path) -> str:
    """The instance's ``pynvml.py``: the sandbox package on the path, then :func:`install`."""
    return (
        '"""gpubench sandbox stand-in for nvidia-ml-py (pytest_gpubench.sandbox.pynvml_standin)."""\n'
        "import sys\n\n"
        f"if {str(package_root)!r} not in sys.path:\n"
        f"    sys.path.insert(0, {str(package_root)!r})\n"
        "from pytest_gpubench.sandbox.pynvml_standin import install\n\n"
        "install(globals())\n"
    )
