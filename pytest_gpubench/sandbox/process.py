"""Start and stop the sandbox cloud as a child process for one pytest run.

A child process, not a thread: its SSH servers and token streams must not
compete with the tests for this interpreter's GIL, and ``gpubench sandbox``
runs exactly the same program standalone.

The sandbox's API needs a bearer token (``sandbox/auth.py``): drawn here, handed to
the child in its environment (never its command line, which ``ps`` shows every
user), and to the run as its ``api_token``; it is never written to the sandbox's log.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from ..errors import UsageProblem
from ..settings import Settings
from .auth import TOKEN_ENV, bearer, new_token

URL_PREFIX = "GPUBENCH_SANDBOX_URL="
START_TIMEOUT = 60.0


class SandboxProcess:
    """A running ``python -m pytest_gpubench.sandbox``, its URL and the token its API needs."""

    def __init__(self, process: subprocess.Popen[str], url: str, log_path: Path, token: str) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path
        self.token = token

    def __repr__(self) -> str:  # never the token
        return f"SandboxProcess(pid={self.process.pid}, url={self.url!r})"

    @classmethod
    def start(cls, settings: Settings) -> SandboxProcess:
        settings.reports.mkdir(parents=True, exist_ok=True)
        log_path = settings.reports / "sandbox.log"
        command = [sys.executable, "-m", "pytest_gpubench.sandbox", "--port", "0",
                   "--time-scale", repr(settings.time_scale), "--exit-with-stdin",
                   "--ssh-server", settings.sandbox_ssh]
        if settings.sandbox_catalog:
            command += ["--catalog", settings.sandbox_catalog]
        token = new_token()
        log = open(log_path, "w")  # noqa: SIM115 - the child keeps writing to it
        # stdin is a pipe nobody writes: when this process dies, however it dies,
        # the pipe closes and the sandbox stops its sessions and exits.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                   stdin=subprocess.PIPE, start_new_session=True,
                                   env={**os.environ, TOKEN_ENV: token})
        log.close()
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
        try:
            while True:
                line = lines.get(timeout=START_TIMEOUT)
                if line.startswith(URL_PREFIX):
                    return cls(process, line[len(URL_PREFIX):].strip(), log_path, token)
                if line == "":
                    break
        except queue.Empty:
            pass
        process.kill()
        tail = log_path.read_text(errors="replace")[-800:] if log_path.exists() else ""
        raise UsageProblem(f"the gpubench sandbox did not start (see {log_path}): {tail.strip()}")

    def running_sessions(self) -> list[str]:
        """Ids of sandbox sessions that are still active (should be none at the end)."""
        try:
            state = httpx.get(f"{self.url}/sandbox/state", headers=bearer(self.token), timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return []
        return [s["id"] for s in state.get("sessions", [])
                if s.get("status") in ("pending", "provisioning", "running", "stopping")]

    def stop(self) -> None:
        """SIGTERM: the sandbox stops its sessions and instance processes, then exits."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put("")
