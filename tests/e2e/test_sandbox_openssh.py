"""End to end against OpenSSH's real ``sshd``: a sandbox session whose SSH endpoint is
the server users meet on rented machines, driven with the asyncssh client the plugin
uses and the RSA PEM key the API returns.

Skipped without an ``sshd`` binary (or without root, which sshd needs to log in
root), unless ``GPUBENCH_REQUIRE_SSHD=1``: CI sets it, so there it fails instead.
No fixed sleeps: every wait polls with a generous bound.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
from e2e_helpers import SANDBOX_AUTH

from pytest_gpubench.sandbox import SandboxThread
from pytest_gpubench.sandbox.instances import process_cmdline
from pytest_gpubench.sandbox.shims import INSTANCE_ENV

TIME_SCALE = 0.01
PLAIN_4090 = "vastai-18430202"  # Ollama not preinstalled: the install runs over sshd too
INSTALL = "curl -fsSL https://ollama.com/install.sh | sh"
START_OLLAMA = 'mkdir -p "$HOME/.gpubench"; nohup ollama serve > "$HOME/.gpubench/ollama-serve.log" 2>&1 < /dev/null &'


def _why_not_runnable() -> str:
    if not (shutil.which("sshd") or os.access("/usr/sbin/sshd", os.X_OK)):
        return "no OpenSSH sshd on this machine (install openssh-server)"
    if os.geteuid() != 0:
        return "sshd logs in root only when it runs as root"
    return ""


@pytest.fixture(scope="module")
def sandbox():
    reason = _why_not_runnable()
    if reason:
        if os.environ.get("GPUBENCH_REQUIRE_SSHD") == "1":
            pytest.fail(f"GPUBENCH_REQUIRE_SSHD=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    with SandboxThread(time_scale=TIME_SCALE, ssh_server="openssh") as running:
        yield running


async def _poll(check: Any, timeout: float, what: str) -> Any:
    """Await ``check()`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields  # a zombie is dead, only not yet reaped


def _alive(pid: int) -> bool:
    return _stat_fields(pid) is not None


def _children(pid: int) -> set[int]:
    """Live direct children of ``pid``."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and int(fields[1]) == pid:
                found.add(int(name))
    return found


def _marked(spec_path: str) -> set[int]:
    """Live processes carrying this instance's environment marker."""
    marker = f"{INSTANCE_ENV}={spec_path}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if marker in environ and _alive(int(name)):
            found.add(int(name))
    return found


async def _create_running(api: httpx.AsyncClient) -> tuple[dict[str, Any], str]:
    body = {
        "consumer_id": f"test-openssh-{uuid.uuid4().hex[:8]}",
        "offer_id": PLAIN_4090,
        "workload_type": "interactive",
        "reservation_hours": 1,
    }
    created = await api.post("/api/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]

    async def running() -> dict[str, Any] | None:
        session = (await api.get(f"/api/v1/sessions/{session_id}")).json()
        assert session["status"] in ("provisioning", "running"), session
        return session if session["status"] == "running" else None

    return await _poll(running, 10, f"session {session_id} running"), created.json()["ssh_private_key"]


def test_session_on_real_sshd(sandbox):
    async def go() -> None:
        async with httpx.AsyncClient(base_url=sandbox.url, headers=SANDBOX_AUTH, timeout=30) as api:
            session, key_pem = await _create_running(api)
            assert key_pem.startswith("-----BEGIN " "RSA PRIVATE KEY-----")
            state = next(s for s in (await api.get("/sandbox/state")).json()["sessions"] if s["id"] == session["id"])
            root = Path(state["instance_dir"])
            sshd_pid = int((root / "sshd" / "sshd.pid").read_text())
            assert b"sshd" in process_cmdline(sshd_pid)
            assert (root / "sshd" / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
            # Only the session's key opens it (issue 21 item 3): not another key, not another user.
            stranger = asyncssh.generate_private_key("ssh-rsa", key_size=2048)
            for user, key in ((session["ssh_user"], stranger), ("nobody", asyncssh.import_private_key(key_pem))):
                with pytest.raises(asyncssh.PermissionDenied):
                    await asyncssh.connect(session["ssh_host"], session["ssh_port"], username=user,
                                           client_keys=[key], known_hosts=None, agent_path=None, config=[])

            async with asyncssh.connect(
                session["ssh_host"],
                session["ssh_port"],
                username=session["ssh_user"],
                client_keys=[asyncssh.import_private_key(key_pem)],
                known_hosts=None,
                agent_path=None,
                config=[],
            ) as conn:
                assert conn.get_extra_info("server_version").startswith("SSH-2.0-OpenSSH_")
                ok = await conn.run("echo ok", check=False)
                assert (ok.exit_status, ok.stdout) == (0, "ok\n")
                assert (await conn.run("exit 3", check=False)).exit_status == 3
                script = "import sys\nprint(sum(range(10)), repr(sys.stdin.read()))\n"
                piped = await conn.run("python3 -", input=script, check=False)
                assert (piped.exit_status, piped.stdout) == (0, "45 ''\n"), piped.stderr
                # A command text with quotes and newlines reaches bash exactly once.
                quoted = await conn.run("printf '%s|' \"a'b\" 'c\"d'\necho \"$0\"", check=False)
                assert quoted.stdout == "a'b|c\"d|bash\n", quoted.stderr

                probe = 'pwd; echo "$HOME"; echo "$OLLAMA_HOST"; nvidia-smi --query-gpu=name --format=csv,noheader'
                seen = await conn.run(probe, check=False)
                assert seen.exit_status == 0, seen.stderr
                cwd, home, ollama_host, gpu_name = seen.stdout.splitlines()
                assert Path(cwd) == Path(home) == root / "home"
                assert ollama_host == state["ollama_host"]
                assert gpu_name == "NVIDIA GeForce RTX 4090"

                if (await conn.run("command -v ollama", check=False)).exit_status != 0:
                    installed = await conn.run(INSTALL, check=False)
                    assert installed.exit_status == 0, installed.stderr
                started = await asyncio.wait_for(conn.run(START_OLLAMA, check=False), 10)
                assert started.exit_status == 0, started.stderr

                host, port = ollama_host.rsplit(":", 1)
                listener = await conn.forward_local_port("127.0.0.1", 0, host, int(port))
                tunnel = f"http://127.0.0.1:{listener.get_port()}"
                async with httpx.AsyncClient(base_url=tunnel, timeout=5) as ollama:

                    async def version() -> str | None:
                        try:
                            answer = await ollama.get("/api/version")
                        except httpx.TransportError:
                            return None  # the server is still starting, or the forward not yet open
                        return answer.json()["version"] if answer.status_code == 200 else None

                    assert await _poll(version, 10, "Ollama through the forward")
                listener.close()

                instance_processes = _marked(str(root / "instance.json"))
                servers = [pid for pid in instance_processes if b"ollama_standin\0serve" in process_cmdline(pid)]
                assert servers, "the Ollama server runs with the instance's environment"
                connection_processes = _children(sshd_pid)
                assert connection_processes, "the open connection has its own sshd process"

                done = await api.post(f"/api/v1/sessions/{session['id']}/done")
                assert done.status_code == 200, done.text
                assert (await api.get(f"/api/v1/sessions/{session['id']}")).json()["status"] == "stopped"

            gone = instance_processes | connection_processes | {sshd_pid}

            async def all_gone() -> bool:
                return not any(_alive(pid) for pid in gone)

            await _poll(all_gone, 5, "sshd, its connection and the Ollama server to die")
            assert not _marked(str(root / "instance.json"))
            assert not root.exists()
            with pytest.raises(OSError):
                await asyncio.open_connection(host, int(port))  # Ollama's port is closed

    asyncio.run(go())


def test_openssh_without_sshd_is_a_one_line_error(monkeypatch, capsys):
    from pytest_gpubench.sandbox import server, sshd

    monkeypatch.setattr(sshd, "find_sshd", lambda: None)
    assert server.main(["--ssh-server", "openssh"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install openssh-server" in err
    with pytest.raises(sshd.SshServerUnavailable, match="install openssh-server"):
        SandboxThread(ssh_server="openssh").start()
