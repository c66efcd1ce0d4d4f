"""Fixtures shared by the tests: the emulated GPU Shopper in-process (one per test module)
or standalone, as a user starts it. Shared helpers live in plain modules (e2e_helpers.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from pytest_gpubench.sandbox import SandboxThread

DEFAULT_TIME_SCALE = 0.01


@pytest.fixture(scope="module")
def sandbox(request: pytest.FixtureRequest) -> Iterator[SandboxThread]:
    """A sandbox on a free loopback port for this module's tests, at the module's
    ``TIME_SCALE`` (default 0.01: a 5-minute wait takes 3 s), with its ``SANDBOX_CATALOG``
    (default: the shipped catalog)."""
    with SandboxThread(time_scale=getattr(request.module, "TIME_SCALE", DEFAULT_TIME_SCALE),
                       catalog=getattr(request.module, "SANDBOX_CATALOG", None)) as running:
        yield running


@pytest.fixture(scope="module")
def api(sandbox: SandboxThread) -> Iterator[httpx.Client]:
    """An HTTP client for :func:`sandbox`."""
    with httpx.Client(base_url=sandbox.url, timeout=30) as client:
        yield client


@pytest.fixture
def standalone_sandbox() -> Iterator[str]:
    """``gpubench sandbox`` as a user starts it, on a free port; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--port", "0", "--time-scale", "0.02",
         "--exit-with-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("GPUBENCH_SANDBOX_URL="), line
    yield line.split("=", 1)[1].strip()
    process.terminate()
    process.wait(30)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): an API that never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
