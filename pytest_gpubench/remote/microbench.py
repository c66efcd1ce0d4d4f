"""GPU microbenchmarks on the instance: torch made importable, then the script run there.

:func:`ensure_torch` (stage ``runtime_setup``, installing the cell's "runtime") finds a
Python that imports torch: the instance's ``python3``, else a venv under
``~/.gpubench/torch-venv`` made earlier, else it makes that venv and ``pip install``\\ s
torch into it (``PIP_INDEX_URL``, ``PIP_FIND_LINKS`` and the like in the instance's
environment apply), all within the stage timeout. :func:`run_microbench` (stage
``benchmark``) sends ``microbench_script.py`` as that Python's stdin, as the load
generator is sent, and returns the JSON events it printed; ``measure/microbench.py``
turns them into figures.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..errors import RemoteCommandError, Stage, StageError
from .ssh import Connection

__all__ = ["MICROBENCH_SOURCE", "TORCH_VENV", "TorchPython", "ensure_torch", "run_microbench"]

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
    a failure or the timeout is a stage ``runtime_setup`` error naming what went wrong."""
    done = await conn.run(_ENSURE, stage=Stage.RUNTIME_SETUP, what="installing torch for the microbenchmarks",
                          timeout=timeout, check=False)
    for line in done.stdout.splitlines():
        marker, _, python = line.strip().partition(" ")
        if marker in (_FOUND, _INSTALLED) and python:
            return TorchPython(python=python, installed=marker == _INSTALLED)
    raise RemoteCommandError(Stage.RUNTIME_SETUP, "installing torch for the microbenchmarks (python3 -m venv "
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
