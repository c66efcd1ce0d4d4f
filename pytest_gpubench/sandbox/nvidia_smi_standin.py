"""The ``nvidia-smi`` program of a sandbox instance.

Run as ``python -m pytest_gpubench.sandbox.nvidia_smi_standin ARGS``. It reads the
instance from ``GPUBENCH_SANDBOX_INSTANCE`` and the Ollama stand-in's runtime state
(see ``gpu_readings``), and answers like the real tool:

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
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .gpu_readings import GpuReading, read_gpus
from .instance_spec import InstanceSpec, load_instance_spec
from .nvidia_smi_render import log_nodes, render_list, render_table, render_text, render_xml
from .standin_answer import Answer

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
