"""What the bench scripts share: a standalone sandbox, as a user starts it, and its token.

The sandbox's API needs a bearer token (issue 21 item 3): every sandbox these scripts
start takes :data:`SANDBOX_TOKEN` (``GPUBENCH_SANDBOX_TOKEN`` in this process's
environment, set once here); send :data:`SANDBOX_AUTH` with a script's own requests and
run pytest with :func:`pytest_env` (it carries the token as ``GPUBENCH_API_TOKEN``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, also without pip install
    sys.path.insert(0, str(REPO))

from pytest_gpubench.sandbox.auth import CLIENT_TOKEN_ENV, TOKEN_ENV, bearer, new_token, token_from_line  # noqa: E402
from pytest_gpubench.store.progress import read_progress  # noqa: E402

#: The token of every sandbox this script starts (never printed or written by the scripts).
SANDBOX_TOKEN = os.environ.setdefault(TOKEN_ENV, new_token())
#: ``headers=`` for a script's own requests to its sandbox.
SANDBOX_AUTH = bearer(SANDBOX_TOKEN)


def pytest_env() -> dict[str, str]:
    """The environment of a pytest run against the sandbox: this one without ``GPUBENCH_*``
    settings, this checkout's plugin first on ``PYTHONPATH``, the sandbox's token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # also without pip install
    env[CLIENT_TOKEN_ENV] = SANDBOX_TOKEN
    return env


def start_sandbox(time_scale: float) -> tuple[subprocess.Popen[str], str]:
    """``gpubench sandbox`` on a free port; returns the process and its URL (it ends with its stdin).
    Its API needs :data:`SANDBOX_TOKEN`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--port", "0", "--time-scale", str(time_scale),
         "--exit-with-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )
    line = process.stdout.readline()
    if not line.startswith("GPUBENCH_SANDBOX_URL="):
        raise SystemExit(f"the sandbox did not start: {line!r}")
    if token_from_line(process.stdout.readline()) != SANDBOX_TOKEN:
        raise SystemExit("the sandbox did not take GPUBENCH_SANDBOX_TOKEN as its token")
    return process, line.split("=", 1)[1].strip()


# ------------------------------------------------------------- controllers (bench/scale.py, bench/soak.py)


def pytest_command(matrices: list[Path], url: str, work: Path, time_scale: float, reports: Path,
                   *options: str) -> list[str]:
    """``pytest`` on the matrix files against the sandbox at ``url``, reports under ``reports``."""
    return [sys.executable, "-m", "pytest", *map(str, matrices), "-q", "-p", "no:cacheprovider",
            "--rootdir", str(work), "--gpubench-api", url, "--gpubench-time-scale", str(time_scale),
            "--gpubench-live", "false", "--gpubench-reports", str(reports), *options]




def start_controller(command: list[str], work: Path, out: Path) -> subprocess.Popen[str]:
    """Start one controller (its output to ``out``) in its own process group, so that
    :func:`kill_controller` takes its xdist workers down with it, as a crashed machine would."""
    handle = open(out, "a")  # noqa: SIM115 - the child holds it; closed with the process
    try:
        return subprocess.Popen(command, cwd=work, env=pytest_env(), stdout=handle, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    finally:
        handle.close()


def kill_controller(process: subprocess.Popen[str]) -> None:
    """SIGKILL a controller and every process of its group (a controller started here), and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def executions(progress_files: Iterable[Path], rows: list[Any]) -> tuple[Counter[str], Counter[str]]:
    """How many times each cell (by cell id) was started, and how many of those starts ended:
    its ``STARTING`` lines in every controller's progress files, and its outcome lines (a
    ``STATUS`` of :data:`FINAL_LINES`). A start without an
    end is a controller killed while running it. (``rows``: the store's cells, to map a
    progress file's name to its cell id.)"""
    started: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    for path in progress_files:
        for line in read_progress(path):
            if line.kind == "STATUS" and line.label == "STARTING":
                started[path.stem] += 1
            elif line.kind == "STATUS" and line.label in FINAL_LINES and line.fields.get("reason") != "claim_lost":
                ended[path.stem] += 1
    by_file = {Path(row.progress_file).stem: row.cell_id for row in rows if row.progress_file}
    return (Counter({by_file.get(stem, stem): n for stem, n in started.items()}),
            Counter({by_file.get(stem, stem): n for stem, n in ended.items()}))


#: The progress file's last ``STATUS`` of a cell whose outcome was written (run/record.py ``finish``;
#: a ``FAILED`` with ``reason=claim_lost`` is no outcome and is not counted).
FINAL_LINES = frozenset({"COMPLETED", "FAILED", "SKIPPED", "PARTIAL"})


class PeakMemory(threading.Thread):
    """The peak resident memory (``VmHWM`` in ``/proc/PID/status``, KiB) of a process and,
    separately, the largest of its descendants (xdist workers), polled until it ends.
    Linux only; elsewhere every figure stays 0."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.controller_kib = 0
        self.worker_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        self.controller_kib = max(self.controller_kib, _hwm_kib(self.pid))
        for child in _descendants(self.pid):
            self.worker_kib = max(self.worker_kib, _hwm_kib(child))


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children") if Path(f"/proc/{parent}").exists() else []:
            try:
                children = [int(c) for c in task.read_text().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found
