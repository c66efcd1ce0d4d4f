"""The SSH server of one sandbox instance (asyncssh), behaving like a rented box's sshd.

This is the default; :mod:`.openssh` runs OpenSSH's own ``sshd`` instead, with the
same policy.

- Only user ``root`` with the session's own key gets in; passwords and every other
  key are refused, as on an instance provisioned with that key alone.
- Each exec request runs ``bash -c COMMAND`` (a shell request runs ``bash``, which
  reads commands from stdin) as a real subprocess in its own process group, with
  the instance's environment and ``$HOME`` as working directory. Bytes are relayed
  both ways as they come, stdin EOF is passed on, and the exit status (or the
  killing signal) is returned. Like OpenSSH without a terminal, a client that goes
  away leaves the command running; it only sees its pipes close.
- ``direct-tcpip`` channels (the client's ``-L`` forwards) may reach loopback
  ports only, which is where the instance's Ollama listens.
- No terminals (``allow_pty=False``), agent or X11 forwarding, SFTP or SCP.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

from . import lifeline

log = logging.getLogger("pytest_gpubench.sandbox")

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_CHUNK = 65536
# OpenSSH's default AcceptEnv: only locale variables cross from the client.
_ACCEPTED_ENV_PREFIXES = ("LANG", "LC_")


class InstanceHooks:
    """What the SSH server needs from its instance (kept narrow on purpose)."""

    def __init__(
        self,
        *,
        authorized_key: asyncssh.SSHKey,
        environment: Callable[[], dict[str, str]],
        cwd: Path,
        on_process: Callable[[int], None],
    ) -> None:
        self.authorized_key = authorized_key
        self.environment = environment
        self.cwd = cwd
        self.on_process = on_process
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self.handlers: set[asyncio.Task[Any]] = set()


class _InstanceServer(asyncssh.SSHServer):
    """Authentication and forwarding policy for one instance."""

    def __init__(self, hooks: InstanceHooks) -> None:
        self._hooks = hooks
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._hooks.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._hooks.connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True  # authentication is always required

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        wanted = self._hooks.authorized_key
        return username == "root" and key.public_data == wanted.public_data

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        if dest_host.lower() in LOOPBACK:
            return True  # asyncssh opens the TCP connection itself
        raise asyncssh.ChannelOpenError(
            asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
            f"sandbox instances forward to loopback only, not {dest_host}",
        )


async def listen(hooks: InstanceHooks, host_key: asyncssh.SSHKey, host: str = "127.0.0.1") -> asyncssh.SSHAcceptor:
    """Start the instance's SSH server on an ephemeral port of ``host``."""

    async def handle(process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.current_task()
        if task is not None:
            hooks.handlers.add(task)
        try:
            await _run_process(process, hooks)
        finally:
            if task is not None:
                hooks.handlers.discard(task)

    return await asyncssh.listen(
        host,
        0,
        server_factory=lambda: _InstanceServer(hooks),
        server_host_keys=[host_key],
        process_factory=handle,
        encoding=None,
        allow_pty=False,
        agent_forwarding=False,
        x11_forwarding=False,
        allow_scp=False,
        login_timeout=30,
        keepalive_interval=0,
    )


class AsyncsshEndpoint:
    """The instance's SSH server inside this process (``--ssh-server asyncssh``, the default)."""

    def __init__(self, hooks: InstanceHooks) -> None:
        self._hooks = hooks
        self._acceptor: asyncssh.SSHAcceptor | None = None

    async def start(self) -> int:
        """Listen on a free loopback port (the host key lives in memory only); returns it."""
        self._acceptor = await listen(self._hooks, asyncssh.generate_private_key("ssh-ed25519"))
        return self._acceptor.get_port()

    async def stop_accepting(self) -> set[int]:
        """Refuse new connections; commands' groups are already known through ``on_process``."""
        if self._acceptor is not None:
            self._acceptor.close()
        return set()

    def drop_connections(self) -> int:
        """Cut every open connection, as a network failure does; commands keep running
        (like sshd without a terminal) and new connections are still accepted."""
        dropped = list(self._hooks.connections)
        for conn in dropped:
            conn.abort()
        return len(dropped)

    def freeze(self) -> None:
        """Make every open connection silent, as when a host vanishes from the network:
        nothing more is read or written, and the client is not told. Only a
        keepalive or another channel (the API) can notice. ``finish`` ends them."""
        for conn in self._hooks.connections:
            # asyncssh has no public way to stop a connection without closing it: pause
            # the transport's reading, and swallow what it would still write.
            transport = conn._transport  # type: ignore[attr-defined]
            if transport is None:
                continue
            transport.pause_reading()
            transport.write = lambda data: None

    async def finish(self) -> None:
        """Close the connections left, once the instance's processes are dead."""
        for conn in list(self._hooks.connections):
            conn.close()
        pending = [t for t in self._hooks.handlers if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for task in pending:
            task.cancel()
        if self._acceptor is not None:
            try:
                await asyncio.wait_for(self._acceptor.wait_closed(), 2.0)
            except (asyncio.TimeoutError, OSError):
                pass


async def _run_process(process: asyncssh.SSHServerProcess, hooks: InstanceHooks) -> None:
    env = hooks.environment()
    for name, value in (process.env or {}).items():
        key = name.decode() if isinstance(name, bytes) else str(name)
        if key.startswith(_ACCEPTED_ENV_PREFIXES):
            env[key] = value.decode() if isinstance(value, bytes) else str(value)
    if process.subsystem:
        process.stderr.write(f"subsystem request failed: {process.subsystem} is not served here\n".encode())
        process.exit(1)
        return
    command = process.command
    argv = ["bash", "-c", command] if command is not None else ["bash"]
    try:
        child = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(hooks.cwd),
            start_new_session=True,  # its own process group, killed as one on stop
            preexec_fn=lifeline.die_with_parent(),  # and killed by the kernel if the sandbox dies
        )
    except OSError as exc:
        process.stderr.write(f"bash: {exc}\n".encode())
        process.exit(127)
        return
    hooks.on_process(child.pid)
    feeder = asyncio.create_task(_feed_stdin(process, child))
    relays = [
        asyncio.create_task(_relay(child.stdout, process.stdout, child, 1)),
        asyncio.create_task(_relay(child.stderr, process.stderr, child, 2)),
    ]
    returncode = await child.wait()
    # Like sshd, report the exit only once the pipes are drained (a background
    # job that keeps them open keeps the channel open too).
    await asyncio.gather(*relays, return_exceptions=True)
    feeder.cancel()
    try:
        if returncode < 0:
            name = signal.Signals(-returncode).name.removeprefix("SIG")
            process.exit_with_signal(name)
        else:
            process.exit(returncode)
    except (OSError, asyncssh.Error):
        pass  # the client is already gone


async def _feed_stdin(process: asyncssh.SSHServerProcess, child: asyncio.subprocess.Process) -> None:
    assert child.stdin is not None
    try:
        while True:
            data = await process.stdin.read(_CHUNK)
            if not data:
                break
            child.stdin.write(data)
            await child.stdin.drain()
    except (OSError, asyncssh.Error, asyncssh.BreakReceived, asyncssh.SignalReceived, asyncssh.TerminalSizeChanged):
        pass
    finally:
        try:
            child.stdin.close()
        except OSError:
            pass


async def _relay(
    source: asyncio.StreamReader | None,
    sink: asyncssh.SSHWriter[bytes],
    child: asyncio.subprocess.Process,
    fd: int,
) -> None:
    assert source is not None
    while True:
        data = await source.read(_CHUNK)
        if not data:
            return
        try:
            sink.write(data)
            await sink.drain()
        except (OSError, asyncssh.Error):
            # The client left: close our end so the command's next write fails
            # with EPIPE, as it would under sshd, instead of blocking forever.
            transport = child._transport  # type: ignore[attr-defined]
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is not None:
                pipe.close()
            return


async def probe(host: str, port: int, private_key: asyncssh.SSHKey, timeout: float) -> None:
    """Log in once with the session's key, as the server's SSH check does."""

    async def attempt() -> None:
        async with asyncssh.connect(
            host,
            port,
            username="root",
            client_keys=[private_key],
            known_hosts=None,
            agent_path=None,
            config=[],
            connect_timeout=timeout,
        ):
            pass

    await asyncio.wait_for(attempt(), timeout)
