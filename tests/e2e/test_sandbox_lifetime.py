"""A killed sandbox takes its instances' processes with it.

The sandbox runs as its own program (``python -m pytest_gpubench.sandbox``), a
session's instance starts ``ollama serve`` the way the plugin does (``nohup ... &``
over SSH, so it is reparented at once) and keeps one command running in the
foreground; then the sandbox gets SIGKILL, which leaves it no chance to clean up.
Every process carrying the instance's marker must be gone within a generous bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncssh
import httpx
import pytest
from polling import wait_for
from e2e_helpers import SANDBOX_AUTH

from pytest_gpubench.sandbox.lifeline import OWNER_ENV, owner_alive, owner_token
from pytest_gpubench.sandbox.server import URL_PREFIX

PREINSTALLED_4090 = "vastai-18430201"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def marked_pids(marker: bytes) -> set[int]:
    """Live, non-zombie processes whose environment carries ``marker``."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and marker in environ.split(b"\0"):
            found.add(int(name))
    return found


def start_sandbox(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    process = subprocess.Popen([sys.executable, "-m", "pytest_gpubench.sandbox", "--port", "0",
                                "--time-scale", "0.01"], stdout=subprocess.PIPE,
                               stderr=(tmp_path / "sandbox.log").open("w"), text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()  # the sandbox prints its URL once it answers
    assert line.startswith(URL_PREFIX), (tmp_path / "sandbox.log").read_text()
    return process, line[len(URL_PREFIX):].strip()


def running_session(api: httpx.Client) -> tuple[dict, str]:
    created = api.post("/api/v1/sessions", json={
        "consumer_id": f"test-{uuid.uuid4().hex[:8]}", "offer_id": PREINSTALLED_4090,
        "workload_type": "interactive", "reservation_hours": 1})
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]

    def running():
        session = api.get(f"/api/v1/sessions/{session_id}").json()
        return session if session["status"] == "running" else None

    return wait_for(running, timeout=60, what="session running"), created.json()["ssh_private_key"]


async def start_instance_processes(session: dict, key: str) -> tuple[bytes, asyncssh.SSHClientConnection]:
    """``ollama serve`` daemonized and answering, and a foreground command still running;
    returns the instance's marker and the connection that keeps the command open."""
    conn = await asyncssh.connect(session["ssh_host"], session["ssh_port"], username="root",
                                  client_keys=[asyncssh.import_private_key(key)], known_hosts=None,
                                  agent_path=None, config=[])
    instance = (await conn.run("echo $GPUBENCH_SANDBOX_INSTANCE", check=True)).stdout.strip()
    await conn.run('nohup ollama serve > serve.log 2>&1 < /dev/null &', check=True)
    for _ in range(600):
        if (await conn.run("ollama --version", check=False)).stdout.startswith("ollama version is"):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("ollama serve did not answer")
    await conn.create_process("exec sleep 600")  # a foreground command: the sandbox's own child
    return f"GPUBENCH_SANDBOX_INSTANCE={instance}".encode(), conn


def test_killed_sandbox_leaves_no_instance_process(tmp_path):
    process, url = start_sandbox(tmp_path)
    marker = b""
    try:
        with httpx.Client(base_url=url, headers=SANDBOX_AUTH, timeout=30) as api:
            session, key = running_session(api)
        loop = asyncio.new_event_loop()
        marker, conn = loop.run_until_complete(start_instance_processes(session, key))
        before = wait_for(lambda: (lambda p: p if len(p) >= 2 else None)(marked_pids(marker)),
                          what="ollama serve and the foreground command")
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in before}
        assert any(b"serve" in c for c in commands.values()), commands
        assert any(b"sleep" in c for c in commands.values()), commands

        process.send_signal(signal.SIGKILL)
        process.wait(30)
        # The daemon notices its sandbox is gone; the foreground command gets the
        # kernel's death signal. Generous: a busy machine schedules them late.
        wait_for(lambda: not marked_pids(marker), timeout=30, interval=0.2,
                 what=f"instance processes to end after the sandbox's SIGKILL (left: {marked_pids(marker)})")
        conn.abort()
        loop.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        for pid in marked_pids(marker) if marker else ():
            os.kill(pid, signal.SIGKILL)  # only this test's own leftovers, by pid


def test_owner_token_names_this_process_and_not_a_later_one():
    token = owner_token()
    assert owner_alive(token)
    pid = int(token.split(":")[0])
    assert not owner_alive(f"{pid}:1")  # same pid, another start time: a recycled pid
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not owner_alive(f"{child.pid}:")  # no longer running
    assert OWNER_ENV == "GPUBENCH_SANDBOX_OWNER"


def test_stand_in_exits_when_its_owner_is_gone(tmp_path):
    """The watcher alone, without a sandbox: an owner that exits ends the daemon."""
    owner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    script = ("import asyncio\nfrom pytest_gpubench.sandbox.lifeline import watch_owner\n"
              "async def main():\n    gone = asyncio.Event()\n    await watch_owner(gone.set)\n"
              "    print('gone', flush=True)\nasyncio.run(main())\n")
    env = {**os.environ, OWNER_ENV: owner_token(owner.pid)}
    watcher = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert watcher.poll() is None  # the owner still lives
        assert owner.stdin is not None
        owner.stdin.close()
        owner.wait(30)
        out, _ = watcher.communicate(timeout=30)
        assert out == "gone\n"
    finally:
        for p in (owner, watcher):
            if p.poll() is None:
                p.kill()
                p.wait()
