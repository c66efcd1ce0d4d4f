"""What the bench scripts share: a standalone sandbox, as a user starts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_sandbox(time_scale: float) -> tuple[subprocess.Popen[str], str]:
    """``gpubench sandbox`` on a free port; returns the process and its URL (it ends with its stdin)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--port", "0", "--time-scale", str(time_scale),
         "--exit-with-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )
    line = process.stdout.readline()
    if not line.startswith("GPUBENCH_SANDBOX_URL="):
        raise SystemExit(f"the sandbox did not start: {line!r}")
    return process, line.split("=", 1)[1].strip()
