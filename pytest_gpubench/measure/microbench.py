"""GPU microbenchmarks: the script run on the instance, its events as statistics, and their % of peak.

:func:`ensure_torch` (stage ``ollama_install``, installing the cell's "runtime") finds a
Python that imports torch: the instance's ``python3``, else a venv under
``~/.gpubench/torch-venv`` made earlier, else it makes that venv and ``pip install``\\ s
torch into it (``PIP_INDEX_URL``, ``PIP_FIND_LINKS`` and the like in the instance's
environment apply), all within the stage timeout. :func:`run_microbench` (stage
``benchmark``) sends ``remote/microbench_script.py`` as that Python's stdin, as the load
generator is sent, and returns the JSON events it printed.

:func:`figures_from_events` turns them into figures:
each ``figure`` event (one value per timed run) becomes a :class:`MicrobenchFigure` with
the runs' :class:`~.results.RunStatistics` (mean, sample std, CV, Tukey outliers, bootstrap
CI), and each ``skipped`` event a figure without statistics but with its reason. The
figure a report shows is the mean of the runs; its % of peak uses :mod:`.gpu_peaks`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..errors import RemoteCommandError, Stage, StageError
from .gpu_peaks import peaks_for, percent_of_peak
from .results import RunStatistics

if TYPE_CHECKING:  # only annotations: the store reads MicrobenchRun and must not load asyncssh
    from ..remote.ssh import Connection

__all__ = ["MICROBENCH_SOURCE", "TORCH_VENV", "MicrobenchFigure", "MicrobenchRun", "TorchPython", "ensure_torch",
           "figures_from_events", "run_microbench"]

UNITS = {"memory_bandwidth": "GB/s", "matmul": "TFLOPS"}


class MicrobenchFigure(BaseModel):
    """One measured figure of a GPU (memory bandwidth, or matmul throughput at a precision)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    #: The matmul's precision (``fp16``...); None for memory bandwidth.
    precision: str | None = None
    unit: str
    #: The timed runs' statistics; None when the figure was skipped.
    stats: RunStatistics | None = None
    #: Why it was not measured (the GPU's compute capability, or what torch said).
    skipped: str | None = None

    @property
    def label(self) -> str:
        """``memory_bandwidth`` or ``matmul_fp16``: the figure's name in reports and the store."""
        return self.kind if self.precision is None else f"{self.kind}_{self.precision}"

    @property
    def value(self) -> float | None:
        """The figure: the mean over the timed runs (None when skipped)."""
        return self.stats.mean if self.stats is not None else None

    def percent_of_peak(self, gpu: str) -> float | None:
        """The mean as a % of ``gpu``'s datasheet peak (:mod:`.gpu_peaks`); None if no peak is known."""
        peaks = peaks_for(gpu)
        return percent_of_peak(self.value, peaks.peak(self.kind, self.precision) if peaks else None)


class MicrobenchRun(BaseModel):
    """Everything one microbenchmark cell measured, and on what."""

    model_config = ConfigDict(frozen=True)

    device: str = ""
    capability: str = ""
    torch_version: str = ""
    #: ``CUDA_VISIBLE_DEVICES`` the script ran with (the leased GPU on a shared machine); "": every GPU.
    visible_devices: str = ""
    figures: tuple[MicrobenchFigure, ...] = ()


def figures_from_events(events: list[dict[str, Any]]) -> MicrobenchRun:
    """The script's events as a :class:`MicrobenchRun` (figures in the order measured).

    A ``figure`` event without a single finite value is kept as skipped, with that said,
    rather than averaged as 0.
    """
    device: dict[str, Any] = next((e for e in events if e.get("event") == "device"), {})
    figures = []
    for event in events:
        kind, precision = event.get("kind"), event.get("precision")
        if event.get("event") == "skipped":
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=UNITS.get(kind, ""),
                                            skipped=str(event.get("reason") or "not measured")))
        elif event.get("event") == "figure":
            unit = str(event.get("unit") or UNITS.get(kind, ""))
            try:
                stats = RunStatistics.from_values(event.get("values") or [])
            except ValueError as exc:
                figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit,
                                                skipped=f"no usable run: {exc}"))
                continue
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit, stats=stats))
    capability = device.get("capability") or []
    return MicrobenchRun(device=str(device.get("name") or ""),
                         capability=".".join(str(part) for part in capability),
                         torch_version=str(device.get("torch") or ""),
                         visible_devices=str(device.get("visible_devices") or ""), figures=tuple(figures))


# ------------------------------------ on the instance: torch, then the script

MICROBENCH_SOURCE = resources.files("pytest_gpubench.remote").joinpath("microbench_script.py").read_text()
#: Where torch is installed when the instance's Python has none (relative to the login's HOME).
TORCH_VENV = ".gpubench/torch-venv"
_FOUND, _INSTALLED = "gpubench-torch", "gpubench-torch-installed"

# Each branch prints the marker and the Python to use; pip's chatter goes to stderr.
_ENSURE = f"""\
if python3 -c 'import torch' >/dev/null 2>&1; then echo "{_FOUND} $(command -v python3)"; exit 0; fi
venv="$HOME/{TORCH_VENV}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "{_FOUND} $venv/bin/python"; exit 0
fi
command -v python3 >/dev/null 2>&1 || {{ echo "no python3 on the instance: cannot install torch" >&2; exit 4; }}
mkdir -p "$HOME/.gpubench"
python3 -m venv "$venv" >&2 || {{
  echo "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 5; }}
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch >&2 || exit 6
"$venv/bin/python" -c 'import torch' >&2 || exit 7
echo "{_INSTALLED} $venv/bin/python"
"""


@dataclass(frozen=True)
class TorchPython:
    """The instance's Python that imports torch, and whether torch was installed just now."""

    python: str
    installed: bool


async def ensure_torch(conn: Connection, timeout: float) -> TorchPython:
    """A Python on the instance that imports torch, installing it into a venv when needed;
    a failure or the timeout is a stage ``ollama_install`` error naming what went wrong."""
    done = await conn.run(_ENSURE, stage=Stage.OLLAMA_INSTALL, what="installing torch for the microbenchmarks",
                          timeout=timeout, check=False)
    for line in done.stdout.splitlines():
        marker, _, python = line.strip().partition(" ")
        if marker in (_FOUND, _INSTALLED) and python:
            return TorchPython(python=python, installed=marker == _INSTALLED)
    raise RemoteCommandError(Stage.OLLAMA_INSTALL, "installing torch for the microbenchmarks (python3 -m venv "
                             f"~/{TORCH_VENV} && pip install torch)", done.exit_status, done.stderr or done.stdout)


async def run_microbench(conn: Connection, python: str, plan: dict[str, Any], timeout: float, *,
                        env_prefix: str = "") -> list[dict[str, Any]]:
    """Run the microbenchmark script with ``python`` on ``plan``; its events, in order.

    ``env_prefix`` goes before the command: ``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 `` where the
    cell leased GPU 1 (``runtimes/gpus.GpuPlacement.shell_prefix``), so the script's ``cuda:0`` is that GPU.

    A script that reports an error, or ends without its ``done`` event, is a stage
    ``benchmark`` error with its message or stderr's tail.
    """
    command = f"{env_prefix}{shlex.quote(python)} - {shlex.quote(json.dumps(plan))}"
    done = await conn.run(command, stage=Stage.BENCHMARK, what="the GPU microbenchmarks", timeout=timeout,
                          stdin=MICROBENCH_SOURCE, check=False)
    events = []
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a library's own print: not ours
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    failed = next((e for e in events if e["event"] == "error"), None)
    if failed is not None:
        raise StageError(Stage.BENCHMARK, f"the GPU microbenchmarks could not run: {failed.get('message')}")
    if not any(e["event"] == "done" for e in events):
        raise RemoteCommandError(Stage.BENCHMARK, "the GPU microbenchmarks", done.exit_status,
                                 done.stderr or done.stdout)
    return events
