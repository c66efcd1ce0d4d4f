"""Host keys of machines a run does not rent: checked against known_hosts, or pinned on first use.

A rented instance's key cannot be known beforehand (``ssh.HostKeyPins`` pins it per
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
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from ..errors import HostKeyChanged, Stage, StageError
from .ssh import KEEPALIVE_INTERVAL, Connection

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
