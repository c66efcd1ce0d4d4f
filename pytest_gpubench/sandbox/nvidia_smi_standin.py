"""The ``nvidia-smi`` program of a sandbox instance, and the emulated GPU's live readings.

Run as ``python -m pytest_gpubench.sandbox.nvidia_smi_standin ARGS``. It reads the
instance from ``GPUBENCH_SANDBOX_INSTANCE`` and the Ollama stand-in's runtime state
(the live readings below), and answers like the real tool:

``--query-gpu=F1,F2 --format=csv[,noheader][,nounits]``
    one CSV line per GPU, fields in the order asked, ``, ``-separated; the header
    names fields with their unit (``memory.total [MiB]``), values carry units
    (``24564 MiB``, ``450.00 W``, ``45 %``) unless ``nounits``. An unknown field:
    ``Field "x" is not a valid field to query.`` and exit 2.
``--query-compute-apps=pid,process_name,used_memory --format=csv``
    the Ollama runner while a model is loaded.
``-q [-x]``, ``-L``, no arguments
    the detailed log (text or XML), the GPU list, the table.
``-i N``, ``-l SECONDS``, ``-lms MILLISECONDS``
    select GPUs; repeat every interval until interrupted (the CSV header once).

The instance file's ``gpu_tools`` (the ``gpu_driver`` fault) makes it an older driver:
``-q -x`` refused as an invalid combination (exit 2), some ``--query-gpu`` fields unknown.
Max clocks come from the catalog (``[N/A]`` when it has none).

Test knobs (environment): ``GPUBENCH_SANDBOX_SMI_NA=power.draw,...`` reports those
fields as ``[N/A]``; ``GPUBENCH_SANDBOX_SMI_FAULT=driver`` fails as a machine with a
broken driver does (exit 9).

**Live readings** (:func:`read_gpus`, which the ``pynvml`` stand-in answers from too).
``nvidia-smi`` has no GPU to ask, so it asks the Ollama stand-in's runtime state:

- memory used = a baseline (driver context) + each loaded model's VRAM, split
  evenly over the cards that hold it (the server's ``CUDA_VISIBLE_DEVICES``, a
  tensor-parallel group; every card when the state does not say);
- power and utilisation follow the number ``b`` of sequences generating (the serving
  engine's ``active_requests``): :func:`power_draw_w` rises from the idle draw towards
  the power limit as the batch grows, :func:`utilization_pct` likewise, so energy per
  token falls as concurrency rises (docs/sandbox.md, "Batching and power law"); clocks
  are high while a generation runs and drop to idle values when none does;
- temperature and fan follow load with a lag (exponential, ``THERMAL_TAU_S``), so a
  sampled benchmark sees warm-up and cool-down rather than a step.

Values wobble a little with time, deterministically, so samples are not all equal.

**The human and XML views**: the table, ``-L``, ``-q [-x]``. Layouts follow the
550-series driver: the 91-column table, ``nvsmi_device_v12.dtd`` XML. Power readings sit
under ``gpu_power_readings``; drivers from 555 on replace its ``power_draw`` with
``average_power_draw`` and ``instant_power_draw``, and the stand-in does the same for such
a driver version, so parsers meet both.
"""

from __future__ import annotations

import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from .instance_spec import BASELINE_MIB, MIB, InstanceSpec, load_instance_spec
from .standin_answer import Answer
from .standin_state import RuntimeState, StateStore

# ------------------------------------------------------------ live readings

IDLE_TEMP_C = 34.0
HOT_TEMP_C = 74.0
THERMAL_TAU_S = 20.0
RUNNER_PROCESS = "/usr/local/lib/ollama/runners/cuda_v12_avx/ollama_llama_server"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int


@dataclass(frozen=True)
class GpuReading:
    """One card, now."""

    index: int
    name: str
    uuid: str
    bus_id: str
    memory_total_mib: int
    memory_used_mib: int
    temperature_c: int
    power_draw_w: float
    power_limit_w: float
    utilization_gpu: int
    utilization_memory: int
    fan_percent: int
    pstate: str
    sm_clock_mhz: int
    mem_clock_mhz: int
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    @property
    def memory_free_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_used_mib)


def gpu_uuid(spec: InstanceSpec, index: int) -> str:
    """A stable UUID per session and card, in nvidia-smi's ``GPU-...`` form."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpubench-sandbox/{spec.session_id}/{index}"))


def bus_id(index: int) -> str:
    return f"00000000:{index + 1:02X}:00.0"


def _heat(state: RuntimeState, now: float) -> float:
    """0 (cold) .. 1 (steady under load), lagging load changes."""
    if state.active_requests > 0 and state.busy_since is not None:
        return 1 - math.exp(-(now - state.busy_since) / THERMAL_TAU_S)
    if state.busy_since is not None and state.idle_since is not None and state.idle_since >= state.busy_since:
        peak = 1 - math.exp(-(state.idle_since - state.busy_since) / THERMAL_TAU_S)
        return peak * math.exp(-(now - state.idle_since) / THERMAL_TAU_S)
    return 0.0


#: The idle draw, as a share of the power limit (plus 6 W with a model in memory, and up to
#: 2% more while the card is still warm): a card with nothing to run sits at a few percent.
IDLE_POWER_FRACTION = 0.045
#: The batch at which the draw is halfway from idle to the limit (``k`` in :func:`power_draw_w`):
#: 0.9 puts one decoding stream at about 55% of the limit, memory-bound decoding of a single
#: sequence, and 8 at about 90%, where more sequences add compute but little power.
POWER_HALF_BATCH = 0.9
#: The batch at which ``utilization.gpu`` (the share of time a kernel runs) is halfway to 100%:
#: one stream keeps the card busy 80% of the time, a large batch all of it.
UTILIZATION_HALF_BATCH = 0.25


def power_draw_w(limit_w: float, batch: float, idle_w: float) -> float:
    """The card's draw with ``batch`` sequences generating: ``idle + (limit - idle) * b / (b + k)``.

    ``b = 0`` is the idle draw; each sequence more adds less as the draw nears the limit
    (``k`` = :data:`POWER_HALF_BATCH`). Energy per token, this over the batching law's
    aggregate rate, then falls as ``b`` grows for any ceiling factor ``F`` above
    ``1 + k * (1 - idle / limit)`` (about 1.9; docs/sandbox.md).
    """
    batch = max(0.0, batch)
    return idle_w + (limit_w - idle_w) * batch / (batch + POWER_HALF_BATCH)


def utilization_pct(batch: float) -> float:
    """``utilization.gpu`` with ``batch`` sequences generating: ``99 * b / (b + 0.25)``."""
    batch = max(0.0, batch)
    return 99.0 * batch / (batch + UTILIZATION_HALF_BATCH)


def _wobble(now: float, index: int, amplitude: float) -> float:
    return amplitude * math.sin(now * 1.7 + index * 2.1)


def _model_mib_per_card(state: RuntimeState, count: int) -> list[int]:
    """MiB of loaded models on each card: each model's VRAM split evenly over its GPUs."""
    share = [0] * count
    for model in state.loaded:
        cards = [i for i in model.gpus if 0 <= i < count] if model.gpus else list(range(count))
        for index in cards:
            share[index] += math.ceil(model.size_vram / MIB / len(cards))
    return share


def read_gpus(spec: InstanceSpec, now: float | None = None) -> list[GpuReading]:
    """Readings for every card of the instance."""
    now = time.time() if now is None else now
    state = StateStore(spec.state_dir).read_runtime()
    gpu = spec.gpu
    count = gpu.count
    share = _model_mib_per_card(state, count)
    heat = _heat(state, now)
    readings = []
    for index in range(count):
        limit = gpu.power_limit_w
        model_mib = share[index]
        # A card no model is on stays idle while the server works on the others.
        busy = state.active_requests > 0 and (model_mib > 0 or not any(share))
        idle = limit * (IDLE_POWER_FRACTION + 0.02 * heat) + (6 if model_mib else 0)
        if busy:
            batch = state.active_requests
            util = round(min(99.0, utilization_pct(batch) + _wobble(now, index, 1)))
            # Memory bandwidth: one stream already reads every weight each step.
            mem_util = round(60 * batch / (batch + POWER_HALF_BATCH) + _wobble(now, index, 2))
            # The draw follows the batch at once; only temperature and fan lag (heat).
            power = min(limit, power_draw_w(limit, batch, idle) + _wobble(now, index, 2))
            # Under load the card runs near its highest clocks.
            pstate, sm_clock, mem_clock = "P2", gpu.sm_clock_max_mhz or 2520, gpu.mem_clock_max_mhz or 10251
        else:
            util, mem_util = 0, 0
            power = idle + _wobble(now, index, 0.5)
            pstate, sm_clock, mem_clock = ("P8", 210, 405)
        processes: tuple[GpuProcess, ...] = ()
        if model_mib and state.pid:
            processes = (GpuProcess(pid=state.pid, name=RUNNER_PROCESS, used_mib=model_mib),)
        readings.append(
            GpuReading(
                index=index,
                name=gpu.name,
                uuid=gpu_uuid(spec, index),
                bus_id=bus_id(index),
                memory_total_mib=gpu.memory_mib,
                memory_used_mib=min(gpu.memory_mib, BASELINE_MIB + model_mib),
                temperature_c=round(IDLE_TEMP_C + index + (HOT_TEMP_C - IDLE_TEMP_C) * heat + _wobble(now, index, 0.4)),
                power_draw_w=round(max(1.0, power), 2),
                power_limit_w=limit,
                utilization_gpu=max(0, util),
                utilization_memory=max(0, mem_util),
                fan_percent=round(30 + 45 * heat),
                pstate=pstate,
                sm_clock_mhz=sm_clock,
                mem_clock_mhz=mem_clock,
                processes=processes,
            )
        )
    return readings


# (xml tag, text label, value or children)
# ------------------------------------------------------------ the human and XML views

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


def _log_mhz(value: int | None) -> str:
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
                ("graphics_clock", "Graphics", _log_mhz(spec.gpu.sm_clock_max_mhz)),
                ("sm_clock", "SM", _log_mhz(spec.gpu.sm_clock_max_mhz)),
                ("mem_clock", "Memory", _log_mhz(spec.gpu.mem_clock_max_mhz)),
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


# ------------------------------------------------------------ the program

INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NA_ENV = "GPUBENCH_SANDBOX_SMI_NA"
FAULT_ENV = "GPUBENCH_SANDBOX_SMI_FAULT"

Getter = Callable[[InstanceSpec, GpuReading, int], str]


@dataclass(frozen=True)
class QueryField:
    """One ``--query-gpu`` field: header name, unit (None if unitless) and value."""

    name: str
    unit: str | None
    value: Getter


def _watts(w: float) -> str:
    return f"{w:.2f}"


def _mhz(value: int | None) -> str:
    return str(value) if value is not None else "[N/A]"


_PLAIN: dict[str, Getter] = {
    "timestamp": lambda s, g, n: time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}",
    "driver_version": lambda s, g, n: s.gpu.driver_version,
    "count": lambda s, g, n: str(n),
    "name": lambda s, g, n: g.name,
    "serial": lambda s, g, n: "[N/A]",
    "uuid": lambda s, g, n: g.uuid,
    "pci.bus_id": lambda s, g, n: g.bus_id,
    "pci.domain": lambda s, g, n: "0x0000",
    "pci.bus": lambda s, g, n: f"0x{g.index + 1:02X}",
    "index": lambda s, g, n: str(g.index),
    "vbios_version": lambda s, g, n: "95.02.3C.00.8A",
    "display_mode": lambda s, g, n: "Disabled",
    "display_active": lambda s, g, n: "Disabled",
    "persistence_mode": lambda s, g, n: "Enabled",
    "compute_mode": lambda s, g, n: "Default",
    "compute_cap": lambda s, g, n: s.gpu.compute_capability,
    "pstate": lambda s, g, n: g.pstate,
    "temperature.gpu": lambda s, g, n: str(g.temperature_c),
    "temperature.memory": lambda s, g, n: "N/A",
    "mig.mode.current": lambda s, g, n: "[N/A]",
}
_WITH_UNIT: dict[str, tuple[str, Getter]] = {
    "fan.speed": ("%", lambda s, g, n: str(g.fan_percent)),
    "memory.total": ("MiB", lambda s, g, n: str(g.memory_total_mib)),
    "memory.reserved": ("MiB", lambda s, g, n: "0"),
    "memory.used": ("MiB", lambda s, g, n: str(g.memory_used_mib)),
    "memory.free": ("MiB", lambda s, g, n: str(g.memory_free_mib)),
    "utilization.gpu": ("%", lambda s, g, n: str(g.utilization_gpu)),
    "utilization.memory": ("%", lambda s, g, n: str(g.utilization_memory)),
    "power.draw": ("W", lambda s, g, n: _watts(g.power_draw_w)),
    "power.draw.average": ("W", lambda s, g, n: _watts(g.power_draw_w)),
    "power.draw.instant": ("W", lambda s, g, n: _watts(g.power_draw_w)),
    "power.limit": ("W", lambda s, g, n: _watts(g.power_limit_w)),
    "enforced.power.limit": ("W", lambda s, g, n: _watts(g.power_limit_w)),
    "power.default_limit": ("W", lambda s, g, n: _watts(g.power_limit_w)),
    "power.min_limit": ("W", lambda s, g, n: _watts(g.power_limit_w / 3)),
    "power.max_limit": ("W", lambda s, g, n: _watts(g.power_limit_w * 4 / 3)),
    "clocks.current.graphics": ("MHz", lambda s, g, n: str(g.sm_clock_mhz)),
    "clocks.current.sm": ("MHz", lambda s, g, n: str(g.sm_clock_mhz)),
    "clocks.current.memory": ("MHz", lambda s, g, n: str(g.mem_clock_mhz)),
    "clocks.max.graphics": ("MHz", lambda s, g, n: _mhz(s.gpu.sm_clock_max_mhz)),
    "clocks.max.sm": ("MHz", lambda s, g, n: _mhz(s.gpu.sm_clock_max_mhz)),
    "clocks.max.memory": ("MHz", lambda s, g, n: _mhz(s.gpu.mem_clock_max_mhz)),
}
_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "temperature.gpu.current": "temperature.gpu",
}


def query_field(name: str) -> QueryField | None:
    """The field called ``name`` (or one of its aliases), or None if nvidia-smi has none."""
    name = _ALIASES.get(name, name)
    if name in _PLAIN:
        return QueryField(name, None, _PLAIN[name])
    if name in _WITH_UNIT:
        unit, getter = _WITH_UNIT[name]
        return QueryField(name, unit, getter)
    return None


class UsageError(Exception):
    """Bad arguments: message on stdout, exit status 2 (as nvidia-smi does)."""


@dataclass
class Options:
    query_gpu: list[str] | None = None
    query_apps: list[str] | None = None
    fmt: set[str] | None = None
    ids: list[str] | None = None
    loop_s: float | None = None
    query: bool = False
    xml: bool = False
    list_gpus: bool = False


def parse_args(argv: Sequence[str]) -> Options:
    opts = Options()
    args = list(argv)
    while args:
        name, eq, inline = args.pop(0).partition("=")
        value = _value_reader(args, inline if eq else None)
        if name == "--query-gpu":
            opts.query_gpu = [f.strip() for f in value().split(",") if f.strip()]
        elif name == "--query-compute-apps":
            opts.query_apps = [f.strip() for f in value().split(",") if f.strip()]
        elif name == "--format":
            opts.fmt = {f.strip() for f in value().split(",")}
        elif name in ("-i", "--id"):
            opts.ids = value().split(",")
        elif name in ("-l", "--loop"):
            opts.loop_s = _positive(value(), 1.0)
        elif name in ("-lms", "--loop-ms"):
            opts.loop_s = _positive(value(), 0.001)
        elif name in ("-q", "--query"):
            opts.query = True
        elif name in ("-x", "--xml-format"):
            opts.xml = True
        elif name in ("-L", "--list-gpus"):
            opts.list_gpus = True
        elif name in ("-d", "--display"):
            value()  # sections of -q: the stand-in always shows them all
        else:
            raise UsageError(INVALID_ARGS)
    if (opts.query_gpu or opts.query_apps) and (opts.fmt is None or "csv" not in opts.fmt):
        raise UsageError(INVALID_ARGS)
    if opts.fmt is not None and not opts.fmt <= {"csv", "noheader", "nounits"}:
        raise UsageError(INVALID_ARGS)
    return opts


def _value_reader(args: list[str], inline: str | None) -> Callable[[], str]:
    """The option's value: after ``=``, else the next argument."""

    def value() -> str:
        if inline is not None:
            return inline
        if not args:
            raise UsageError(INVALID_ARGS)
        return args.pop(0)

    return value


def _positive(text: str, scale: float) -> float:
    try:
        number = float(text)
    except ValueError as exc:
        raise UsageError(INVALID_ARGS) from exc
    if number <= 0:
        raise UsageError(INVALID_ARGS)
    return number * scale


def _select(gpus: list[GpuReading], ids: list[str] | None) -> list[GpuReading]:
    if ids is None:
        return gpus
    chosen = [g for g in gpus if any(i.strip() in (str(g.index), g.uuid, g.bus_id) for i in ids)]
    if not chosen:
        raise LookupError("No devices were found")
    return chosen


def na_fields(environ: Mapping[str, str]) -> frozenset[str]:
    """The fields the ``GPUBENCH_SANDBOX_SMI_NA`` knob reports as ``[N/A]``."""
    return frozenset(f.strip() for f in environ.get(NA_ENV, "").split(",") if f.strip())


def gpu_csv(
    spec: InstanceSpec,
    gpus: list[GpuReading],
    names: list[str],
    fmt: set[str],
    header: bool,
    na: frozenset[str] = frozenset(),
) -> str:
    """The CSV answer to ``--query-gpu`` (``na``: fields to report as ``[N/A]``)."""
    fields = []
    for name in names:
        found = query_field(name)
        if found is None or name in spec.gpu_tools.refused_fields:
            raise UsageError(f'Field "{name}" is not a valid field to query.\n')
        fields.append(found)
    units = "nounits" not in fmt
    lines = []
    if header and "noheader" not in fmt:
        lines.append(", ".join(f"{f.name} [{f.unit}]" if f.unit else f.name for f in fields))
    for gpu in gpus:
        cells = []
        for f in fields:
            if f.name in na:
                cells.append("[N/A]")
            else:
                text = f.value(spec, gpu, len(gpus))
                cells.append(f"{text} {f.unit}" if f.unit and units and not text.startswith("[") else text)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


_APP_FIELDS = {
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory", "MiB"),
    "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", None),
    "gpu_bus_id": ("gpu_bus_id", None),
    "gpu_name": ("gpu_name", None),
}


def apps_csv(gpus: list[GpuReading], names: list[str], fmt: set[str], header: bool) -> str:
    """The CSV answer to ``--query-compute-apps``."""
    for name in names:
        if name not in _APP_FIELDS:
            raise UsageError(f'Field "{name}" is not a valid field to query.\n')
    lines = []
    if header and "noheader" not in fmt:
        lines.append(
            ", ".join(
                f"{_APP_FIELDS[n][0]} [{_APP_FIELDS[n][1]}]" if _APP_FIELDS[n][1] else _APP_FIELDS[n][0] for n in names
            )
        )
    units = "nounits" not in fmt
    for gpu in gpus:
        for proc in gpu.processes:
            values = {
                "pid": str(proc.pid),
                "process_name": proc.name,
                "used_gpu_memory": f"{proc.used_mib}",
                "gpu_uuid": gpu.uuid,
                "gpu_bus_id": gpu.bus_id,
                "gpu_name": gpu.name,
            }
            cells = []
            for n in names:
                key, unit = _APP_FIELDS[n]
                cells.append(f"{values[key]} {unit}" if unit and units else values[key])
            lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def render(spec: InstanceSpec, opts: Options, first: bool, na: frozenset[str] = frozenset()) -> str:
    """One answer (one loop iteration) as text."""
    gpus = _select(read_gpus(spec), opts.ids)
    if opts.query_gpu is not None:
        return gpu_csv(spec, gpus, opts.query_gpu, opts.fmt or {"csv"}, header=first, na=na)
    if opts.query_apps is not None:
        return apps_csv(gpus, opts.query_apps, opts.fmt or {"csv"}, header=first)
    if opts.list_gpus:
        return render_list(gpus)
    if opts.xml and not spec.gpu_tools.xml_log:  # an old driver (the gpu_driver fault): no XML log
        raise UsageError(INVALID_ARGS)
    if opts.query or opts.xml:
        nodes = log_nodes(spec, gpus, set(na))
        return render_xml(nodes) if opts.xml else render_text(nodes)
    return render_table(spec, gpus)


def one_shot(argv: Sequence[str], environ: Mapping[str, str]) -> Answer | Options:
    """The whole answer to ``nvidia-smi argv`` in ``environ``, or, for a loop
    (``-l``/``-lms``), its parsed options: only a running process can answer that."""
    try:
        spec = load_instance_spec(environ)
    except RuntimeError as exc:
        return Answer(stderr=f"Error: {exc}\n", status=9)
    if environ.get(FAULT_ENV, "").strip() == "driver":
        return Answer(stdout=DRIVER_FAILURE + "\n", status=9)
    if spec.gpu.count == 0:
        return Answer(stdout="No devices were found\n", status=6)
    try:
        opts = parse_args(argv)
        if opts.loop_s is not None:
            return opts
        return Answer(stdout=render(spec, opts, True, na_fields(environ)))
    except UsageError as exc:
        return Answer(stdout=f"{exc}\n", status=2)
    except LookupError as exc:
        return Answer(stdout=f"{exc}\n", status=6)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``nvidia-smi`` with ``argv``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    answer = one_shot(args, os.environ)
    if isinstance(answer, Answer):
        return answer.emit()
    return _loop(load_instance_spec(), answer, na_fields(os.environ))


def _loop(spec: InstanceSpec, opts: Options, na: frozenset[str]) -> int:
    """Print an answer every ``opts.loop_s`` seconds until interrupted."""
    assert opts.loop_s is not None
    try:
        first = True
        due = time.monotonic()
        while True:
            sys.stdout.write(render(spec, opts, first, na))
            sys.stdout.flush()
            first = False
            # Absolute schedule: samples stay on the interval however long one takes.
            due += opts.loop_s
            time.sleep(max(0.0, due - time.monotonic()))
    except UsageError as exc:  # an unknown field shows when the first sample renders
        print(exc)
        return 2
    except LookupError as exc:
        print(exc)
        return 6
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
