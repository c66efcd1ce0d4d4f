"""The SSH server of one sandbox instance as OpenSSH's real ``sshd`` (``--ssh-server openssh``).

The default server (:mod:`.sshd`, asyncssh) is emulated; this one is the server
users meet on rented machines, so key formats, authentication and remote command
execution are proven against it. Per instance, ``<instance>/sshd/`` holds an
ed25519 host key (0600), ``authorized_keys`` with the session's public key, an
``sshd_config`` and sshd's log; ``sshd -D -e -f sshd_config`` runs as a child
process on a free loopback port.

The configuration keeps the asyncssh server's policy: user ``root`` with the
session key only, local (``-L``) forwards to loopback only, no terminals, agent,
X11 or subsystems. Commands get the instance's environment through ``SetEnv``,
which overrides sshd's own ``PATH`` and ``HOME``. sshd always starts sessions in
the passwd home of root (``/root``), so a ``ForceCommand`` (:data:`SESSION_COMMAND`)
moves to ``$HOME`` first and then ``exec``s ``bash -c "$SSH_ORIGINAL_COMMAND"``
(plain ``bash`` for a shell request): stdin, output, exit status and a killing
signal pass through untouched, as does the command text, which never goes
through a second round of parsing.

sshd only logs users in as root when it runs as root, so this server needs root.
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

import asyncssh

from ..errors import UsageProblem
from . import lifeline

log = logging.getLogger("pytest_gpubench.sandbox")

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
        "# One gpubench sandbox instance (pytest_gpubench.sandbox.openssh)",
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
