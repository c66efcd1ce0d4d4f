"""Issue 21 item 5: a stale pid file kills nothing, on a sandbox instance over real SSH.

``$HOME/.gpubench/<runtime>-serve.pid`` outlives a run killed before its teardown (or a
reboot); the pid in it may name an unrelated process since. The runtime that would
stop "the server an earlier run started" checks that the process is that server (its
start time and command line) and otherwise leaves it alive, drops the file and says so
in the cell's progress file (``STATUS: STALE_PID_FILE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage
from pytest_gpubench.matrix.cells import Cell, expand, parse_matrix
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.runtimes.ollama import SERVE_PID
from pytest_gpubench.runtimes.registry import runtime_for
from pytest_gpubench.store.progress import ProgressWriter


def cell_for(runtime: str) -> Cell:
    text = f"runtime: {runtime}\nmatrix:\n  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}}\n"
    (cell,) = expand(parse_matrix(text, "gpubench_stale.yaml"))
    return cell


@pytest.fixture(scope="module")
def instance(api: httpx.Client) -> Iterator[tuple[LoopThread, Connection]]:
    loop = LoopThread("stale-pid")
    record, key = new_session(api)
    conn = loop.run(connect(record, key), 60)
    yield loop, conn
    loop.run(conn.close(), 15)
    api.post(f"/api/v1/sessions/{record['id']}/done")
    loop.close()


def sh(instance: tuple[LoopThread, Connection], command: str, check: bool = True) -> Any:
    loop, conn = instance
    return loop.run(conn.run(command, stage=Stage.CLEANUP, what="test", timeout=30, check=check), 60)


def unrelated_sleep(instance) -> int:
    """A process of the instance's user that gpubench did not start."""
    return int(sh(instance, "nohup sleep 300 > /dev/null 2>&1 < /dev/null & echo $!").stdout)


def running(instance, pid: int) -> bool:
    """Alive: a process killed but not yet reaped (a zombie) is not."""
    state = sh(instance, f"sed -n 's/^State:[[:space:]]*//p' /proc/{pid}/status", check=False).stdout
    return state[:1] in ("R", "S", "D")


@pytest.mark.parametrize("runtime_name", ["vllm", "ollama"])
def test_a_pid_file_naming_an_unrelated_process_leaves_it_alive_and_the_progress_file_says_so(
        instance, tmp_path: Path, runtime_name: str):
    loop, conn = instance
    runtime = runtime_for(cell_for(runtime_name), conn)
    pid_file = SERVE_PID if runtime_name == "ollama" else runtime.spec.files("pid")
    sleeper = unrelated_sleep(instance)
    try:
        sh(instance, f'mkdir -p "$HOME/.gpubench"; echo {sleeper} > "{pid_file}"')
        progress = ProgressWriter(tmp_path / "cell.log")
        runtime.on_status = progress.status  # as the plugin's gpu_runtime fixture sets it
        if runtime_name == "vllm":  # starting a server first stops "the one an earlier run left"
            loop.run(runtime.ensure_installed(60), 120)
            loop.run(runtime.locate(30), 60)
            loop.run(runtime.ensure_serving(60, num_parallel=1), 120)
        loop.run(runtime.stop(30), 60)  # teardown on a machine left as found
        assert running(instance, sleeper), "the unrelated process was signalled"
        assert sh(instance, f'cat "{pid_file}"', check=False).stdout.strip() == "", "the stale file was not dropped"
        text = (tmp_path / "cell.log").read_text()
        assert f"STATUS: STALE_PID_FILE file={pid_file} pid={sleeper} now=sleep " in text, text
        assert "its command line is not the server's" in text
    finally:
        sh(instance, f"kill {sleeper}", check=False)
        loop.run(runtime.stop(30), 60)
