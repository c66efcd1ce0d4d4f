"""One asyncio event loop per process, in a background thread, and a sync bridge.

asyncssh connections and the httpx.AsyncClient must live on one loop for their
whole life, while pytest fixtures and test bodies are synchronous. Running the
loop in a daemon thread keeps the main thread free, so pytest-timeout's signal
method and Ctrl-C still interrupt a test that waits on the network.

The main thread waits in short slices (:data:`SIGNAL_SLICE_SECONDS`): the kernel hands
a process-wide signal (Ctrl-C to the process group, SIGALRM) to any thread, and when
that is the loop's thread, Python runs the handler (KeyboardInterrupt) only once the
main thread next executes bytecode, which one long blocking wait would put off until
the whole benchmark ended.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ssl
import threading
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import BridgeTimeout

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")

#: The longest the main thread blocks at once while waiting on the loop: how late, at
#: most, a signal the kernel gave another thread is acted on.
SIGNAL_SLICE_SECONDS = 0.25


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verification (certifi's CA bundle), built once per process, for
    every client that does not bring its own (``verify=tls_context()``).

    httpx builds and loads a new context for each client, about 18 ms of CPU, even for a
    plain-HTTP URL; the runtimes make a client per call to the model server through the
    SSH tunnel (each poll of a starting server's version, each pull, each warm-up), which
    made TLS set-up 5% of a sandbox cell's CPU. One context serves every client, on any thread.
    """
    import httpx  # here, not at the top: the hooks import this module in every pytest run

    return httpx.create_ssl_context()


def http_client(base_url: str, timeout: float | httpx.Timeout, **options: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for ``base_url`` with the process's one :func:`tls_context`."""
    import httpx

    return httpx.AsyncClient(base_url=base_url, timeout=timeout, verify=tls_context(), **options)


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str = "gpubench-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result in the calling thread.

        On timeout (or when the caller is interrupted, e.g. KeyboardInterrupt or
        pytest-timeout's signal), the coroutine is cancelled so nothing keeps
        running behind the caller's back; :class:`~.errors.BridgeTimeout` (a
        ``TimeoutError``) is raised on timeout.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = SIGNAL_SLICE_SECONDS if deadline is None else deadline - time.monotonic()
                try:
                    return future.result(max(0.0, min(left, SIGNAL_SLICE_SECONDS)))
                except concurrent.futures.TimeoutError:
                    if future.done():  # the coroutine's own TimeoutError, not the wait's
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise BridgeTimeout(timeout) from None
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what is still running, stop the loop and join the thread."""
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5)
        except Exception:  # noqa: BLE001 - closing must not fail the run
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


_shared: LoopThread | None = None
_lock = threading.Lock()


def shared_loop() -> LoopThread:
    """The process's loop thread, started on first use."""
    global _shared
    with _lock:
        if _shared is None or _shared.loop.is_closed():
            _shared = LoopThread()
        return _shared


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Shorthand for ``shared_loop().run(coro, timeout)``."""
    return shared_loop().run(coro, timeout)
