"""The pid files of the servers gpubench starts on an instance, and the check before one is signalled.

A pid file (``$HOME/.gpubench/<runtime>-serve.pid``) outlives its server: a run killed
before its teardown, or a reboot, leaves it behind, and the pid in it may since have
been given to another process. Before a signal goes to it, the process must still be
the server gpubench started (issue 21 item 5): its start time (``/proc/PID/stat``'s
22nd field, kept beside the pid when the server starts, in ``<runtime>-serve.start``)
is the same, and its command line names the server's program. A process that is not
is left alone and the file dropped ("stale"); the caller says so in the progress file.
A pid file written before start times were kept is checked on its command line alone.

Everything here is shell run on the instance; only constants and quoted paths reach it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

#: The start time of ``$pid`` in clock ticks since boot (field 22 of ``/proc/PID/stat``; the
#: command name before it may hold spaces, hence everything up to ``) `` is cut first).
_START_OF_PID = 'sed "s/.*) //" "/proc/$pid/stat" 2>/dev/null | cut -d" " -f20'


def start_file(pid_file: str) -> str:
    """Where the start time of the process in ``pid_file`` is kept."""
    return pid_file[: -len(".pid")] + ".start" if pid_file.endswith(".pid") else pid_file + ".start"


def record(pid_file: str) -> str:
    """Shell run right after ``nohup SERVER ... &``: keeps ``$!`` and its start time."""
    return (f'echo $! > "{pid_file}"; pid=$!; {_START_OF_PID} > "{start_file(pid_file)}"')


def identify(pid_file: str, pattern: str) -> str:
    """Shell that prints what the pid file names, on one line: ``none`` (no file), ``gone`` (its
    process has ended; the file is removed), ``stale pid=N comm=NAME REASON`` (another process: the
    file is removed, the process left alone), or ``ours N`` (``$pid`` is then set). ``pattern`` is a
    shell ``case`` pattern the server's command line (its words joined by spaces, a space at each
    end) matches, such as ``*vllm*``."""
    pid_file_q, start_q = f'"{pid_file}"', f'"{start_file(pid_file)}"'
    return (
        f'pid=$(cat {pid_file_q} 2>/dev/null); '
        f'if [ -z "$pid" ]; then rm -f {start_q}; echo none; '
        f'else case "$pid" in *[!0-9]*) rm -f {pid_file_q} {start_q}; echo "stale pid=? comm=? not a pid"; '
        f'pid="";; esac; fi; '
        f'if [ -n "$pid" ]; then '
        f'if [ ! -r "/proc/$pid/stat" ]; then rm -f {pid_file_q} {start_q}; echo gone; pid=""; '
        f'else cmd=" $(tr "\\0" " " < "/proc/$pid/cmdline" 2>/dev/null) "; now=$({_START_OF_PID}); '
        f'was=$(cat {start_q} 2>/dev/null); comm=$(cat "/proc/$pid/comm" 2>/dev/null); why=""; '
        f'if [ -n "$was" ] && [ "$was" != "$now" ]; then why="started at another time than the server"; '
        f'else case "$cmd" in {pattern}) ;; *) why="its command line is not the server'"'"'s";; esac; fi; '
        f'if [ -n "$why" ]; then rm -f {pid_file_q} {start_q}; echo "stale pid=$pid comm=$comm $why"; pid=""; '
        f'else echo "ours $pid"; fi; fi; fi'
    )


def stop(pid_file: str, pattern: str, *, grace_steps: int) -> str:
    """Shell that signals the process in ``pid_file`` only when :func:`identify` says it is ours:
    SIGTERM, up to ``grace_steps`` tenths of a second to exit, SIGKILL; then prints ``stopped``
    (0 steps: SIGKILL at once). Prints :func:`identify`'s line first."""
    term = (f'kill -TERM "$pid" 2>/dev/null; i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt {int(grace_steps)} ]; '
            f'do sleep 0.1; i=$((i+1)); done; ') if grace_steps > 0 else ""
    return (f'{identify(pid_file, pattern)}; if [ -n "$pid" ]; then {term}kill -KILL "$pid" 2>/dev/null; '
            f'rm -f "{pid_file}" "{start_file(pid_file)}"; echo stopped; fi')


def word_pattern(word: str) -> str:
    """A ``case`` pattern for a command line that holds ``word`` (quoted: matched literally)."""
    return f"*{shlex.quote(word)}*"


@dataclass(frozen=True)
class Stale:
    """A pid file that named another process: what the progress file says about it."""

    pid: str
    #: ``/proc/PID/comm`` of the process it names now (instance output: only a name's characters kept).
    comm: str
    reason: str

    def fields(self, pid_file: str) -> dict[str, str]:
        """The progress line's fields (``STATUS: STALE_PID_FILE file=... pid=... now=... reason=...``)."""
        return {"file": pid_file, "pid": self.pid, "now": self.comm or "?", "reason": self.reason}


_STALE = re.compile(r"^stale pid=(\S*) comm=(.*?) (not a pid|started at another time than the server|"
                    r"its command line is not the server's)$", re.M)


def stale_in(output: str) -> Stale | None:
    """The :class:`Stale` finding :func:`identify` printed in ``output``, if any."""
    match = _STALE.search(output)
    if match is None:
        return None
    pid = match.group(1) if match.group(1).isdigit() else "?"
    comm = re.sub(r"[^A-Za-z0-9._:+-]", "", match.group(2))[:32]
    return Stale(pid=pid, comm=comm, reason=match.group(3))
