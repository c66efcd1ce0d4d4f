"""What a one-shot stand-in call answers: its stdout, stderr and exit status.

The stand-ins compute a call's whole answer as an :class:`Answer` first, so the same
code serves both ways a call reaches them: run as a Python module (:meth:`Answer.emit`
writes it to the process's streams) or asked through the instance's answering service
(:mod:`.standin_service` sends it back as ``sh`` for the wrapper to replay).
Stdlib only: the stand-in modules import it on every start.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """The complete, finished output of one call."""

    stdout: str = ""
    stderr: str = ""
    status: int = 0

    def emit(self) -> int:
        """Write the answer to this process's stdout and stderr; returns the exit status."""
        if self.stdout:
            sys.stdout.write(self.stdout)
            sys.stdout.flush()
        if self.stderr:
            sys.stderr.write(self.stderr)
            sys.stderr.flush()
        return self.status
