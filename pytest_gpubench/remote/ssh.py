"""SSH to an instance with asyncssh: commands, streamed scripts, port forwards.

Everything that reaches the remote shell goes through ``shlex.quote`` or is a
constant of this package; scripts are written to the command's stdin, never
pasted into a command line.

Host keys of machines a run does not rent: checked against known_hosts, or pinned on first use
----------------------------------------------------------------------------------------------

A rented instance's key cannot be known beforehand (:class:`HostKeyPins` pins it per
session). A host of the inventory can: :func:`connect_checked` looks its ``[host]:port``
up in the known_hosts files it is given (the inventory's own, the user's
``~/.ssh/known_hosts``, gpubench's pin file) and connects only to a server presenting one
of those keys; a changed key is an ``ssh_connect`` failure (:class:`HostKeyChanged`) naming
the key expected and the key presented. A host found in none is trusted on first use:
its key is appended to gpubench's own known_hosts file (``--gpubench-known-hosts``) and
the caller is told, so it can say so plainly; later runs check against it. Without a pin file
(``--gpubench-host-keys strict``) such a host is refused instead, naming the key it presented.

``@cert-authority`` entries count as knowing the host (a host certificate signed by one of
them is accepted, nothing is pinned) and ``@revoked`` keys, from every file, are refused,
pinned or not. Pinning is safe across processes: the pin file is locked (``fcntl``) and
re-read inside the lock, so two xdist workers meeting a new host pin it once, and one that
met another key than the one just pinned is refused.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shlex
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import asyncssh

from ..errors import HostKeyChanged, RemoteCommandError, Stage, StageError
from ..ids import check_id, path_under

#: SSH keepalives notice a dead instance in about a minute instead of at the
#: stage timeout (seed 001: "Connection lost - periodic heartbeat check").
KEEPALIVE_INTERVAL = 15
KEEPALIVE_COUNT_MAX = 4
#: However small the time scale, keepalives go no faster than this: a busy
#: machine must not mistake a slow answer for a dead instance (4 x 3 s = 12 s).
MIN_KEEPALIVE_INTERVAL = 3.0


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    exit_status: int | None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class KeyFile:
    """The session's private key as a 0600 file in a private 0700 directory.

    Users can ``ssh -i`` with it while a cell runs; ``remove()`` deletes both.
    ``name`` (the session id) must be an id (:mod:`pytest_gpubench.ids`: ``InvalidId``
    otherwise, before anything is made), so the file stays in its folder; a write that
    fails leaves nothing behind.
    """

    def __init__(self, key_pem: str, name: str = "session") -> None:
        file_name = f"{check_id(name, 'session id')}.pem"
        self.dir = Path(tempfile.mkdtemp(prefix="gpubench-key-"))
        self.path = path_under(self.dir, file_name)
        try:
            os.chmod(self.dir, 0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(key_pem if key_pem.endswith("\n") else key_pem + "\n")
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for path in (self.path, self.dir):
            try:
                path.unlink() if path.is_file() else path.rmdir()
            except FileNotFoundError:
                pass


class HostKeyPins:
    """Trust on first use, per session: the host key of each session's first connection.

    A rented instance's host key cannot be known in advance, so the first
    connection to a session accepts whatever key the server shows and pins it;
    every later connection to the same session (a reconnect, a reused session)
    must meet the same key or is refused with :class:`HostKeyChanged`.
    Thread-safe: sessions may be shared between cells of one process.
    """

    def __init__(self) -> None:
        self._keys: dict[str, asyncssh.SSHKey] = {}
        self._lock = threading.Lock()

    def pinned(self, session_id: str) -> asyncssh.SSHKey | None:
        """The pinned host key of ``session_id``, or None before its first connection."""
        with self._lock:
            return self._keys.get(session_id)

    def fingerprint(self, session_id: str) -> str:
        """``SHA256:...`` of the pinned key, or ``""``."""
        key = self.pinned(session_id)
        return key.get_fingerprint() if key is not None else ""

    async def connect(
        self, session_id: str, host: str, port: int, user: str, key_pem: str, *, timeout: float,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
    ) -> Connection:
        """Open SSH to ``session_id``'s instance, pinning its host key on the first connection."""
        conn = await Connection.open(host, port, user, key_pem, timeout=timeout,
                                     keepalive_interval=keepalive_interval, host_key=self.pinned(session_id))
        presented = conn.host_key
        if presented is not None:
            with self._lock:
                first = self._keys.setdefault(session_id, presented)
            # Two first connections racing each other: the loser must still match.
            if first.public_data != presented.public_data:
                await conn.close()
                raise HostKeyChanged(host, port, first.get_fingerprint())
        return conn


class Connection:
    """One SSH connection to one instance."""

    def __init__(self, conn: asyncssh.SSHClientConnection, host: str, port: int) -> None:
        self._conn = conn
        self.host = host
        self.port = port
        self.host_key_fingerprint = ""
        # Exit status and stderr tail of the last ``stream_lines`` command.
        self.last_exit_status: int | None = None
        self.last_stderr = ""
        #: The server's host key (public), None with GSS key exchange.
        self.host_key: asyncssh.SSHKey | None = conn.get_server_host_key()
        if self.host_key is not None:
            self.host_key_fingerprint = self.host_key.get_fingerprint()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        user: str,
        key_pem: str,
        *,
        timeout: float,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
        host_key: asyncssh.SSHKey | None = None,
        host_keys: list[asyncssh.SSHKey] | None = None,
        ca_keys: list[asyncssh.SSHKey] | None = None,
        revoked_keys: list[asyncssh.SSHKey] | None = None,
        agent_path: str | None = None,
        key_path: str = "",
    ) -> Connection:
        """Connect with the session key; failures become ``ssh_connect`` errors.

        With ``host_key``, the server must present exactly that key: anything else
        is refused during the key exchange, before the client authenticates.
        Without it any host key is accepted (a fresh instance has no known one);
        :class:`HostKeyPins` remembers the first one per session. ``host_keys``: any of them
        (a host's known_hosts entries), or a host certificate signed by one of ``ca_keys``; never one
        of ``revoked_keys``. ``agent_path``: authenticate with that ssh-agent
        (``key_pem`` may then be empty). ``key_path``: with that private key file, read where it is
        (a host's: never copied; its certificate ``-cert.pub`` too); an unreadable one is an
        ``ssh_connect`` error.
        """
        trusted = host_keys or ([host_key] if host_key is not None else None)
        checked = bool(trusted or ca_keys)
        keys: list[Any] | None
        try:
            if key_path:
                keys = asyncssh.load_keypairs([key_path])
            elif key_pem or agent_path is None:
                keys = [asyncssh.import_private_key(key_pem)]
            else:
                keys = None
        except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError, OSError, ValueError) as exc:
            # The exception text never quotes the key; keep it that way.
            what = f"the key file {key_path}" if key_path else "the session's private key"
            raise StageError(Stage.SSH_CONNECT, f"{what} is unusable: {exc}") from None
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    host,
                    port,
                    username=user,
                    client_keys=keys,
                    # (trusted host keys, trusted CA keys, revoked keys), or no check at all.
                    known_hosts=(trusted or [], ca_keys or [], revoked_keys or []) if checked else None,
                    agent_path=agent_path,
                    config=(),
                    keepalive_interval=keepalive_interval,
                    keepalive_count_max=KEEPALIVE_COUNT_MAX,
                    connect_timeout=timeout,
                ),
                timeout,
            )
        except (asyncssh.HostKeyNotVerifiable, asyncssh.KeyExchangeFailed) as exc:
            if not checked:
                raise StageError(Stage.SSH_CONNECT, f"cannot open SSH to {user}@{host}:{port}: {exc}") from None
            # A server without the pinned key's algorithm fails the key exchange instead.
            raise HostKeyChanged(host, port, trusted[0].get_fingerprint() if trusted else "a CA-signed key") from None
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise StageError(
                Stage.SSH_CONNECT, f"cannot open SSH to {user}@{host}:{port}: {reason}"
            ) from None
        return cls(conn, host, port)

    async def run(
        self,
        command: str,
        *,
        stage: Stage,
        what: str,
        timeout: float,
        stdin: str | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``command`` (already quoted) and return its output.

        Raises ``RemoteCommandError`` with the exit status and stderr tail when
        ``check`` and it fails, and ``StageError`` on timeout or a lost link.
        """
        try:
            result = await asyncio.wait_for(
                self._conn.run(command, input=stdin, check=False), timeout
            )
        except asyncio.TimeoutError:
            raise StageError(stage, f"{what} did not finish within {timeout:.0f} s") from None
        except (OSError, asyncssh.Error) as exc:
            raise StageError(stage, f"{what}: SSH connection lost ({exc or type(exc).__name__})") from None
        done = CommandResult(_text(result.stdout), _text(result.stderr), result.exit_status)
        if check and not done.ok:
            raise RemoteCommandError(stage, what, done.exit_status, done.stderr or done.stdout)
        return done

    async def stream_lines(self, command: str, *, stdin: str) -> AsyncIterator[str]:
        """Start ``command``, write ``stdin`` and close it, then yield stdout lines.

        The process is terminated if the caller stops iterating early.
        """
        process = await self._conn.create_process(command, encoding="utf-8", errors="replace")
        try:
            process.stdin.write(stdin)
            process.stdin.write_eof()
            async for line in process.stdout:
                if not line:  # EOF
                    break
                yield line.rstrip("\n")
            # wait() collects what is left of stderr: read it from its result, not the drained stream.
            completed = await process.wait()
            self.last_exit_status = process.exit_status
            self.last_stderr = _text(completed.stderr)[-2000:]
        finally:
            if process.exit_status is None:
                process.terminate()
                process.close()

    async def forward(self, remote_host: str, remote_port: int) -> int:
        """Forward a free local loopback port to ``remote_host:remote_port``."""
        listener = await self._conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
        return listener.get_port()

    @property
    def closed(self) -> bool:
        return self._conn.is_closed()

    def set_keepalive(self, interval: float, count_max: int = KEEPALIVE_COUNT_MAX) -> None:
        """Probe the link after ``interval`` silent seconds; ``count_max`` unanswered probes close it."""
        self._conn.set_keepalive(interval, count_max)

    def abort(self) -> None:
        """Drop the connection at once, without a goodbye: for an instance known to be gone,
        whose silent link would make every later command wait for its timeout."""
        self._conn.abort()

    async def close(self) -> None:
        self._conn.close()
        try:
            await asyncio.wait_for(self._conn.wait_closed(), 5)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass


def quote(value: str) -> str:
    """Quote one word for a POSIX shell."""
    return shlex.quote(value)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


# ---------------------------------- host keys of machines a run does not rent

_PIN_LOCK = threading.Lock()


@dataclass
class KnownHostKeys:
    """What known_hosts files say of one ``host:port``: asyncssh's (trusted, CA, revoked) triple."""

    #: Host keys trusted as they are, and CA keys whose host certificates are (``@cert-authority``),
    #: both from the first file that knows the host.
    trusted: list[asyncssh.SSHKey] = field(default_factory=list)
    ca: list[asyncssh.SSHKey] = field(default_factory=list)
    #: Keys refused (``@revoked``), from every file.
    revoked: list[asyncssh.SSHKey] = field(default_factory=list)
    #: The file the trusted and CA keys are from ("" when none knows the host).
    source: str = ""

    @property
    def known(self) -> bool:
        """Whether the host is known (its key is checked, not pinned on first use)."""
        return bool(self.trusted or self.ca)

    def is_revoked(self, key: asyncssh.SSHKey) -> bool:
        return any(key.public_data == bad.public_data for bad in self.revoked)


def known_keys(files: Sequence[str], host: str, port: int) -> KnownHostKeys:
    """What ``files`` say of ``host:port``: the first that knows the host (a host key or a CA for it)
    decides what is trusted (an inventory's own file over the user's over gpubench's pins); revoked keys
    are gathered from all. Missing files are skipped."""
    found = KnownHostKeys()
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            continue
        try:
            entries = asyncssh.read_known_hosts(str(path))
            trusted, ca, revoked = entries.match(host, "", port)[:3]
            # match() retries without the port when nothing trusts [host]:port, dropping that name's
            # @revoked lines: ask for them by the bracketed name itself.
            revoked = [*revoked, *entries.match(host_pattern(host, port), "", None)[2]]
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise StageError(Stage.SSH_CONNECT, f"cannot read the known_hosts file {path}: {exc}") from None
        found.revoked += revoked
        if not found.known and (trusted or ca):
            found.trusted, found.ca, found.source = list(trusted), list(ca), str(path)
    return found


def host_pattern(host: str, port: int) -> str:
    """How known_hosts names ``host:port`` (OpenSSH's rule: a port other than 22 in brackets)."""
    return host if port == 22 else f"[{host}]:{port}"


def pin(pin_file: str, host: str, port: int, key: asyncssh.SSHKey) -> bool:
    """Append ``key`` for ``host:port`` to ``pin_file`` (created 0600 in a 0700 folder) unless it is
    pinned there already; True when it was appended. The file is locked while it is re-read and
    written, so another process (an xdist worker) pinning the same host meanwhile is seen: its key,
    when not ``key``, raises :class:`HostKeyChanged`."""
    path = Path(pin_file).expanduser()
    line = f"{host_pattern(host, port)} {key.export_public_key('openssh').decode().strip()}\n"
    with _PIN_LOCK:  # threads of one process; flock below: other processes
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            pinned = known_keys([str(path)], host, port).trusted
            if any(key.public_data == other.public_data for other in pinned):
                return False
            if pinned:
                raise HostKeyChanged(host, port, pinned[0].get_fingerprint(), presented=key.get_fingerprint(),
                                     where=str(path))
            handle.write(line)
    return True


async def connect_checked(
    host: str, port: int, user: str, key_pem: str, *, known_hosts: Sequence[str], pin_file: str, timeout: float,
    agent: bool = False, keepalive_interval: float = KEEPALIVE_INTERVAL,
    on_pinned: Callable[[str, Path], None] | None = None, key_path: str = "",
) -> Connection:
    """SSH to a host whose key is checked against ``known_hosts`` (and ``pin_file``), or pinned
    into ``pin_file`` on first use (``on_pinned(fingerprint, pin_file)`` is told). ``key_path``:
    authenticate with that private key file, read where it is (``key_pem`` is then empty)."""
    files = [*known_hosts, pin_file] if pin_file else list(known_hosts)
    keys = await asyncio.to_thread(known_keys, files, host, port)
    agent_path = os.environ.get("SSH_AUTH_SOCK") if agent else None
    if agent and not agent_path:
        raise StageError(Stage.SSH_CONNECT, f"{user}@{host}:{port} authenticates with the ssh-agent, "
                                            "but SSH_AUTH_SOCK is not set")
    if keys.known:
        try:
            return await Connection.open(host, port, user, key_pem, timeout=timeout,
                                         keepalive_interval=keepalive_interval, host_keys=keys.trusted,
                                         ca_keys=keys.ca, revoked_keys=keys.revoked,
                                         agent_path=agent_path, key_path=key_path)
        except HostKeyChanged:
            presented = await _presented_key(host, port, keys.trusted + keys.ca, timeout)
            if presented and presented in {key.get_fingerprint() for key in keys.revoked}:
                raise _revoked(host, port, presented) from None
            expected = ", ".join(sorted({key.get_fingerprint() for key in keys.trusted}))
            if not expected:  # known through a CA only: no certificate of it, or a revoked one
                raise StageError(Stage.SSH_CONNECT, f"the SSH host key of {host}:{port} ({presented or 'unknown'}) "
                                                    f"is not certified by the CA that {keys.source} trusts for it, "
                                                    "or its certificate is revoked; refusing to connect") from None
            raise HostKeyChanged(host, port, expected, presented=presented, where=keys.source) from None
    if not pin_file:
        # Strict mode (--gpubench-host-keys strict): an unknown key is refused before authenticating.
        presented = await _presented_key(host, port, [], timeout)
        raise StageError(Stage.SSH_CONNECT, f"the SSH host key of {host}:{port} ({presented or 'unknown'}) is in "
                                            f"no known_hosts file ({', '.join(files) or 'none given'}) and "
                                            "--gpubench-host-keys is strict: refusing to connect; check the key "
                                            f"and add it to one of them (ssh-keyscan -p {port} {host})")
    conn = await Connection.open(host, port, user, key_pem, timeout=timeout, keepalive_interval=keepalive_interval,
                                 agent_path=agent_path, key_path=key_path)
    try:
        if conn.host_key is not None:
            if keys.is_revoked(conn.host_key):
                raise _revoked(host, port, conn.host_key_fingerprint)
            if await asyncio.to_thread(pin, pin_file, host, port, conn.host_key) and on_pinned is not None:
                on_pinned(conn.host_key_fingerprint, Path(pin_file).expanduser())
    except BaseException:
        await conn.close()
        raise
    return conn


def _revoked(host: str, port: int, fingerprint: str) -> StageError:
    return StageError(Stage.SSH_CONNECT, f"the SSH host key of {host}:{port} ({fingerprint}) is marked @revoked "
                                         "in a known_hosts file; refusing to connect")


async def _presented_key(host: str, port: int, trusted: list[asyncssh.SSHKey], timeout: float) -> str:
    """The fingerprint of the key the server presents now, of the trusted keys' algorithms (any without
    them; "" when unknown)."""
    algorithms = sorted({key.get_algorithm() for key in trusted}) or "default"
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(host, port, server_host_key_algs=algorithms,
                                                                  config=()), timeout)
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        return ""
    return key.get_fingerprint() if key is not None else ""
