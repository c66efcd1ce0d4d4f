"""Host keys of machines a run does not rent: checked against known_hosts, or pinned on first use.

A rented instance's key cannot be known beforehand (``ssh.HostKeyPins`` pins it per
session). A host of the inventory can: :func:`connect_checked` looks its ``[host]:port``
up in the known_hosts files it is given (the inventory's own, the user's
``~/.ssh/known_hosts``, gpubench's pin file) and connects only to a server presenting one
of those keys; a changed key is an ``ssh_connect`` failure (:class:`HostKeyChanged`) naming
the key expected and the key presented. A host found in none is trusted on first use:
its key is appended to gpubench's own known_hosts file (``--gpubench-known-hosts``) and
the caller is told, so it can say so plainly; later runs check against it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import asyncssh

from ..errors import HostKeyChanged, Stage, StageError
from .ssh import KEEPALIVE_INTERVAL, Connection

_PIN_LOCK = threading.Lock()


def known_keys(files: Sequence[str], host: str, port: int) -> tuple[list[asyncssh.SSHKey], str]:
    """The trusted host keys of ``host:port`` and the file they are from: the first of ``files``
    that knows the host decides (an inventory's own file over the user's over gpubench's pins);
    ``([], "")`` when none does. Missing files are skipped."""
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            continue
        try:
            trusted = asyncssh.read_known_hosts(str(path)).match(host, "", port)[0]
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise StageError(Stage.SSH_CONNECT, f"cannot read the known_hosts file {path}: {exc}") from None
        if trusted:
            return list(trusted), str(path)
    return [], ""


def host_pattern(host: str, port: int) -> str:
    """How known_hosts names ``host:port`` (OpenSSH's rule: a port other than 22 in brackets)."""
    return host if port == 22 else f"[{host}]:{port}"


def pin(pin_file: str, host: str, port: int, key: asyncssh.SSHKey) -> Path:
    """Append ``key`` for ``host:port`` to ``pin_file`` (created 0600 in a 0700 folder)."""
    path = Path(pin_file).expanduser()
    line = f"{host_pattern(host, port)} {key.export_public_key('openssh').decode().strip()}\n"
    with _PIN_LOCK:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(line)
    return path


async def connect_checked(
    host: str, port: int, user: str, key_pem: str, *, known_hosts: Sequence[str], pin_file: str, timeout: float,
    agent: bool = False, keepalive_interval: float = KEEPALIVE_INTERVAL,
    on_pinned: Callable[[str, Path], None] | None = None, key_path: str = "",
) -> Connection:
    """SSH to a host whose key is checked against ``known_hosts`` (and ``pin_file``), or pinned
    into ``pin_file`` on first use (``on_pinned(fingerprint, pin_file)`` is told). ``key_path``:
    authenticate with that private key file, read where it is (``key_pem`` is then empty)."""
    files = [*known_hosts, pin_file] if pin_file else list(known_hosts)
    trusted, source = known_keys(files, host, port)
    agent_path = os.environ.get("SSH_AUTH_SOCK") if agent else None
    if agent and not agent_path:
        raise StageError(Stage.SSH_CONNECT, f"{user}@{host}:{port} authenticates with the ssh-agent, "
                                            "but SSH_AUTH_SOCK is not set")
    if trusted:
        try:
            return await Connection.open(host, port, user, key_pem, timeout=timeout,
                                         keepalive_interval=keepalive_interval, host_keys=trusted,
                                         agent_path=agent_path, key_path=key_path)
        except HostKeyChanged:
            presented = await _presented_key(host, port, trusted, timeout)
            expected = ", ".join(sorted({key.get_fingerprint() for key in trusted}))
            raise HostKeyChanged(host, port, expected, presented=presented, where=source) from None
    if not pin_file:
        raise StageError(Stage.SSH_CONNECT, f"the host key of {host}:{port} is in no known_hosts file and "
                                            "pinning on first use is off")
    conn = await Connection.open(host, port, user, key_pem, timeout=timeout, keepalive_interval=keepalive_interval,
                                 agent_path=agent_path, key_path=key_path)
    if conn.host_key is not None:
        path = await asyncio.to_thread(pin, pin_file, host, port, conn.host_key)
        if on_pinned is not None:
            on_pinned(conn.host_key_fingerprint, path)
    return conn


async def _presented_key(host: str, port: int, trusted: list[asyncssh.SSHKey], timeout: float) -> str:
    """The fingerprint of the key the server presents now, of the trusted keys' algorithms ("" when unknown)."""
    algorithms = sorted({key.get_algorithm() for key in trusted})
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(host, port, server_host_key_algs=algorithms,
                                                                  config=()), timeout)
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        return ""
    return key.get_fingerprint() if key is not None else ""
