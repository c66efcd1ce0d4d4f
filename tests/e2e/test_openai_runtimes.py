"""The OpenAI-server runtimes (``vllm``, ``sglang``, ``tgi``, ``llamacpp``) on sandbox instances, over real SSH.

What the contract suite (test_runtime_contract.py) does not show for each of them: a
server that fails at load fails the stage at once with its own words from its log;
a crash or a hang mid-benchmark is met by the one restart; stop leaves no server on
the instance; the port is picked free on the instance (so two instances of one
sandbox serve at once, the old fixed-port collision), a port found taken is
replaced, and a fixed ``runtime.port`` adopts a server found running there and
leaves it running.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import Cell, expand, parse_matrix
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.runtimes.ollama import SERVE_PID
from pytest_gpubench.runtimes.openai_server import PICKED_PORTS, OpenAIServerRuntime
from pytest_gpubench.runtimes.registry import runtime_for

MODEL = "qwen2:1.5b"
OPENAI_RUNTIMES = ("vllm", "sglang", "tgi", "llamacpp")
#: Each server's own words for a model that does not exist, and one that does not fit an RTX 4090.
UNKNOWN_MODEL_WORDS = {"vllm": "is not a valid model identifier", "sglang": "is not a valid model identifier",
                       "tgi": "RepositoryNotFoundError", "llamacpp": "failed to open GGUF file"}
OOM_WORDS = {"vllm": "CUDA out of memory", "sglang": "Not enough memory", "tgi": "ShardCannotStart",
             "llamacpp": "cudaMalloc failed: out of memory"}
T = TypeVar("T")


def cell_for(name: str, model: str = MODEL, port: int | None = None) -> Cell:
    runtime = f"{{name: {name}, port: {port}}}" if port else name
    text = f"runtime: {runtime}\nmatrix:\n  - {{gpu: RTX 4090, provider: vastai, model: '{model}'}}\n"
    (cell,) = expand(parse_matrix(text, "gpubench_openai.yaml"))
    return cell


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("openai-runtimes")
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def session(api: httpx.Client, loop: LoopThread) -> Iterator[tuple[dict[str, Any], Connection]]:
    """One running sandbox session for the module, and an SSH connection to it."""
    record, key = new_session(api)
    conn = loop.run(connect(record, key), 60)
    yield record, conn
    loop.run(conn.close(), 15)
    api.post(f"/api/v1/sessions/{record['id']}/done")


@pytest.fixture
def run(loop: LoopThread):
    def run(coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return loop.run(coro, timeout)

    return run


@pytest.fixture
def started(session, run, request) -> Iterator[list[OpenAIServerRuntime]]:
    """Runtimes a test starts; each is stopped after it, so the next test finds the instance clear."""
    runtimes: list[OpenAIServerRuntime] = []
    yield runtimes
    for runtime in runtimes:
        run(runtime.stop(30))


def serve(run, runtime, parallel: int = 2) -> str:
    run(runtime.ensure_installed(60))
    run(runtime.locate(30))
    return run(runtime.ensure_serving(60, num_parallel=parallel))


def fault(api: httpx.Client, session_id: str, kind: str, **fields: Any) -> httpx.Response:
    return api.post("/sandbox/faults", json={"fault": kind, "session_id": session_id, **fields})


@pytest.mark.parametrize("name", OPENAI_RUNTIMES)
@pytest.mark.parametrize(("model", "words"), [("no-such-model:7b", UNKNOWN_MODEL_WORDS),
                                               ("deepseek-r1:70b", OOM_WORDS)], ids=["unknown", "oom"])
def test_a_server_that_fails_at_load_fails_the_stage_at_once_with_its_own_words(session, run, started, name, model,
                                                                               words):
    runtime = runtime_for(cell_for(name, model), session[1])
    started.append(runtime)
    with pytest.raises(StageError) as info:
        serve(run, runtime)
    assert info.value.stage is Stage.RUNTIME_SETUP
    assert f"{runtime.spec.program} exited before /health answered" in str(info.value)
    assert words[name] in str(info.value)  # the log's tail, in the server's words


@pytest.mark.parametrize(("name", "hang"), [
    *[pytest.param(name, False, id=f"crash-{name}") for name in OPENAI_RUNTIMES],
    # A hang costs a health timeout and a SIGTERM grace (~12 s): one runtime, as the code (openai_server.py)
    # and the stand-in's hang (SIGSTOP) are the same for all four.
    pytest.param("llamacpp", True, id="hang-llamacpp"),
])
def test_a_server_that_crashes_or_hangs_mid_run_is_restarted_once(api, session, run, started, name, hang):
    runtime = runtime_for(cell_for(name), session[1])
    started.append(runtime)
    serve(run, runtime)
    run(runtime.pull(MODEL, 60))
    assert fault(api, session[0]["id"], "stop_server", hang=hang).status_code == 200
    reasons: list[str] = []
    # A short stage timeout: a hung server gets half of it to take SIGTERM before SIGKILL.
    assert run(runtime.ensure_healthy(12, on_restart=reasons.append)) is True
    assert reasons == [f"{runtime.spec.program} on port {runtime.remote_port} of the instance did not answer /health"]
    assert MODEL in run(runtime.loaded_models())  # the same model, served again
    assert fault(api, session[0]["id"], "stop_server").status_code == 200
    with pytest.raises(StageError) as info:
        run(runtime.ensure_healthy(60))
    assert info.value.stage is Stage.BENCHMARK and "again after its one restart" in str(info.value)


@pytest.mark.parametrize("name", OPENAI_RUNTIMES)
def test_stop_leaves_no_server_on_the_instance(api, session, run, started, name):
    runtime = runtime_for(cell_for(name), session[1])
    started.append(runtime)
    serve(run, runtime)
    pid = run(session[1].run(f'cat "{runtime.spec.files("pid")}"', stage=Stage.CLEANUP, what="pid", timeout=10))
    run(runtime.stop(30))
    gone = run(session[1].run(f"kill -0 {int(pid.stdout)}", stage=Stage.CLEANUP, what="kill -0", timeout=10,
                              check=False))
    assert not gone.ok
    assert fault(api, session[0]["id"], "stop_server").status_code == 409  # no launcher left running


def test_two_instances_of_one_sandbox_serve_vllm_at_once_on_ports_picked_free(api, session, run, started):
    """The old collision: vLLM's fixed port 8000 on a loopback every sandbox instance shares."""
    other_session, key = new_session(api)
    other = run(connect(other_session, key), 60)
    try:
        first, second = runtime_for(cell_for("vllm"), session[1]), runtime_for(cell_for("vllm"), other)
        started.append(first)
        serve(run, first)
        serve(run, second)
        assert first.remote_port != second.remote_port
        assert {first.remote_port, second.remote_port} <= set(PICKED_PORTS)
        assert first.port_picked and second.port_picked and first.started_here and second.started_here
        assert run(first.loaded_models()) == run(second.loaded_models()) == [MODEL]
    finally:
        run(second.stop(30))
        run(other.close(), 15)
        api.post(f"/api/v1/sessions/{other_session['id']}/done")


def test_a_picked_port_found_taken_is_replaced_and_the_server_there_never_adopted(api, session, run, started):
    squatter = runtime_for(cell_for("tgi"), session[1])
    started.append(squatter)
    serve(run, squatter)
    run(session[1].run(f'rm -f "{squatter.spec.files("pid")}"', stage=Stage.CLEANUP, what="rm", timeout=10))
    runtime = runtime_for(cell_for("sglang"), session[1])
    started.append(runtime)
    run(runtime.ensure_installed(60))
    runtime.remote_port, runtime.port_picked = squatter.remote_port, True  # as if the pick had chosen it
    run(runtime.locate(30))
    run(runtime.ensure_serving(60))
    assert runtime.remote_port != squatter.remote_port and runtime.started_here
    assert run(squatter.loaded_models()) == [MODEL]  # left alone
    assert fault(api, session[0]["id"], "stop_server").status_code == 200  # the squatter has no pid file of ours


def test_a_fixed_port_adopts_a_server_found_running_there_and_leaves_it_running(api, session, run, started):
    owner = runtime_for(cell_for("llamacpp"), session[1])
    started.append(owner)
    serve(run, owner)
    port = owner.remote_port
    run(session[1].run(f'rm -f "{owner.spec.files("pid")}"', stage=Stage.CLEANUP, what="rm", timeout=10))
    found = runtime_for(cell_for("llamacpp", port=port), session[1])
    assert serve(run, found) == found.version and found.remote_port == port
    assert (found.started_here, found.num_parallel, found.port_picked) == (False, None, False)
    run(found.pull(MODEL, 60))
    run(found.stop(30))
    assert run(found.loaded_models()) == [MODEL]  # found running: left running
    with pytest.raises(StageError) as info:
        serve(run, runtime_for(cell_for("llamacpp", model="qwen2:7b", port=port), session[1]))
    assert "serves qwen2:1.5b, not qwen2:7b" in str(info.value)
    assert fault(api, session[0]["id"], "stop_server").status_code == 200  # the server found running


@pytest.mark.parametrize("name", OPENAI_RUNTIMES)
def test_a_stream_fault_stalls_every_servers_stream_mid_answer(api, session, run, started, name):
    runtime = runtime_for(cell_for(name), session[1])
    started.append(runtime)
    serve(run, runtime)
    armed = fault(api, session[0]["id"], "stall_stream", after_tokens=2, times=1)
    assert armed.status_code == 200, armed.text

    async def stream() -> tuple[int, bool]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to twenty."}], "stream": True,
                "max_tokens": 16}
        tokens, stalled = 0, False
        async with httpx.AsyncClient(base_url=runtime.url, timeout=httpx.Timeout(30, read=2.0)) as http:
            try:
                async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                            tokens += 1
            except httpx.ReadTimeout:
                stalled = True
        return tokens, stalled

    assert run(stream(), 60) == (2, True)  # two tokens, then silence
    assert run(stream(), 60)[1] is False  # fired once: the next answer streams to its end
    api.delete("/sandbox/faults")


# ------------------------------------------- where the servers listen (issue 21 item 4)


def listening_addresses(pid: int) -> set[str]:
    """The ``address:port`` of every listening TCP socket of ``pid`` and its descendants, read from
    ``/proc`` (the socket inodes among their fds, matched in ``/proc/net/tcp`` and ``tcp6``)."""
    pids, inodes = [pid], set()
    while pids:
        current = pids.pop()
        try:
            for fd in Path(f"/proc/{current}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pids.extend(int(child) for child in children)
    found = set()
    for table, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = bytes.fromhex(raw)
            # /proc prints each 32-bit word in host (little-endian) order.
            packed = b"".join(packed[i:i + 4][::-1] for i in range(0, size, 4))
            found.add(f"{ipaddress.ip_address(packed)}:{int(port, 16)}")
    return found


# vLLM and TGI (every interface by default) and Ollama (OLLAMA_HOST from the instance); the flags of all
# four OpenAI servers are checked in tests/unit/test_launch_commands.py.
@pytest.mark.parametrize("name", ["vllm", "tgi", "ollama"])
def test_every_server_the_plugin_starts_listens_on_the_instance_loopback_only(session, run, started, name):
    """vLLM and TGI listen on every interface unless told: the launch command says 127.0.0.1
    (Ollama: OLLAMA_HOST), and the stand-in's listening socket is bound there and nowhere else."""
    runtime = runtime_for(cell_for(name), session[1])
    started.append(runtime)
    serve(run, runtime)
    assert runtime.started_here
    pid_file = runtime.spec.files("pid") if name != "ollama" else SERVE_PID
    pid = int(run(session[1].run(f'cat "{pid_file}"', stage=Stage.CLEANUP, what="pid", timeout=10)).stdout)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if name != "ollama":
        flag = b"--hostname" if name == "tgi" else b"--host"
        assert cmdline[cmdline.index(flag) + 1] == b"127.0.0.1", cmdline
    else:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"OLLAMA_HOST=127.0.0.1:{runtime.remote_port}".encode() in environ
    assert listening_addresses(pid) == {f"127.0.0.1:{runtime.remote_port}"}
