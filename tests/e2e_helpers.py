"""What the end-to-end tests share: pytest as a user runs it, the manifest it writes,
the sandbox's view of its sessions.

A plain module, not a test module: test modules import from here (or get fixtures
from ``conftest.py``), never from one another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import sqlite_utils
from polling import wait_for

from pytest_gpubench.sandbox.auth import CLIENT_TOKEN_ENV, TOKEN_ENV, bearer, new_token

REPO = Path(__file__).resolve().parents[1]
#: The bearer token of every sandbox this test process starts (issue 21 item 3: the sandbox's API
#: answers 401 without it). Set once, here, in this process's environment: the e2e fixtures'
#: sandboxes, a test's own ``SandboxThread`` and ``gpubench sandbox`` children all read
#: ``GPUBENCH_SANDBOX_TOKEN``; :func:`run_pytest` and :class:`PytestRun` hand it to pytest as
#: ``GPUBENCH_API_TOKEN``; :data:`SANDBOX_AUTH` is the header for a test's own requests.
SANDBOX_TOKEN = os.environ.setdefault(TOKEN_ENV, new_token())
#: ``headers=`` for a request to a test sandbox (``httpx.get(url, headers=SANDBOX_AUTH)``).
SANDBOX_AUTH = bearer(SANDBOX_TOKEN)


def pytest_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a pytest the tests start: this one without ``GPUBENCH_*`` settings,
    with the test sandboxes' token as ``GPUBENCH_API_TOKEN``, then ``extra_env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    return env | {CLIENT_TOKEN_ENV: SANDBOX_TOKEN} | (extra_env or {})


def sandbox_api(url: str, **options: Any) -> httpx.Client:
    """An HTTP client for the test sandbox at ``url`` (its token in every request)."""
    return httpx.Client(base_url=url, headers=SANDBOX_AUTH, **{"timeout": 30, **options})
QUICK = REPO / "matrix" / "gpubench_quick.yaml"
SEED = REPO / "matrix" / "gpubench_seed.yaml"
#: A small matrix of five cells (two GPUs, two providers, three models) for plugin tests
#: that collect, filter or hint and never rent.
DEMO_MATRIX = """
workload: {duration: 5s, max_tokens: 32}
matrix:
  - gpu: RTX 4090
    providers: [vastai, tensordock]
    models: [qwen2:7b, deepseek-r1:14b]
  - gpu: A100 80GB
    provider: vastai
    model: deepseek-r1:32b
"""
#: Sandbox session states that still hold (or will hold) an instance.
ACTIVE = {"pending", "provisioning", "running", "stopping"}


def run_pytest(tmp_path: Path, *args: str, timeout: float = 600,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pytest ARGS`` in the repository, recording into ``tmp_path/reports``; the environment is
    :func:`pytest_env` (this one without ``GPUBENCH_*`` settings, the sandboxes' token), plus ``extra_env``."""
    env = pytest_env(extra_env)
    # The reports folder's manifest, unless the test names its own store.
    given = any(arg.split("=")[0] == "--gpubench-store" for arg in args)
    store = [] if given else ["--gpubench-store", str(tmp_path / "reports" / "manifest.db")]
    command = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider",
               "--gpubench-reports", str(tmp_path / "reports"), *store]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def manifest_rows(tmp_path: Path) -> list[dict]:
    """The cells :func:`run_pytest` recorded."""
    return list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["benchmark_manifest"].rows)


def only_result(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The result and details JSON of the one cell :func:`run_pytest` recorded."""
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    return json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])


#: ``python -c`` this, then the real arguments: SIGINT back to its default, then exec Python with them.
RESTORE_SIGINT_AND_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                           "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


class PytestRun:
    """``pytest`` as a user runs it, in its own process group, against a standalone sandbox."""

    def __init__(self, tmp_path: Path, url: str, *args: str, name: str = "run", target: Path = QUICK,
                 cache: bool = False) -> None:
        self.reports = tmp_path / "reports"
        self.manifest = self.reports / "manifest.db"
        self.url = url
        self.output = tmp_path / f"{name}.out"
        env = pytest_env()
        # A run that hangs is sent SIGABRT by finish(): every thread's stack then lands in the output.
        env["PYTHONFAULTHANDLER"] = "1"
        cache_args = ["-o", f"cache_dir={tmp_path / 'cache'}"] if cache else ["-p", "no:cacheprovider"]
        # Ctrl-C as a terminal delivers it, whatever this process inherited: a shell running CI in the
        # background starts it with SIGINT ignored, and an ignored signal stays ignored across exec.
        command = [sys.executable, "-c", RESTORE_SIGINT_AND_EXEC, "-m", "pytest", str(target), *cache_args,
                   "--gpubench-api", url,
                   "--gpubench-time-scale", "0.02", "--gpubench-progress-interval", "0.5",
                   "--gpubench-reports", str(self.reports), "--gpubench-store", str(self.manifest), *args]
        with open(self.output, "w") as out:
            # A session of its own: a terminal's Ctrl-C reaches the whole group, as killpg does here.
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            text=True, start_new_session=True)

    def finish(self, timeout: float = 300) -> str:
        """Wait for the run to end; one still running after ``timeout`` fails the test with its
        threads' stacks (faulthandler on SIGABRT) and its output's tail."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
            raise AssertionError(f"pytest still running after {timeout:g} s; its output ends:\n"
                                 f"{self.output.read_text()[-6000:]}") from None
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        return self.output.read_text()

    def measuring(self, cells: int = 1, timeout: float = 180) -> list[Path]:
        """Wait until ``cells`` cells are in the benchmark stage (their progress files say so)."""

        def ready() -> list[Path]:
            assert self.process.poll() is None, self.output.read_text()[-3000:]
            logs = [p for p in self.reports.glob("progress/*/*.log") if "PROGRESS: requests=" in p.read_text()]
            return logs if len(logs) >= cells else []

        return wait_for(ready, timeout, f"{cells} cell(s) to be measuring")

    def rows(self) -> list[dict[str, Any]]:
        return list(sqlite_utils.Database(self.manifest)["benchmark_manifest"].rows)

    def run_row(self) -> dict[str, Any]:
        (row,) = list(sqlite_utils.Database(self.manifest)["runs"].rows)
        return row


def session_processes(session_id: str) -> list[str]:
    """Command lines of the live processes of one sandbox session: those whose environment names its
    instance (``GPUBENCH_SANDBOX_INSTANCE``, a path holding the session id), so that processes of
    tests running beside it in other workers never count as its leftovers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ, cmdline = (entry / "environ").read_bytes(), (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if any(item.startswith(b"GPUBENCH_SANDBOX_INSTANCE=") and session_id.encode() in item
               for item in environ.split(b"\0")):
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return found


def sandbox_sessions(url: str) -> list[dict]:
    """Every session the sandbox at ``url`` knows, whatever its state."""
    return httpx.get(f"{url}/sandbox/state", headers=SANDBOX_AUTH).json()["sessions"]


#: An RTX 4090 offer the sandbox catalog always has.
RENTABLE_OFFER = "vastai-18430201"


def rent(api: httpx.Client, consumer: str) -> str:
    """A running sandbox session for ``consumer``; returns its id."""
    answer = api.post("/api/v1/sessions", json={"consumer_id": consumer, "offer_id": RENTABLE_OFFER,
                                                "workload_type": "interactive", "reservation_hours": 1})
    assert answer.status_code == 201, answer.text
    session_id = answer.json()["session"]["id"]
    wait_for(lambda: session_status(api, session_id) == "running", 60, f"session {session_id} to run")
    return session_id


def session_status(api: httpx.Client, session_id: str) -> str:
    """A sandbox session's status, as the API reports it."""
    return api.get(f"/api/v1/sessions/{session_id}").json()["status"]


def active_sessions(url: str) -> list[dict[str, Any]]:
    """The sandbox's sessions that still hold an instance."""
    return [s for s in sandbox_sessions(url) if s["status"] in ACTIVE]


def assert_every_session_released(url: str, create_refused: int = 0) -> None:
    """Every session that got an instance ended ``stopped``; those the provider refused at
    create never had one (the server keeps them ``failed``, with no id for the client)."""
    sessions = sandbox_sessions(url)
    refused = [s for s in sessions if s["status"] == "failed"]
    assert len(refused) == create_refused, sessions
    assert all(s["error"].startswith("provider create failed") and not s.get("ssh_host") for s in refused)
    assert all(s["status"] == "stopped" for s in sessions if s not in refused), sessions


def assert_fails_at_install_without(tmp_path: Path, url: str, tool: str, matrix_text: str, message: str) -> None:
    """A one-cell matrix (``model: 'qwen2:1.5b'}`` in its row) run on the cheapest RTX 4090 offer,
    whose instances lack ``tool``: the cell fails at ``runtime_setup`` with ``message``, and every
    session is released."""
    httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
               json={"fault": "missing_tools", "offer_id": "vastai-18430205", "tools": [tool]}).raise_for_status()
    matrix = tmp_path / f"gpubench_without_{tool}.yaml"
    matrix.write_text(matrix_text.replace("model: 'qwen2:1.5b'}", "model: 'qwen2:1.5b', offer: {max_price: 0.115}}"))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "runtime_setup"), row
    assert message in row["error_message"]
    assert_every_session_released(url)
