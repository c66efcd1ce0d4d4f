"""Which process owns a run, whether it still lives, and the xdist workers below it.

Cleanup must never release the sessions of a run that is still going on in another
process. A run records the identity of the process that owns it (the xdist
controller, or the single pytest process): pid, host, and where the system can tell,
the process's start time, so that a pid reused by an unrelated process after a
crash or a reboot is not mistaken for the run. Linux's ``/proc`` gives that start
time; elsewhere the pid alone is the evidence.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict

_PROC = Path("/proc")
#: What an execnet ``popen`` gateway (an xdist worker) runs: ``python -u -c <this>``.
_EXECNET_BOOTSTRAP = b"exec(eval(sys.stdin.readline()))"
#: This process's own nonce and the time it first named itself (:meth:`ProcessIdentity.current`).
_THIS_PROCESS: dict[int, tuple[str, str]] = {}


class ProcessIdentity(BaseModel):
    """A process, told apart from a later one that reuses its pid."""

    model_config = ConfigDict(frozen=True)

    pid: int
    host: str
    #: ``<boot id>:<start time in clock ticks>`` on Linux; ``None`` where unknown.
    start: str | None = None
    #: Random, drawn once per process: two containers with the same hostname and pid
    #: (``--network host``, a fixed ``hostname:``) still hold claims under different names.
    nonce: str | None = None
    #: When this process first named itself (ISO 8601, UTC, ms): a rerun it asks for
    #: restarts only cells that ended before then (its xdist workers get the same).
    since: str | None = None

    @classmethod
    def current(cls) -> ProcessIdentity:
        """This process (the same nonce and ``since`` on every call in it, new ones after a fork)."""
        pid = os.getpid()
        if pid not in _THIS_PROCESS:
            _THIS_PROCESS[pid] = (secrets.token_hex(4),
                                  datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
        nonce, since = _THIS_PROCESS[pid]
        return cls(pid=pid, host=socket.gethostname(), start=start_token(pid), nonce=nonce, since=since)

    def holder(self, worker: str | None = None) -> str:
        """The name this process's claims are held under: ``host:pid:nonce``, ``host:pid:nonce/gw0``
        for its xdist worker ``gw0``: unique across the machines, containers and processes sharing
        a store, each xdist worker's name known to its controller (cleanup after a crash), and
        ``host:pid`` first so that a process on this host can tell whether the holder lives."""
        base = f"{self.host}:{self.pid}:{self.nonce}" if self.nonce else f"{self.host}:{self.pid}"
        return f"{base}/{worker}" if worker else base

    def alive(self) -> bool | None:
        """True while this very process runs; None when that cannot be told (another host)."""
        if self.host != socket.gethostname():
            return None
        if not pid_alive(self.pid):
            return False
        if self.start is not None:
            now = start_token(self.pid)
            if now is not None and now != self.start:
                return False  # the pid now belongs to another process
        return True


def held_by(holder: str | None, scope: str) -> bool:
    """Whether a claim ``holder`` is ``scope`` or one of its xdist workers (``scope/gwN``)."""
    return holder is not None and (holder == scope or holder.startswith(f"{scope}/"))


def holder_alive(holder: str | None) -> bool | None:
    """Whether the process a claim ``holder`` names (``host:pid[:nonce][/gwN]``) runs: None when
    that cannot be told here (another host, or a name of another form)."""
    host, _, rest = (holder or "").partition(":")
    pid = rest.split("/", 1)[0].split(":", 1)[0]
    if not pid.isdigit() or host != socket.gethostname():
        return None
    return pid_alive(int(pid))


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the state field on (the command name may hold spaces)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_token(pid: int) -> str | None:
    """The boot id and start time of ``pid``, or None where ``/proc`` cannot tell."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    try:
        boot = (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{boot}:{fields[19]}"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process here (a zombie, dead but not yet reaped, is not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, it is someone else's
    fields = _stat_fields(pid)
    return not (fields and fields[0] in ("Z", "X"))


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return sorted(found)


def xdist_worker_pids(controller: int | None = None) -> list[int]:
    """The xdist workers (execnet popen gateways) that ``controller`` started."""
    pids = []
    for child in children(os.getpid() if controller is None else controller):
        try:
            cmdline = (_PROC / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        if _EXECNET_BOOTSTRAP in cmdline:
            pids.append(child)
    return pids
