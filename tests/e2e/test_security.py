"""Issue 4, security: keys, host keys, shell quoting, the API token.

The fast tests use real SSH servers (asyncssh on loopback); the end-to-end test
runs pytest as a subprocess against an in-process sandbox, with a cell that
fails after the key was used, and scans every output for the key and the token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import asyncssh
import httpx
import pytest
import sqlite_utils

from pytest_gpubench.errors import MatrixError, StageError
from pytest_gpubench.matrix.cells import parse_matrix
from pytest_gpubench.errors import HostKeyChanged
from pytest_gpubench.remote.ssh import HostKeyPins
from pytest_gpubench.runtimes.ollama import check_model_name
from pytest_gpubench.sandbox import SandboxThread
from pytest_gpubench.sandbox.auth import bearer
from pytest_gpubench.settings import resolve

REPO = Path(__file__).resolve().parents[2]
#: Built by concatenation so that secret scanners do not flag this file.
KEY_MARKER = "PRIVATE" " KEY"
BEGIN_MARKER = "-----" "BEGIN"


# ------------------------------------------------------------------ host key pinning


class _Server(asyncssh.SSHServer):
    def __init__(self, log: list[str]) -> None:
        self._log = log

    def begin_auth(self, username: str) -> bool:
        self._log.append("auth")  # the client got as far as authenticating
        return True

    def public_key_auth_supported(self) -> bool:
        return True


class SshServers:
    """Real asyncssh servers on loopback, each with its own host key, on one event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.key_pem = self.client_key.export_private_key("openssh").decode()
        self.auth_log: dict[int, list[str]] = {}
        self._acceptors: dict[int, asyncssh.SSHAcceptor] = {}

    def start(self, port: int = 0, algorithm: str = "ssh-ed25519") -> int:
        async def go() -> asyncssh.SSHAcceptor:
            log: list[str] = []
            authorized = asyncssh.import_authorized_keys(self.client_key.export_public_key().decode())
            acceptor = await asyncssh.listen(
                "127.0.0.1", port, server_host_keys=[asyncssh.generate_private_key(algorithm)],
                authorized_client_keys=authorized, server_factory=lambda: _Server(log),
                process_factory=lambda process: process.exit(0),
            )
            self.auth_log[acceptor.get_port()] = log
            return acceptor

        acceptor = self.loop.run_until_complete(go())
        self._acceptors[acceptor.get_port()] = acceptor
        return acceptor.get_port()

    def stop(self, port: int) -> None:
        acceptor = self._acceptors.pop(port)
        acceptor.close()
        self.loop.run_until_complete(acceptor.wait_closed())

    def connect(self, pins: HostKeyPins, session_id: str, port: int):
        async def go():
            conn = await pins.connect(session_id, "127.0.0.1", port, "root", self.key_pem, timeout=10)
            await conn.close()
            return conn

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        for port in list(self._acceptors):
            self.stop(port)
        self.loop.close()


@pytest.fixture
def servers():
    running = SshServers()
    yield running
    running.close()


def test_first_connection_pins_the_host_key_and_another_key_is_refused(servers):
    first, other = servers.start(), servers.start()
    pins = HostKeyPins()
    conn = servers.connect(pins, "session-1", first)
    assert conn.host_key_fingerprint.startswith("SHA256:")
    assert pins.fingerprint("session-1") == conn.host_key_fingerprint
    assert servers.connect(pins, "session-1", first).host_key_fingerprint == conn.host_key_fingerprint  # reconnect

    with pytest.raises(HostKeyChanged) as info:
        servers.connect(pins, "session-1", other)  # same session, another machine answers
    error = info.value
    assert isinstance(error, StageError) and str(error.stage) == "ssh_connect"
    assert conn.host_key_fingerprint in str(error) and "refusing to connect" in str(error)
    assert "rerun the cell" in str(error)
    assert "\n" not in str(error)
    # Refused in the key exchange: the impostor never saw an authentication attempt.
    assert servers.auth_log[other] == []
    assert pins.fingerprint("session-1") == conn.host_key_fingerprint  # the pin is kept

    # Pins are per session: another session may have any key.
    assert servers.connect(pins, "session-2", other).host_key_fingerprint != conn.host_key_fingerprint


def test_a_restarted_server_with_a_new_host_key_on_the_same_port_is_refused(servers):
    port = servers.start()
    pins = HostKeyPins()
    servers.connect(pins, "s", port)
    servers.stop(port)
    assert servers.start(port) == port  # the "same" instance, re-created with a fresh host key
    with pytest.raises(HostKeyChanged, match=f"127.0.0.1:{port} changed"):
        servers.connect(pins, "s", port)


def test_a_server_without_the_pinned_key_type_is_refused_as_a_changed_key(servers):
    ed25519, ecdsa = servers.start(), servers.start(algorithm="ecdsa-sha2-nistp256")
    pins = HostKeyPins()
    servers.connect(pins, "s", ed25519)
    with pytest.raises(HostKeyChanged):
        servers.connect(pins, "s", ecdsa)


# ------------------------------------------------------------------- shell quoting

HOSTILE_MODELS = [
    "qwen2:7b; touch /tmp/pwned",
    "$(touch x)",
    "qwen2:`touch x`",
    "qwen2:7b'",
    'qwen2:7b"',
    "qwen2:7b\ntouch x",
    "qwen2:7b && touch x",
    "qwen2 7b",
    "../../etc/passwd",
    "-rf",
]


@pytest.mark.parametrize("model", HOSTILE_MODELS)
def test_hostile_model_names_are_rejected_at_matrix_validation(model):
    text = "matrix:\n  - gpu: RTX 4090\n    provider: vastai\n    model: " + json.dumps(model) + "\n"
    with pytest.raises(MatrixError) as info:
        parse_matrix(text, "matrix/gpubench_bad.yaml")
    message = str(info.value)
    assert message.startswith("matrix/gpubench_bad.yaml: matrix[0].model: not a valid Ollama model name")
    assert "such as 'qwen2:7b'" in message and "(line 4)" in message
    assert "\n" not in message  # one line, the newline of the name shown escaped


@pytest.mark.parametrize("model", HOSTILE_MODELS)
def test_the_runtime_refuses_hostile_model_names_too(model):
    # Defence in depth: a Python test can build a Cell without the matrix validator.
    with pytest.raises(StageError, match="refusing model name"):
        check_model_name(model)


def test_hostile_models_in_a_list_name_the_item():
    text = "matrix:\n  - gpu: RTX 4090\n    provider: vastai\n    models: [qwen2:7b, 'x;reboot']\n"
    with pytest.raises(MatrixError, match=r"matrix\[0\]\.models\[1\]: not a valid Ollama model name: 'x;reboot'"):
        parse_matrix(text, "m.yaml")


# --------------------------------------------------------------------- the API token


def test_the_token_comes_from_the_environment_and_stays_out_of_reprs():
    token = "tok-" + "s3cr3t-value"
    settings = resolve({}, {"GPUBENCH_API_TOKEN": token}, lambda key: None)
    assert settings.api_token == token
    assert token not in repr(settings) and token not in str(settings)


# ---------------------------------------------------------------- end to end: leaks

E2E_MATRIX = """
workload:
  duration: 2s
  max_tokens: 24
  warmup_requests: 1
  progress_interval: 1s
  prompts:
    - "Say hi; touch {marker}"
    - "$(touch {marker})"
    - "`touch {marker}`"
    - "it's a 'quoted' \\"word\\" test"
    - "line one\\n; touch {marker}\\nline three"
    - {{prompt: "|| touch {marker} &", expect: ["a"]}}
matrix:
  - gpu: RTX 4090
    provider: vastai
    model: qwen2:1.5b
  - gpu: RTX 3090          # boots without nvidia-smi: fails at ssh_connect, after the key was used
    provider: vastai
    model: qwen2:7b
    offer: {{max_price: 0.081}}
  - gpu: A100 80GB         # fails at boot: the key was handed out, never used
    provider: vastai
    model: qwen2:7b
"""


def _key_files(tmp_dir: Path) -> list[Path]:
    return [p for p in tmp_dir.glob("gpubench-key-*/*.pem")]


def _dump_sqlite(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return "\n".join(db.iterdump())


@pytest.mark.slow
def test_no_key_or_token_reaches_any_output_and_key_files_are_private_and_removed(tmp_path):
    marker = tmp_path / "pwned"
    matrix = tmp_path / "gpubench_security.yaml"
    matrix.write_text(E2E_MATRIX.format(marker=marker))
    token = "gpubench-test-" + "token-" + os.urandom(6).hex()
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()

    sandbox_log: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: sandbox_log.append(handler.format(record))  # type: ignore[method-assign]
    watched = [logging.getLogger(name) for name in ("pytest_gpubench", "asyncssh", "aiohttp")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)

    keys: list[str] = []
    try:
        with SandboxThread(time_scale=0.02, token=token) as sandbox:  # the run's token is the sandbox's
            cloud = sandbox.sandbox.cloud
            original_create = cloud.create_session

            async def create_and_remember(request):
                record, key = await original_create(request)
                keys.append(key)
                return record, key

            cloud.create_session = create_and_remember  # the key material the sandbox hands out
            for offer_id, fault in (
                ("vastai-18430101", {"fault": "missing_tools", "tools": ["nvidia-smi"]}),
                ("vastai-18430401", {"fault": "provision_error", "message": "No available public IPs"}),
                ("vastai-18430402", {"fault": "provision_error", "message": "No available public IPs"}),
            ):
                httpx.post(f"{sandbox.url}/sandbox/faults", headers=bearer(token),
                           json={"offer_id": offer_id, **fault}).raise_for_status()

            junit = tmp_path / "junit.xml"
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
            env.update(GPUBENCH_API_TOKEN=token, TMPDIR=str(temp_dir))
            command = [
                sys.executable, "-m", "pytest", str(matrix), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                "--gpubench-api", sandbox.url, "--gpubench-time-scale", "0.02",
                "--gpubench-reports", str(tmp_path / "reports"), "--junitxml", str(junit),
                "-o", "junit_logging=all", "--log-file", str(tmp_path / "pytest.log"), "--log-file-level", "DEBUG",
                "-rA", "-v",
            ]
            # Output to files, not pipes: nobody reads a pipe while the loop below watches.
            out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
            with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
                process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out_file, stderr=err_file)
            # Watch the key files while the run holds them: private, in a private directory.
            modes: dict[Path, tuple[int, int]] = {}
            deadline = time.monotonic() + 600
            while process.poll() is None and time.monotonic() < deadline:
                for path in _key_files(temp_dir):
                    try:
                        modes[path] = (stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode))
                    except FileNotFoundError:
                        pass  # removed between the glob and the stat
                time.sleep(0.02)
            process.wait(timeout=60)
            stdout, stderr = out_path.read_text(), err_path.read_text()
            state = httpx.get(f"{sandbox.url}/sandbox/state", headers=bearer(token)).json()
    finally:
        for logger, level in zip(watched, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)

    assert process.returncode == 1, stdout[-4000:] + stderr[-2000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    rows = {row["cell_id"]: row for row in db["benchmark_manifest"].rows}
    ok, no_gpu, no_boot = (rows["RTX_4090-vastai-qwen2:1.5b"], rows["RTX_3090-vastai-qwen2:7b"],
                           rows["A100_80GB-vastai-qwen2:7b"])
    assert ok["status"] == "success", ok
    assert no_gpu["status"] == "failed" and no_gpu["failure_stage"] == "ssh_connect", no_gpu
    assert "not a GPU machine" in no_gpu["error_message"]
    assert no_boot["status"] == "failed" and no_boot["failure_stage"] == "provision", no_boot

    # Host keys: pinned and recorded for every cell that connected.
    for row in (ok, no_gpu):
        assert row["host_key_fingerprint"].startswith("SHA256:"), row
    assert not no_boot["host_key_fingerprint"]

    # Hostile prompts were sent as data: the benchmark used them and nothing ran them.
    assert not marker.exists()
    details = json.loads(next(iter(db["benchmarks"].rows))["details_json"])
    assert details["metrics"]

    # Key files: 0600 in 0700, for the cells that had one, and all gone now (failed cells too).
    assert len(keys) >= 3, "every cell got a key from the sandbox"
    assert modes, "no key file was seen while the cells ran"
    assert set(modes.values()) == {(0o600, 0o700)}
    assert _key_files(temp_dir) == [] and list(temp_dir.glob("gpubench-key-*")) == []

    # The token reached the API as a bearer header, on every API call.
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert state["bearer_sha256"].get(digest, 0) >= 6, state["bearer_sha256"]
    assert "" not in state["bearer_sha256"], "an API call went out without the token"

    # Nothing anywhere holds the key, a line of it, or the token.
    outputs = {"stdout": stdout, "stderr": stderr, "sandbox log": "\n".join(sandbox_log),
               "junit": junit.read_text(), "pytest log": (tmp_path / "pytest.log").read_text()}
    for path in (tmp_path / "reports").rglob("*"):
        if path.is_file():
            data = _dump_sqlite(path) if path.suffix == ".db" else path.read_bytes().decode("utf-8", "replace")
            outputs[str(path.relative_to(tmp_path))] = data
    assert any("progress" in name for name in outputs), list(outputs)
    assert "RTX_3090" in outputs["junit"] and "not a GPU machine" in outputs["junit"]
    # Every body line but a short last one (which could match by chance).
    key_lines = {line for key in keys for line in key.splitlines() if len(line) >= 16 and not line.startswith("-----")}
    assert len(key_lines) >= 3 * len(keys)
    for name, text in outputs.items():
        assert KEY_MARKER not in text and BEGIN_MARKER not in text, name
        assert token not in text, name
        leaked = [line for line in key_lines if line in text]
        assert not leaked, (name, leaked[:1])
    # The junit XML is complete and well formed, with the failing cells' reports in it.
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    assert len(cases) == 3
