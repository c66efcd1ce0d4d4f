"""The human and XML views of the ``nvidia-smi`` stand-in: the table, ``-L``, ``-q [-x]``.

Layouts follow the 550-series driver: the 91-column table, ``nvsmi_device_v12.dtd``
XML. Power readings sit under ``gpu_power_readings``; drivers from 555 on replace
its ``power_draw`` with ``average_power_draw`` and ``instant_power_draw``, and the
stand-in does the same for such a driver version, so parsers meet both.
"""

from __future__ import annotations

import time
from xml.sax.saxutils import escape, quoteattr

from .gpu_readings import GpuReading
from .instance_spec import InstanceSpec

# (xml tag, text label, value or children)
Node = tuple[str, str, "str | list[Node]"]

_ARCHITECTURES = {
    "6": "Pascal",
    "7.0": "Volta",
    "7.2": "Volta",
    "7.5": "Turing",
    "8": "Ampere",
    "8.9": "Ada Lovelace",
    "9": "Hopper",
    "10": "Blackwell",
    "12": "Blackwell",
}
# --query-gpu fields whose XML elements turn N/A with GPUBENCH_SANDBOX_SMI_NA.
NA_XML_TAGS = {
    "power.draw": {"power_draw", "average_power_draw", "instant_power_draw"},
    "temperature.gpu": {"gpu_temp"},
    "utilization.gpu": {"gpu_util"},
    "utilization.memory": {"memory_util"},
    "memory.used": {"used"},
    "memory.free": {"free"},
    "fan.speed": {"fan_speed"},
}


def architecture(compute_capability: str) -> str:
    major = compute_capability.split(".")[0]
    return _ARCHITECTURES.get(compute_capability) or _ARCHITECTURES.get(major, "N/A")


def driver_major(spec: InstanceSpec) -> int:
    try:
        return int(spec.gpu.driver_version.split(".")[0])
    except ValueError:
        return 0


def _mhz(value: int | None) -> str:
    return f"{value} MHz" if value is not None else "N/A"


def _power_nodes(spec: InstanceSpec, gpu: GpuReading) -> list[Node]:
    draw = f"{gpu.power_draw_w:.2f} W"
    limit = gpu.power_limit_w
    if driver_major(spec) >= 555:
        readings: list[Node] = [
            ("average_power_draw", "Average Power Draw", draw),
            ("instant_power_draw", "Instantaneous Power Draw", draw),
        ]
    else:
        readings = [("power_draw", "Power Draw", draw)]
    return [
        ("power_state", "Power State", gpu.pstate),
        *readings,
        ("current_power_limit", "Current Power Limit", f"{limit:.2f} W"),
        ("requested_power_limit", "Requested Power Limit", f"{limit:.2f} W"),
        ("default_power_limit", "Default Power Limit", f"{limit:.2f} W"),
        ("min_power_limit", "Min Power Limit", f"{limit / 3:.2f} W"),
        ("max_power_limit", "Max Power Limit", f"{limit * 4 / 3:.2f} W"),
    ]


def gpu_nodes(spec: InstanceSpec, gpu: GpuReading) -> list[Node]:
    """The ``<gpu>`` element's contents, in nvidia-smi's order."""
    brand = "GeForce" if "GeForce" in gpu.name else "NVIDIA"
    processes: list[Node] = [
        (
            "process_info",
            "Process",
            [
                ("gpu_instance_id", "GPU instance ID", "N/A"),
                ("compute_instance_id", "Compute instance ID", "N/A"),
                ("pid", "Process ID", str(proc.pid)),
                ("type", "Type", "C"),
                ("process_name", "Name", proc.name),
                ("used_memory", "Used GPU Memory", f"{proc.used_mib} MiB"),
            ],
        )
        for proc in gpu.processes
    ]
    return [
        ("product_name", "Product Name", gpu.name),
        ("product_brand", "Product Brand", brand),
        ("product_architecture", "Product Architecture", architecture(spec.gpu.compute_capability)),
        ("display_mode", "Display Mode", "Disabled"),
        ("display_active", "Display Active", "Disabled"),
        ("persistence_mode", "Persistence Mode", "Enabled"),
        ("serial", "Serial Number", "N/A"),
        ("uuid", "GPU UUID", gpu.uuid),
        ("minor_number", "Minor Number", str(gpu.index)),
        ("vbios_version", "VBIOS Version", "95.02.3C.00.8A"),
        ("compute_cap", "Compute Capability", spec.gpu.compute_capability),
        (
            "pci",
            "PCI",
            [
                ("pci_bus", "Bus", f"{gpu.index + 1:02X}"),
                ("pci_device", "Device", "00"),
                ("pci_domain", "Domain", "0000"),
                ("pci_bus_id", "Bus Id", gpu.bus_id),
            ],
        ),
        ("fan_speed", "Fan Speed", f"{gpu.fan_percent} %"),
        ("performance_state", "Performance State", gpu.pstate),
        (
            "fb_memory_usage",
            "FB Memory Usage",
            [
                ("total", "Total", f"{gpu.memory_total_mib} MiB"),
                ("reserved", "Reserved", "0 MiB"),
                ("used", "Used", f"{gpu.memory_used_mib} MiB"),
                ("free", "Free", f"{gpu.memory_free_mib} MiB"),
            ],
        ),
        ("compute_mode", "Compute Mode", "Default"),
        (
            "utilization",
            "Utilization",
            [
                ("gpu_util", "Gpu", f"{gpu.utilization_gpu} %"),
                ("memory_util", "Memory", f"{gpu.utilization_memory} %"),
                ("encoder_util", "Encoder", "0 %"),
                ("decoder_util", "Decoder", "0 %"),
            ],
        ),
        (
            "temperature",
            "Temperature",
            [
                ("gpu_temp", "GPU Current Temp", f"{gpu.temperature_c} C"),
                ("gpu_temp_max_threshold", "GPU Shutdown Temp", "90 C"),
                ("gpu_temp_slow_threshold", "GPU Slowdown Temp", "87 C"),
                ("gpu_temp_max_gpu_threshold", "GPU Max Operating Temp", "83 C"),
                ("gpu_target_temperature", "GPU Target Temperature", "84 C"),
                ("memory_temp", "Memory Current Temp", "N/A"),
            ],
        ),
        ("gpu_power_readings", "GPU Power Readings", _power_nodes(spec, gpu)),
        (
            "clocks",
            "Clocks",
            [
                ("graphics_clock", "Graphics", f"{gpu.sm_clock_mhz} MHz"),
                ("sm_clock", "SM", f"{gpu.sm_clock_mhz} MHz"),
                ("mem_clock", "Memory", f"{gpu.mem_clock_mhz} MHz"),
            ],
        ),
        (
            "max_clocks",
            "Max Clocks",
            [
                ("graphics_clock", "Graphics", _mhz(spec.gpu.sm_clock_max_mhz)),
                ("sm_clock", "SM", _mhz(spec.gpu.sm_clock_max_mhz)),
                ("mem_clock", "Memory", _mhz(spec.gpu.mem_clock_max_mhz)),
            ],
        ),
        ("processes", "Processes", processes or "None"),
    ]


def _blank_na(nodes: list[Node], tags: set[str]) -> list[Node]:
    out: list[Node] = []
    for tag, label, value in nodes:
        if isinstance(value, list):
            out.append((tag, label, _blank_na(value, tags)))
        else:
            out.append((tag, label, "N/A" if tag in tags else value))
    return out


def log_nodes(spec: InstanceSpec, gpus: list[GpuReading], na_fields: set[str]) -> list[Node]:
    """The whole ``nvidia_smi_log`` document, GPUs included."""
    tags = set().union(*(NA_XML_TAGS.get(field, set()) for field in na_fields))
    header: list[Node] = [
        ("timestamp", "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        ("driver_version", "Driver Version", spec.gpu.driver_version),
        ("cuda_version", "CUDA Version", spec.gpu.cuda_version),
        ("attached_gpus", "Attached GPUs", str(len(gpus))),
    ]
    return header + [("gpu", gpu.bus_id, _blank_na(gpu_nodes(spec, gpu), tags)) for gpu in gpus]


def render_xml(nodes: list[Node]) -> str:
    lines = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">', "<nvidia_smi_log>"]

    def emit(items: list[Node], depth: int) -> None:
        pad = "\t" * depth
        for tag, label, value in items:
            attrs = f" id={quoteattr(label)}" if tag == "gpu" else ""
            if isinstance(value, list):
                lines.append(f"{pad}<{tag}{attrs}>")
                emit(value, depth + 1)
                lines.append(f"{pad}</{tag}>")
            elif tag == "processes" and value == "None":
                lines.append(f"{pad}<{tag}>")
                lines.append(f"{pad}</{tag}>")
            else:
                lines.append(f"{pad}<{tag}{attrs}>{escape(value)}</{tag}>")

    emit(nodes, 1)
    lines.append("</nvidia_smi_log>")
    return "\n".join(lines) + "\n"


def render_text(nodes: list[Node]) -> str:
    """``nvidia-smi -q``: labels padded so the colons line up at column 42."""
    lines = ["", "==============NVSMI LOG==============", ""]

    def emit(items: list[Node], depth: int) -> None:
        pad = "    " * depth
        for tag, label, value in items:
            if tag == "gpu":
                lines.append("")
                lines.append(f"GPU {label}")
                emit(value if isinstance(value, list) else [], 1)
            elif isinstance(value, list):
                lines.append(f"{pad}{label}")
                emit(value, depth + 1)
            else:
                lines.append(f"{pad}{label}".ljust(42) + f": {value}")

    emit(nodes, 0)
    return "\n".join(lines) + "\n\n"


def render_list(gpus: list[GpuReading]) -> str:
    """``nvidia-smi -L``."""
    return "".join(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})\n" for gpu in gpus)


_RULE = "+" + "-" * 89 + "+"
_SPLIT = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


def render_table(spec: InstanceSpec, gpus: list[GpuReading]) -> str:
    """Plain ``nvidia-smi``: the familiar 91-column table."""
    version = spec.gpu.driver_version
    lines = [
        time.strftime("%a %b %d %H:%M:%S %Y").ljust(31),
        _RULE,
        f"| NVIDIA-SMI {version:<23}Driver Version: {version:<15}CUDA Version: {spec.gpu.cuda_version:<9}|",
        "|" + _SPLIT[1:],
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for gpu in gpus:
        power = f"{round(gpu.power_draw_w)}W"
        lines += [
            f"| {gpu.index:>3}  {gpu.name[:29]:<29}{'On':>4}  |{gpu.bus_id:>19} {'Off':>3} |{'Off':>21} |",
            f"|{gpu.fan_percent:>3}%{gpu.temperature_c:>5}C{gpu.pstate:>6}{power:>16} /{round(gpu.power_limit_w):>5}W |"
            f"{gpu.memory_used_mib:>8}MiB /{gpu.memory_total_mib:>7}MiB |{gpu.utilization_gpu:>7}%{'Default':>13} |",
            f"|{'':41}|{'':24}|{'N/A':>21} |",
            _SPLIT,
        ]
    lines += [
        " " * 91,
        _RULE,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    processes = [(gpu.index, proc) for gpu in gpus for proc in gpu.processes]
    if not processes:
        lines.append("|  No running processes found" + " " * 61 + "|")
    for index, proc in processes:
        name = proc.name if len(proc.name) <= 38 else "..." + proc.name[-35:]
        lines.append(f"|  {index:>3}   N/A  N/A  {proc.pid:>10}      C   {name:<38}{proc.used_mib:>9}MiB |")
    lines.append(_RULE)
    return "\n".join(lines) + "\n"
