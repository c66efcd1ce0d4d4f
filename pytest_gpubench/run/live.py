"""Live progress in the terminal, read from the cells' progress files.

The progress files are written by whichever process runs a cell (the main
process, or an xdist worker that has no terminal), so the process that owns the
terminal follows them, like ``tail -f``, and prints what is new: provisioning
waits, model pull percentages, benchmark requests and tokens/s so far.

Only what happens during this run is shown: a file that exists when the follower
is created (a resumed run appends to its cells' files) is read from its size at
that moment, never from its start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Line kinds worth a person's attention while a cell runs.
SHOWN = ("STATUS:", "PROGRESS:", "ERROR:")


class LiveProgress:
    """Follows every ``*.log`` under one directory and prints new lines.

    :meth:`poll` may be called from any thread (the follower's own, and the hooks
    that flush a cell's lines before pytest reports it): a line is printed once.
    """

    def __init__(self, directory: Path, write: Callable[[str], None], interval: float = 0.5) -> None:
        self.directory = directory
        self.write = write
        self.interval = interval
        # What is there already belongs to an earlier run (or attempt) of this run id.
        self._offsets: dict[Path, int] = {path: path.stat().st_size for path in self._logs()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpubench-live", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()  # the last lines of cells that just ended

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except OSError:
                continue

    def _logs(self) -> list[Path]:
        return sorted(self.directory.glob("*.log")) if self.directory.is_dir() else []

    def poll(self) -> list[str]:
        """Print (and return) the complete lines added since the last poll."""
        with self._lock:
            shown: list[str] = []
            for path in self._logs():
                offset = self._offsets.get(path, 0)
                with path.open("rb") as handle:
                    if handle.seek(0, 2) < offset:  # written anew since: read it from its start
                        offset = 0
                    handle.seek(offset)
                    chunk = handle.read()
                end = chunk.rfind(b"\n") + 1  # leave a half-written line for next time
                if end == 0:
                    continue
                self._offsets[path] = offset + end
                for raw in chunk[:end].decode("utf-8", "replace").splitlines():
                    text = raw.split("] ", 1)[-1]
                    if text.startswith(SHOWN):
                        line = f"gpubench {path.stem}: {text}"
                        shown.append(line)
                        self.write(line)
            return shown


def own_line(config: Any, reporter: Any, line: str, **markup: bool) -> None:
    """Write ``line`` into pytest's terminal on a line of its own.

    ``TerminalReporter.write_line`` starts a new line only after a file's path
    (``currentfspath``); after the status letters and the ``[100%]`` that pytest
    writes without one (always under xdist), the terminal writer's current line is
    not empty: end it first.
    """
    if reporter.currentfspath is None and config.get_terminal_writer().width_of_current_line:
        reporter.write("\n")
    reporter.write_line(line, **markup)
