import asyncio
import ssl
import threading
from types import SimpleNamespace

import pytest

from pytest_gpubench import aio
from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import BridgeTimeout, GpubenchError, Stage
from pytest_gpubench.plugin.collect import describe_failure
from pytest_gpubench.plugin.stash import RECORDER_KEY


@pytest.fixture
def loop_thread():
    thread = LoopThread("test-loop")
    yield thread
    thread.close()


def test_runs_coroutines_on_its_own_thread(loop_thread):
    async def where():
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert loop_thread.run(where(), timeout=10) == "test-loop"


def test_timeout_cancels_the_coroutine(loop_thread):
    cancelled = threading.Event()

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError, match="timed out after 0 s") as caught:
        loop_thread.run(forever(), timeout=0.2)
    assert cancelled.wait(10)
    assert isinstance(caught.value, BridgeTimeout) and isinstance(caught.value, GpubenchError)


def test_a_bridge_timeout_is_reported_at_the_cell_s_stage_not_as_a_traceback(loop_thread):
    with pytest.raises(BridgeTimeout) as caught:
        loop_thread.run(asyncio.Event().wait(), timeout=0.1)
    recorder = SimpleNamespace(stage=Stage.MODEL_PULL, progress=SimpleNamespace(path="reports/progress/x.txt"),
                               session_id=None)
    item = SimpleNamespace(stash={RECORDER_KEY: recorder})
    assert describe_failure(caught.value, item) == (
        "[model_pull] timed out after 0 s\nprogress file: reports/progress/x.txt")


def test_errors_propagate_unchanged(loop_thread):
    async def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        loop_thread.run(fail(), timeout=10)


def test_close_stops_pending_work():
    thread = LoopThread()
    started = threading.Event()

    async def forever():
        started.set()
        await asyncio.Event().wait()

    asyncio.run_coroutine_threadsafe(forever(), thread.loop)
    assert started.wait(10)
    thread.close()
    assert thread.loop.is_closed()


SIGNAL_ON_THE_LOOP_THREAD = """
import asyncio, signal, sys, time
from pytest_gpubench.aio import LoopThread

# Python's own Ctrl-C handler, also when this process was started with SIGINT ignored (CI in the background).
signal.signal(signal.SIGINT, signal.default_int_handler)
thread = LoopThread("probe-loop")
started = time.monotonic()
# Ctrl-C to a process group goes to any thread; here, deliberately, to the loop's.
thread.loop.call_later(0.3, signal.pthread_kill, thread._thread.ident, signal.SIGINT)
try:
    thread.run(asyncio.sleep(30), timeout=60)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.2f} s")
    sys.exit(0)
print("not interrupted")
"""


def test_ctrl_c_delivered_to_the_loops_thread_still_interrupts_the_waiting_main_thread():
    """The kernel gives a process-wide SIGINT to any thread. Python runs the handler in the main
    thread only when it next runs bytecode: one long blocking wait put Ctrl-C off until the
    benchmark ended (a run under CI load hung for minutes)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SIGNAL_ON_THE_LOOP_THREAD], capture_output=True, text=True,
                          timeout=50)
    assert done.stdout.startswith("interrupted after"), (done.stdout, done.stderr[-2000:])
    assert float(done.stdout.split()[2]) < 5.0


def test_a_coroutines_own_timeout_error_is_raised_as_it_is_not_as_the_bridges(loop_thread):
    async def gives_up():
        raise TimeoutError("the server did not answer")

    with pytest.raises(TimeoutError, match="the server did not answer") as caught:
        loop_thread.run(gives_up(), timeout=10)
    assert not isinstance(caught.value, BridgeTimeout)


def test_every_http_client_shares_one_tls_context_with_httpx_s_default_verification(monkeypatch):
    # httpx builds a context per client (certifi's bundle loaded each time); the runtimes make
    # a client per call to the model server, so the context is built once per process.
    import httpx

    built = []

    def create(*args, **kwargs):
        built.append((args, kwargs))
        return real(*args, **kwargs)

    real = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", create)
    aio.tls_context.cache_clear()
    try:
        clients = [aio.http_client("http://127.0.0.1:9", 5) for _ in range(3)]
        assert len(built) == 1 and built[0] == ((), {})  # the default: verification on, certifi's CAs
        context = aio.tls_context()
        assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
        for client in clients:
            assert isinstance(client, httpx.AsyncClient) and str(client.base_url) == "http://127.0.0.1:9"
    finally:
        aio.tls_context.cache_clear()
