"""The SSH server of one sandbox instance (asyncssh), behaving like a rented box's sshd.

This is the default; :mod:`.sshd` runs OpenSSH's own ``sshd`` instead, with the
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
import os
import shlex
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from ..errors import UsageProblem
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


# ----------------------------------------------------------------------
#
# The SSH server of one sandbox instance as OpenSSH's real ``sshd`` (``--ssh-server openssh``).
#
# The default server (:mod:`.sshd`, asyncssh) is emulated; this one is the server
# users meet on rented machines, so key formats, authentication and remote command
# execution are proven against it. Per instance, ``<instance>/sshd/`` holds an
# ed25519 host key (0600), ``authorized_keys`` with the session's public key, an
# ``sshd_config`` and sshd's log; ``sshd -D -e -f sshd_config`` runs as a child
# process on a free loopback port.
#
# The configuration keeps the asyncssh server's policy: user ``root`` with the
# session key only, local (``-L``) forwards to loopback only, no terminals, agent,
# X11 or subsystems. Commands get the instance's environment through ``SetEnv``,
# which overrides sshd's own ``PATH`` and ``HOME``. sshd always starts sessions in
# the passwd home of root (``/root``), so a ``ForceCommand`` (:data:`SESSION_COMMAND`)
# moves to ``$HOME`` first and then ``exec``s ``bash -c "$SSH_ORIGINAL_COMMAND"``
# (plain ``bash`` for a shell request): stdin, output, exit status and a killing
# signal pass through untouched, as does the command text, which never goes
# through a second round of parsing.
#
# sshd only logs users in as root when it runs as root, so this server needs root.


FALLBACK_SSHD = "/usr/sbin/sshd"
# sshd's privilege separation directory (Debian's and Ubuntu's build); a package
# installed in a container without systemd leaves it to the init script.
PRIVSEP_DIR = Path("/run/sshd")
_START_ATTEMPTS = 3  # a free port can be taken between choosing and binding it
_LISTEN_TIMEOUT = 10.0
_STOP_GRACE = 1.0

# Run by root's login shell with -c. POSIX sh on purpose: that shell need not be bash.
# LANG defaults to the instance's value unless the client sent its own (AcceptEnv),
# as with the asyncssh server.
SESSION_COMMAND = (
    'cd "$HOME" || exit 1; unset OLDPWD; '
    '[ -n "${{LANG+set}}" ] || LANG={lang}; export LANG; '
    'if [ -n "${{SSH_ORIGINAL_COMMAND+set}}" ]; then '
    "gpubench_command=$SSH_ORIGINAL_COMMAND; unset SSH_ORIGINAL_COMMAND; "
    'exec bash -c "$gpubench_command"; fi; '
    "exec bash"
)


class SshServerUnavailable(UsageProblem):
    """``--ssh-server openssh`` cannot work on this machine (no sshd, or not root)."""


class SshdFailed(RuntimeError):
    """sshd did not start listening; the message carries the end of its log."""


def find_sshd() -> str | None:
    """The absolute path of OpenSSH's ``sshd`` (PATH, then /usr/sbin), or None."""
    found = shutil.which("sshd")
    if found:
        return os.path.abspath(found)  # sshd re-executes itself and insists on an absolute path
    if os.access(FALLBACK_SSHD, os.X_OK):
        return FALLBACK_SSHD
    return None


def require_sshd() -> str:
    """The sshd path, or :class:`SshServerUnavailable` with a one-line reason."""
    path = find_sshd()
    if path is None:
        raise SshServerUnavailable(
            f"--ssh-server openssh: no sshd found (not on PATH, not at {FALLBACK_SSHD}): install openssh-server"
        )
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise SshServerUnavailable(
            "--ssh-server openssh needs root: sshd logs sessions in as root only when it runs as root"
        )
    return path


def render_config(
    *,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    environment: dict[str, str],
) -> str:
    """The ``sshd_config`` of one instance (nothing from /etc/ssh applies)."""
    lang = environment.get("LANG", "C.UTF-8")
    set_env = " ".join(_quote(f"{name}={value}") for name, value in environment.items() if name != "LANG")
    lines = [
        "# One gpubench sandbox instance (pytest_gpubench.sandbox.sshd)",
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {_quote(str(host_key))}",
        # An absolute path, so it does not depend on root's home; % starts a token there.
        f"AuthorizedKeysFile {_quote(str(authorized_keys).replace('%', '%%'))}",
        f"PidFile {_quote(str(pid_file))}",
        # The file above would admit any local user holding the key: only root may log in.
        "AllowUsers root",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the files live in a temporary directory
        # The plugin forwards a local port to the instance's Ollama; like the asyncssh
        # server, nothing else: no remote forwards, loopback targets only.
        "AllowTcpForwarding local",
        "PermitOpen 127.0.0.1:* localhost:* [::1]:*",
        "PermitTTY no",
        "X11Forwarding no",
        "AllowAgentForwarding no",
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        "LoginGraceTime 30",
        f"SetEnv {set_env}",
        "ForceCommand " + SESSION_COMMAND.format(lang=shlex.quote(lang)),
    ]
    return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    """One ``sshd_config`` argument: double-quoted, with ``\\`` and ``"`` escaped."""
    if any(char in value for char in "\r\n\0"):
        raise ValueError(f"cannot write {value!r} into sshd_config")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read (sshd refuses a readable host key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


class OpenSshEndpoint:
    """One instance's ``sshd``: its files, its process, and the processes it forked."""

    def __init__(
        self,
        directory: Path,
        *,
        authorized_key: asyncssh.SSHKey,
        environment: Callable[[], dict[str, str]],
        choose_port: Callable[[], int],
    ) -> None:
        self.directory = directory
        self._authorized_key = authorized_key
        self._environment = environment
        self._choose_port = choose_port
        self._process: asyncio.subprocess.Process | None = None
        self._forked: dict[int, _ProcessStat] = {}
        self.log_path = directory / "sshd.log"
        self.pid_file = directory / "sshd.pid"

    async def start(self) -> int:
        """Write the files, start sshd and wait until it accepts TCP; returns its port."""
        sshd_path = require_sshd()
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        host_key = self.directory / "ssh_host_ed25519_key"
        _write_private(host_key, asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh"))
        authorized_keys = self.directory / "authorized_keys"
        _write_private(authorized_keys, self._authorized_key.export_public_key("openssh"))
        config = self.directory / "sshd_config"
        reason = ""
        for _attempt in range(_START_ATTEMPTS):
            port = self._choose_port()
            config.write_text(
                render_config(
                    port=port,
                    host_key=host_key,
                    authorized_keys=authorized_keys,
                    pid_file=self.pid_file,
                    environment=self._environment(),
                ),
                encoding="utf-8",
            )
            with open(self.log_path, "ab") as log_file:
                self._process = await asyncio.create_subprocess_exec(
                    sshd_path,
                    "-D",  # stay in the foreground: this process is the one to stop
                    "-e",  # log to stderr, which is sshd.log
                    "-f",
                    str(config),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                    start_new_session=True,
                    preexec_fn=lifeline.die_with_parent(),  # a killed sandbox leaves no sshd listening
                )
            if await self._wait_listening(port):
                log.debug("sshd %d listening on 127.0.0.1:%d", self._process.pid, port)
                return port
            reason = self._log_tail()
            if "Address already in use" not in reason and "Cannot bind" not in reason:
                break
        status = self._process.returncode if self._process is not None else None
        raise SshdFailed(f"sshd exited with status {status}: {reason or 'no output'} (see {self.log_path})")

    async def _wait_listening(self, port: int) -> bool:
        """True once the port accepts connections; False if sshd exits first."""
        assert self._process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LISTEN_TIMEOUT
        while self._process.returncode is None:
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if loop.time() > deadline:
                    raise SshdFailed(f"sshd did not listen on 127.0.0.1:{port} within {_LISTEN_TIMEOUT:g} s") from None
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return True
        return False

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-3:] if line.strip())

    async def stop_accepting(self) -> set[int]:
        """SIGTERM sshd and every process it forked; returns their process groups.

        sshd's connection processes call ``setsid`` and outlive the listener, so
        they are found (before the listener dies and they are reparented) by
        walking the process tree. Commands are in the tree too, as are their
        groups, which :func:`~.instances.kill_instance_processes` then kills.
        """
        process = self._process
        if process is None or process.returncode is not None:
            return set()
        self._forked = _descendants(process.pid)
        try:
            process.terminate()
        except ProcessLookupError:
            pass
        for pid, stat in self._forked.items():
            stat.signal(pid, signal.SIGTERM)
        return {stat.pgid for stat in self._forked.values()}

    async def finish(self) -> None:
        """Reap sshd; SIGKILL it, and anything it forked, if SIGTERM was not enough."""
        process = self._process
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE)
            except asyncio.TimeoutError:
                try:
                    process.kill()
                except ProcessLookupError:
                    pass
                await process.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0
        for pid, stat in self._forked.items():
            stat.signal(pid, signal.SIGKILL)
        while any(stat.alive(pid) for pid, stat in self._forked.items()) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._forked = {}


@dataclass(frozen=True)
class _ProcessStat:
    """What ``/proc/PID/stat`` says about a process, enough to recognise it later."""

    ppid: int
    pgid: int
    start_time: int

    def alive(self, pid: int) -> bool:
        """Still running, and still the same process (not a recycled pid)."""
        current = _read_stat(pid)
        return current is not None and current.start_time == self.start_time

    def signal(self, pid: int, sig: signal.Signals) -> None:
        if self.alive(pid):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _read_stat(pid: int) -> _ProcessStat | None:
    """The live (not zombie) process ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
        if fields[0] == b"Z":
            return None
        return _ProcessStat(ppid=int(fields[1]), pgid=int(fields[2]), start_time=int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def _descendants(root: int) -> dict[int, _ProcessStat]:
    """Every live process below ``root`` (empty where there is no ``/proc``)."""
    children: dict[int, list[tuple[int, _ProcessStat]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for name in entries:
        if name.isdigit():
            stat = _read_stat(int(name))
            if stat is not None:
                children.setdefault(stat.ppid, []).append((int(name), stat))
    found: dict[int, _ProcessStat] = {}
    pending = [root]
    while pending:
        for pid, stat in children.get(pending.pop(), []):
            if pid not in found:
                found[pid] = stat
                pending.append(pid)
    return found
