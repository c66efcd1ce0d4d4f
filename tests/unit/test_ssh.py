"""remote/ssh.py against a real asyncssh server on loopback running real commands."""

import asyncio
import os
import stat

import asyncssh
import pytest

from pytest_gpubench.errors import RemoteCommandError, Stage, StageError
from pytest_gpubench.remote.ssh import Connection, KeyFile, quote


class Server(asyncssh.SSHServer):
    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        return dest_host == "127.0.0.1"  # local forwards to loopback only


async def run_command(process: asyncssh.SSHServerProcess) -> None:
    """Run the command with bash, relaying stdin and both output streams fully."""
    shell = await asyncio.create_subprocess_exec(
        "bash", "-c", process.command or "true",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )

    async def feed() -> None:
        while data := await process.stdin.read(65536):
            shell.stdin.write(data)
            await shell.stdin.drain()
        shell.stdin.close()

    async def relay(source, sink) -> None:
        while data := await source.read(65536):
            sink.write(data)

    feeding = asyncio.ensure_future(feed())
    await asyncio.gather(relay(shell.stdout, process.stdout), relay(shell.stderr, process.stderr))
    status = await shell.wait()
    feeding.cancel()
    process.exit(status)


@pytest.fixture
def ssh_server():
    """(port, client key PEM) of a real SSH server; runs on its own event loop per test."""
    client_key = asyncssh.generate_private_key("ssh-rsa", key_size=2048)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    loop = asyncio.new_event_loop()
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    server = loop.run_until_complete(asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized,
        process_factory=run_command, server_factory=Server, encoding=None,
    ))
    port = server.sockets[0].getsockname()[1]
    yield loop, port, client_key.export_private_key("pkcs1-pem").decode()
    server.close()
    loop.run_until_complete(server.wait_closed())
    loop.close()


def test_run_output_exit_status_and_stderr(ssh_server):
    loop, port, key = ssh_server

    async def go():
        conn = await Connection.open("127.0.0.1", port, "root", key, timeout=10)
        ok = await conn.run("echo hello", stage="ssh_connect", what="echo", timeout=10)
        with pytest.raises(RemoteCommandError) as info:
            await conn.run("echo broken >&2; exit 3", stage="runtime_setup", what="install", timeout=10)
        await conn.close()
        return ok, info.value

    ok, error = loop.run_until_complete(go())
    assert ok.stdout == "hello\n" and ok.exit_status == 0
    assert error.exit_status == 3
    assert str(error.stage) == "runtime_setup"
    assert "install exited 3: broken" in str(error)


def test_stream_lines_sends_script_on_stdin(ssh_server):
    loop, port, key = ssh_server
    script = "import sys\nfor i in range(3):\n    print('line', i, sys.argv[1], flush=True)\n"

    async def go():
        conn = await Connection.open("127.0.0.1", port, "root", key, timeout=10)
        lines = [line async for line in conn.stream_lines("python3 - " + quote("a b;c"), stdin=script)]
        await conn.close()
        return lines

    assert loop.run_until_complete(go()) == ["line 0 a b;c", "line 1 a b;c", "line 2 a b;c"]


def test_quoting_keeps_metacharacters_inert(ssh_server, tmp_path):
    loop, port, key = ssh_server
    marker = tmp_path / "pwned"
    hostile = f"x; touch {marker}; $(touch {marker}) `touch {marker}` '\"\n"

    async def go():
        conn = await Connection.open("127.0.0.1", port, "root", key, timeout=10)
        result = await conn.run("printf %s " + quote(hostile), stage="benchmark", what="printf", timeout=10)
        await conn.close()
        return result

    assert loop.run_until_complete(go()).stdout == hostile
    assert not marker.exists()


def test_forward_reaches_a_loopback_port(ssh_server):
    loop, port, key = ssh_server

    async def go():
        async def echo(reader, writer):
            writer.write(b"pong:" + await reader.readline())
            await writer.drain()
            writer.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        target_port = target.sockets[0].getsockname()[1]
        conn = await Connection.open("127.0.0.1", port, "root", key, timeout=10)
        local = await conn.forward("127.0.0.1", target_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"ping\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(100), 10)
        writer.close()
        await conn.close()
        target.close()
        return answer

    assert loop.run_until_complete(go()) == b"pong:ping\n"


def test_wrong_key_is_an_ssh_connect_error(ssh_server):
    loop, port, _ = ssh_server
    other = asyncssh.generate_private_key("ssh-rsa", key_size=2048).export_private_key("pkcs1-pem").decode()
    with pytest.raises(StageError) as info:
        loop.run_until_complete(Connection.open("127.0.0.1", port, "root", other, timeout=10))
    assert str(info.value.stage) == "ssh_connect"
    assert f"root@127.0.0.1:{port}" in str(info.value)
    assert "PRIVATE KEY" not in str(info.value)


def test_garbage_key_is_reported_without_echoing_it():
    with pytest.raises(StageError, match="private key is unusable") as info:
        asyncio.run(Connection.open("127.0.0.1", 9, "root", "not a key SECRETSTUFF", timeout=5))
    assert "SECRETSTUFF" not in str(info.value)


def test_a_hosts_key_file_is_read_where_it_is_and_an_unreadable_one_fails_ssh_connect(tmp_path):
    """A host's long-lived key is never copied: SSH gets its path; a key file gone or unreadable since the
    inventory was read is an ``ssh_connect`` error naming it, before any connection."""
    from pytest_gpubench.cloud.hosts_provider import HostsProvider
    from pytest_gpubench.settings import Settings

    key = tmp_path / "id_lab"
    key.write_text(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    (tmp_path / "hosts.yaml").write_text("hosts: {lab: {address: 127.0.0.1, key_file: id_lab, gpu: RTX 4090}}\n")
    hosts = HostsProvider(Settings(hosts=str(tmp_path / "hosts.yaml")))
    (machine,) = hosts.machines(None)
    key.unlink()  # gone after the inventory was read: not an InventoryError out of ssh_details
    ssh = hosts.ssh_for(machine, (0,))
    assert ssh.private_key == "" and ssh.key_file == str(key.resolve())
    with pytest.raises(StageError, match="the key file .*id_lab is unusable") as info:
        asyncio.run(Connection.open("127.0.0.1", 9, "root", "", timeout=5, key_path=ssh.key_file))
    assert info.value.stage is Stage.SSH_CONNECT


def test_key_file_is_private_and_removed():
    key_file = KeyFile("-----BEGIN " "RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----", name="s1")
    assert stat.S_IMODE(os.stat(key_file.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_file.dir).st_mode) == 0o700
    key_file.remove()
    assert not key_file.path.exists() and not key_file.dir.exists()
    key_file.remove()  # idempotent
