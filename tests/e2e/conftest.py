"""The e2e tier's sandboxes, one of each kind per pytest process (per xdist worker),
reset instead of started anew: ``POST /sandbox/reset`` (or :meth:`SandboxThread.reset`)
stops every instance and returns the sandbox to its fresh state in milliseconds, where
starting one took a Python process or an event loop with its API and SSH keys.

- ``sandbox``/``api``: the in-process sandbox, reset for each test module to the
  module's ``TIME_SCALE`` (default 0.01: a 5-minute wait takes 3 s) and its
  ``SANDBOX_CATALOG`` (default: the shipped catalog);
- ``standalone_sandbox``: ``gpubench sandbox`` as a user starts it (time scale 0.02),
  reset before each test that uses it.

Every sandbox here needs the test process's token (``e2e_helpers.SANDBOX_TOKEN``, issue 21
item 3): ``api`` sends it; with ``standalone_sandbox``'s URL, send ``headers=SANDBOX_AUTH``
(or use ``sandbox_api(url)``); ``run_pytest``/``PytestRun`` hand it to pytest, and every test
has it as ``GPUBENCH_API_TOKEN`` for the commands it runs in this process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from e2e_helpers import SANDBOX_AUTH, SANDBOX_TOKEN, sandbox_api
from pytest_gpubench.sandbox import SandboxThread
from pytest_gpubench.sandbox.auth import token_from_line

DEFAULT_TIME_SCALE = 0.01
STANDALONE_TIME_SCALE = 0.02


@pytest.fixture(autouse=True)
def _sandbox_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test sandboxes' token as ``GPUBENCH_API_TOKEN`` here too: the ``gpubench`` commands and
    plans a test runs in this process send it, as they would a user's."""
    monkeypatch.setenv("GPUBENCH_API_TOKEN", SANDBOX_TOKEN)


@pytest.fixture(scope="session")
def shared_sandbox() -> Iterator[SandboxThread]:
    """The in-process sandbox every module of this process shares (through :func:`sandbox`)."""
    with SandboxThread(time_scale=DEFAULT_TIME_SCALE, token=SANDBOX_TOKEN) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(request: pytest.FixtureRequest, shared_sandbox: SandboxThread) -> Iterator[SandboxThread]:
    """A fresh in-process sandbox for this module's tests, at the module's ``TIME_SCALE``
    with its ``SANDBOX_CATALOG``; reset again when the module is done, so that no
    instance of it keeps running under the next module's tests."""
    shared_sandbox.reset(time_scale=getattr(request.module, "TIME_SCALE", DEFAULT_TIME_SCALE),
                         catalog=getattr(request.module, "SANDBOX_CATALOG", None))
    yield shared_sandbox
    shared_sandbox.reset()


@pytest.fixture(scope="module")
def api(sandbox: SandboxThread) -> Iterator[httpx.Client]:
    """An HTTP client for :func:`sandbox`."""
    with sandbox_api(sandbox.url) as client:
        yield client


class StandaloneSandbox:
    """``gpubench sandbox`` in a process of its own, its log (standard error) kept in a file."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.start()

    def start(self) -> None:
        with self.log.open("w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--port", "0", "--time-scale",
                 str(STANDALONE_TIME_SCALE), "--exit-with-stdin"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            )
        line = self.process.stdout.readline()
        assert line.startswith("GPUBENCH_SANDBOX_URL="), line + self.log_tail()
        # Its token: the environment's GPUBENCH_SANDBOX_TOKEN, set by e2e_helpers for this process.
        assert token_from_line(self.process.stdout.readline()) == SANDBOX_TOKEN
        self.url = line.split("=", 1)[1].strip()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def restart_if_dead(self) -> str | None:
        """If the sandbox died under an earlier test, start another (the tests after this one go on)
        and say how the dead one ended: its exit status and the end of its log."""
        code = self.process.poll()
        if code is None:
            return None
        ended = f"the standalone sandbox exited with {code}; its log ends:\n{self.log_tail()}"
        self.log = self.log.with_name(f"{self.log.stem}-again.log")
        self.start()
        return ended

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


@pytest.fixture(scope="session")
def shared_standalone_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneSandbox]:
    """``gpubench sandbox`` as a user starts it, on a free port, for this whole process."""
    running = StandaloneSandbox(tmp_path_factory.mktemp("standalone-sandbox") / "sandbox.log")
    yield running
    running.stop()


@pytest.fixture
def standalone_sandbox(shared_standalone_sandbox: StandaloneSandbox) -> str:
    """The standalone sandbox (time scale 0.02), fresh for this test; yields its URL."""
    ended = shared_standalone_sandbox.restart_if_dead()
    if ended:
        pytest.fail(ended)  # this test fails, with the reason; a new sandbox serves the next
    answer = httpx.post(f"{shared_standalone_sandbox.url}/sandbox/reset", headers=SANDBOX_AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    return shared_standalone_sandbox.url
