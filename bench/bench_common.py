"""What the bench scripts share: a standalone sandbox, as a user starts it, and its token.

The sandbox's API needs a bearer token (issue 21 item 3): every sandbox these scripts
start takes :data:`SANDBOX_TOKEN` (``GPUBENCH_SANDBOX_TOKEN`` in this process's
environment, set once here); send :data:`SANDBOX_AUTH` with a script's own requests and
run pytest with :func:`pytest_env` (it carries the token as ``GPUBENCH_API_TOKEN``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, also without pip install
    sys.path.insert(0, str(REPO))

from pytest_gpubench.sandbox.auth import CLIENT_TOKEN_ENV, TOKEN_ENV, bearer, new_token, token_from_line  # noqa: E402
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
