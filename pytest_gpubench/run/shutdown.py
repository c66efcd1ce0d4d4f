"""SIGTERM ends a run the way Ctrl-C does: orderly, with every teardown.

By default SIGTERM kills Python on the spot, so fixture teardowns never run and
rented GPU sessions stay billed. CI systems cancel jobs with SIGTERM, and so do
``timeout``, ``docker stop`` and ``kill``. While a run with benchmark cells is
active, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main
thread instead: pytest stops as after Ctrl-C and tears every fixture down, which
releases the sessions. Later SIGTERMs are ignored so they cannot cut those
teardowns short; SIGKILL remains the way to end the process at once.

The xdist controller passes the signal on to its workers, so they start their own
teardowns right away instead of waiting for the controller to shut them down.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by the first SIGTERM."""


class GracefulTermination:
    """Installs, and later removes, the SIGTERM handler of one pytest process."""

    def __init__(self, forward_to: Callable[[], list[int]] | None = None) -> None:
        self._forward_to = forward_to
        self._previous: Any = None
        self.installed = False
        self.received = False

    def install(self) -> bool:
        """Take over SIGTERM unless someone else already handles it; True when installed."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return self.installed
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False  # the user's, or a wrapper's: leave it alone
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Give SIGTERM back to what handled it before."""
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self.installed = False

    def _handle(self, signum: int, frame: object) -> None:
        if self.received:
            return  # already shutting down: let the teardowns finish
        self.received = True
        if self._forward_to is not None:
            for pid in self._forward_to():
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        print("\ngpubench: SIGTERM received: stopping after releasing GPU sessions", file=sys.stderr, flush=True)
        raise Terminated("SIGTERM: the run was stopped; sessions are released in teardown")
