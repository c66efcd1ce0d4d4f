"""Sandbox instances: real SSH servers on loopback, driven with a real asyncssh client.

One sandbox (time scale 0.01) serves the module; tests that destroy an instance
create their own session. No fixed sleeps: every wait polls with a generous bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
from polling import wait_for

TIME_SCALE = 0.01
PLAIN_4090 = "vastai-18430202"  # Ollama not preinstalled
PREINSTALLED_4090 = "vastai-18430201"
PLAIN_3090 = "vastai-18430101"
INSTANCE_KEYS = {"session_id", "time_scale", "gpu", "host", "ollama", "models", "state_dir", "offload_penalty", "disk",
                 "docker_images"}




def start_session(api: httpx.Client, offer_id: str, **extra: Any) -> tuple[dict[str, Any], str]:
    body = {
        "consumer_id": f"test-{uuid.uuid4().hex[:8]}",
        "offer_id": offer_id,
        "workload_type": "interactive",
        "reservation_hours": 1,
        **extra,
    }
    created = api.post("/api/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]

    def running() -> dict[str, Any] | None:
        session = api.get(f"/api/v1/sessions/{session_id}").json()
        assert session["status"] in ("provisioning", "running"), session
        return session if session["status"] == "running" else None

    return wait_for(running, what=f"session {session_id} running"), created.json()["ssh_private_key"]


def instance_dir(api: httpx.Client, session_id: str) -> Path:
    state = api.get("/sandbox/state").json()
    entry = next(s for s in state["sessions"] if s["id"] == session_id)
    return Path(entry["instance_dir"])


async def _connect(session: dict[str, Any], key_pem: str, username: str = "root") -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        session["ssh_host"],
        session["ssh_port"],
        username=username,
        client_keys=[asyncssh.import_private_key(key_pem)],
        known_hosts=None,
        agent_path=None,
        config=[],
    )


def ssh_run(
    session: dict[str, Any], key_pem: str, command: str, stdin: str | None = None
) -> asyncssh.SSHCompletedProcess:
    async def go() -> asyncssh.SSHCompletedProcess:
        async with await _connect(session, key_pem) as conn:
            return await conn.run(command, input=stdin, check=False)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def plain(api):
    """A running session on an offer without Ollama preinstalled."""
    return start_session(api, PLAIN_4090)


def test_echo_ok(plain):
    result = ssh_run(*plain, "echo ok")
    assert result.exit_status == 0
    assert result.stdout == "ok\n"


def test_exit_status_is_returned(plain):
    assert ssh_run(*plain, "exit 3").exit_status == 3
    assert ssh_run(*plain, "echo oops >&2; false").stderr == "oops\n"


def test_killing_signal_is_returned(plain):
    result = ssh_run(*plain, "kill -TERM $$")
    assert result.exit_signal is not None and result.exit_signal[0] == "TERM"


def test_script_on_stdin_runs_under_python3(plain):
    script = "import sys\nprint(sum(range(10)), sys.stdin.read() == '')\n"
    result = ssh_run(*plain, "python3 -", stdin=script)
    assert result.exit_status == 0, result.stderr
    assert result.stdout == "45 True\n"


def test_output_streams_before_the_command_ends(plain):
    session, key = plain

    async def go() -> str:
        async with await _connect(session, key) as conn:
            process = await conn.create_process("echo first; read line; echo got-$line")
            # "first" must arrive while the command still waits for our line.
            first = await asyncio.wait_for(process.stdout.readline(), 10)
            process.stdin.write("ping\n")
            process.stdin.write_eof()
            rest = await asyncio.wait_for(process.stdout.read(), 10)
            await process.wait()
            return first + rest

    assert asyncio.run(go()) == "first\ngot-ping\n"


def test_environment_of_commands(api, plain):
    session, key = plain
    command = 'echo "$OLLAMA_HOST"; command -v nvidia-smi; echo "$HOME"; cat "$GPUBENCH_SANDBOX_INSTANCE"'
    result = ssh_run(*plain, command)
    assert result.exit_status == 0, result.stderr
    ollama_host, smi, home, document = result.stdout.split("\n", 3)
    state = next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session["id"])
    assert ollama_host == state["ollama_host"] and ollama_host.startswith("127.0.0.1:")
    root = Path(state["instance_dir"])
    assert Path(smi) == root / "bin" / "nvidia-smi"
    assert Path(home) == root / "home"
    spec = json.loads(document)
    assert set(spec) == INSTANCE_KEYS
    assert spec["session_id"] == session["id"]
    assert spec["time_scale"] == TIME_SCALE
    assert spec["gpu"]["gpu_type"] == "RTX 4090" and spec["gpu"]["name"] == "NVIDIA GeForce RTX 4090"
    assert spec["gpu"]["memory_mib"] == 24564 and spec["gpu"]["count"] == 1
    assert set(spec["ollama"]) == {"version", "pull_mb_per_s", "install_seconds"}
    qwen = spec["models"]["qwen2:7b"]
    assert qwen["tokens_per_second"] == 195.3  # the report's Vast.ai figure
    assert qwen["digest"].startswith("sha256:") and len(qwen["digest"]) == 71
    assert set(spec["models"]) >= {"qwen2:1.5b", "deepseek-r1:70b", "llama3:8b", "mistral:7b", "phi3:mini"}
    assert Path(spec["state_dir"]) == root / "state"


def test_wrong_key_and_wrong_user_are_refused(plain):
    session, key = plain
    stranger = asyncssh.generate_private_key("ssh-rsa", key_size=2048).export_private_key("pkcs1-pem").decode()
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(_connect(session, stranger))
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(_connect(session, key, username="ubuntu"))


def test_local_port_forward_reaches_a_server_on_the_instance(plain):
    session, key = plain
    server = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()\n"
    )

    async def go() -> bytes:
        async with await _connect(session, key) as conn:
            process = await conn.create_process("python3 -")
            process.stdin.write(server)
            process.stdin.write_eof()
            remote_port = int(await asyncio.wait_for(process.stdout.readline(), 10))
            listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", remote_port)
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.get_port())
            writer.write(b"hello through the tunnel")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(100), 10)
            writer.close()
            await process.wait()
            # Forwarding anywhere but loopback is refused.
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.open_connection("192.0.2.1", 80)
            return answer

    assert asyncio.run(go()) == b"HELLO THROUGH THE TUNNEL"


def test_curl_shim_installs_ollama(plain):
    assert ssh_run(*plain, "command -v ollama || echo missing").stdout == "missing\n"
    result = ssh_run(*plain, "curl -fsSL https://ollama.com/install.sh | sh")
    assert result.exit_status == 0, result.stderr
    assert "Install complete" in result.stderr
    found = ssh_run(*plain, "command -v ollama")
    assert found.exit_status == 0
    wrapper = Path(found.stdout.strip())
    assert wrapper.parent.name == "bin" and os.access(wrapper, os.X_OK)
    assert "pytest_gpubench.sandbox.ollama_standin" in wrapper.read_text()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no real curl on this machine")
def test_curl_shim_passes_other_urls_to_real_curl(sandbox, plain):
    result = ssh_run(*plain, f"curl -s -o /dev/null -w '%{{http_code}}' {sandbox.url}/health")
    assert result.stdout == "401"  # the sandbox's API answered (and, without its token, refused)


def test_curl_shim_without_a_real_curl_is_command_not_found(plain):
    result = ssh_run(*plain, 'PATH="$(dirname "$(command -v nvidia-smi)")" curl -s https://example.com/')
    assert result.exit_status == 127
    assert "command not found" in result.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def test_done_kills_background_processes_and_removes_the_instance(api):
    session, key = start_session(api, PREINSTALLED_4090)
    root = instance_dir(api, session["id"])
    assert (root / "bin" / "ollama").exists()  # this offer ships Ollama
    started = ssh_run(
        session,
        key,
        "nohup sleep 300 > /dev/null 2>&1 & echo $!; setsid sleep 301 > /dev/null 2>&1 < /dev/null & echo $!",
    )
    pids = [int(p) for p in started.stdout.split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    done = api.post(f"/api/v1/sessions/{session['id']}/done")
    assert done.status_code == 200
    assert api.get(f"/api/v1/sessions/{session['id']}").json()["status"] == "stopped"
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=10, what="instance processes to die")
    assert not root.exists()
    with pytest.raises((OSError, asyncssh.Error)):  # refused (or, were the port reused, not ours)
        asyncio.run(_connect(session, key))


def test_llm_workload_installs_ollama_on_start(api):
    session, _key = start_session(api, PLAIN_3090, workload_type="llm")
    root = instance_dir(api, session["id"])
    wait_for(lambda: (root / "bin" / "ollama").exists(), what="the on-start script to install ollama")
    log = root / "home" / "onstart.log"
    # The install script reports completion just after it moves the wrapper in place.
    wait_for(lambda: "Install complete" in log.read_text(), what="the install to report completion")
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 200
