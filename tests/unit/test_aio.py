import asyncio
import threading

import pytest

from types import SimpleNamespace

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
