"""The sandbox's processes end with it, however it ends.

A sandbox that stops normally kills every instance process itself
(:func:`.instances.kill_instance_processes`). One that is killed (SIGKILL, an OOM
kill, a CI runner cancelling the job) cannot, so its children end themselves:

- every process the sandbox starts directly (the shell of each SSH command, the
  on-start scripts, OpenSSH's ``sshd``) gets ``PR_SET_PDEATHSIG`` = SIGKILL on
  Linux (:func:`die_with_parent`): the kernel kills it when the sandbox dies;
- a daemon an instance starts (``nohup ollama serve &``: its shell exits at once
  and it is reparented, so a death signal would fire too early, or never) watches
  the sandbox instead: the instance environment names the sandbox process in
  ``GPUBENCH_SANDBOX_OWNER`` (``pid:start time``, so a recycled pid is not taken for
  it) and :func:`watch_owner` stops the daemon when that process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping

log = logging.getLogger("pytest_gpubench.sandbox")

OWNER_ENV = "GPUBENCH_SANDBOX_OWNER"
#: How often a daemon without pidfd support looks whether its sandbox still lives.
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22),
    "" where there is no ``/proc``, None when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = stat.rsplit(b")", 1)[-1].split()
    if fields and fields[0] in (b"Z", b"X"):
        return None  # dead, waiting for its parent to reap it
    return fields[19].decode() if len(fields) > 19 else ""


def owner_token(pid: int | None = None) -> str:
    """``pid:start time`` of this process (or ``pid``): the value of ``GPUBENCH_SANDBOX_OWNER``."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid) or ''}"


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (zombies count as gone when reapable)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(token: str) -> bool:
    """Whether the process ``token`` names still runs (a malformed token: assume it does)."""
    pid_text, _, started = token.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return True
    if not os.path.isdir("/proc/self"):
        return process_alive(pid)
    now = _start_time(pid)
    if now is None:
        return False
    return not started or not now or now == started


async def watch_owner(on_gone: Callable[[], None], environ: Mapping[str, str] | None = None) -> None:
    """Call ``on_gone`` once the sandbox named in ``GPUBENCH_SANDBOX_OWNER`` has died.

    Returns at once without the variable (a stand-in run by hand). Uses a pidfd
    where the kernel has them (woken the moment the process exits), else polls.
    """
    env = os.environ if environ is None else environ
    token = env.get(OWNER_ENV, "").strip()
    if not token:
        return
    pidfd = None
    with contextlib.suppress(AttributeError, OSError, ValueError):
        pidfd = os.pidfd_open(int(token.partition(":")[0]))  # type: ignore[attr-defined]
    try:
        # Checked after opening the pidfd: the process it names is the owner, not a
        # later one that took its pid.
        if pidfd is not None and owner_alive(token):
            gone = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_reader(pidfd, gone.set)
            try:
                await gone.wait()
            finally:
                loop.remove_reader(pidfd)
        else:
            while owner_alive(token):
                await asyncio.sleep(POLL_SECONDS)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    log.info("the sandbox that started this instance (%s) is gone: exiting", token)
    on_gone()


@functools.cache
def _load_prctl() -> Callable[[int, int], int] | None:
    # Resolved once, in the parent: the child between fork and exec must not load libraries.
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # libc's, linked into the interpreter
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl



def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the sandbox dies
    (Linux); None elsewhere. The child also exits at once if its parent is already
    gone by the time it runs (the signal would then never come)."""
    prctl = _load_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
