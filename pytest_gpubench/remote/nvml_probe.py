"""Shipped to an instance and run as ``python3 -``: the GPUs as NVML sees them, one JSON object.

Stdlib plus ``pynvml`` (the ``nvidia-ml-py`` package) only. When ``pynvml`` is not
importable or NVML does not start (no driver), it prints nothing and exits 3, and
the caller asks ``nvidia-smi`` instead. A figure NVML cannot give (an
``NVMLError`` from one call: "Not Supported" on a GeForce card, say) is ``null``;
the rest still answers.

Function names and units are those of nvidia-ml-py (NVML's C API with the
``nvml`` prefix): memory in bytes, clocks in MHz, power limits in milliwatts,
``nvmlSystemGetCudaDriverVersion`` as ``1000 * major + 10 * minor`` (12040 = 12.4).
"""

import json
import sys

NO_NVML = 3


def _text(value):
    # nvidia-ml-py before 11.515 returned bytes for strings.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _call(function, *args):
    try:
        return function(*args)
    except Exception:  # NVMLError and its subclasses: this figure only
        return None


def _device(nvml, index):
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _call(nvml.nvmlDeviceGetMemoryInfo, handle)
    capability = _call(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
    limit_mw = _call(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    if limit_mw is None:
        limit_mw = _call(nvml.nvmlDeviceGetPowerManagementLimit, handle)
    return {
        "index": index,
        "name": _text(_call(nvml.nvmlDeviceGetName, handle)),
        "uuid": _text(_call(nvml.nvmlDeviceGetUUID, handle)),
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory_total_bytes": memory.total if memory is not None else None,
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        "sm_clock_max_mhz": _call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        "mem_clock_max_mhz": _call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "sm_clock_mhz": _call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": _call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
    }


def main():
    try:
        import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:  # not installed, or no driver to talk to
        print(f"no NVML: {exc}", file=sys.stderr)
        return NO_NVML
    try:
        cuda = _call(nvml.nvmlSystemGetCudaDriverVersion)
        answer = {
            "driver_version": _text(_call(nvml.nvmlSystemGetDriverVersion)),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "gpus": [_device(nvml, index) for index in range(nvml.nvmlDeviceGetCount())],
        }
    except Exception as exc:
        print(f"NVML failed: {exc}", file=sys.stderr)
        return NO_NVML
    finally:
        _call(nvml.nvmlShutdown)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
