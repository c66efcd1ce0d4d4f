"""The OpenAI-server launchers' stand-ins (``vllm``, ``llama-server``, SGLang's, TGI's) on a sandbox
instance, over real SSH.

Each launcher is started on the instance with its real command line, its port reached
through an SSH forward; readiness, a streamed chat completion (usage counts and timing
against the instance's catalog model), ``/v1/models``, failures at load and SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_for
from sandbox_session import connect, new_session
from standin_helpers import standin_env, write_instance

from pytest_gpubench.errors import Stage
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.sandbox.instances import free_port
from pytest_gpubench.sandbox.ollama_common import count_prompt_tokens

MODEL = "qwen2:7b"
PROMPT = "Explain what a GPU does in one paragraph."
MAX_TOKENS = 40

LAUNCHERS = {
    "vllm": lambda port: f"vllm serve {MODEL} --port {port} --tensor-parallel-size 1 --max-model-len 4096",
    "llama-server": lambda port: f"llama-server -m /models/{MODEL}.gguf --port {port} -c 4096 -np 2",
    "sglang": lambda port: f"python3 -m sglang.launch_server --model-path {MODEL} --port {port} --tp-size 1 "
                           f"--max-running-requests 4",
    "text-generation-launcher": lambda port: f"text-generation-launcher --model-id {MODEL} --port {port} "
                                             f"--num-shard 1 --max-concurrent-requests 4",
}
VERSION_COMMANDS = {"sglang": "python3 -c 'import sglang; print(sglang.__version__)'"}
#: ``/v1/models``' ``owned_by``, and the line each server logs once it serves.
OWNER = {"vllm": "vllm", "llama-server": "llamacpp", "sglang": "sglang", "text-generation-launcher": MODEL}
READY_LINE = {"vllm": "Application startup complete.", "llama-server": "starting the main loop",
              "sglang": "The server is fired up and ready to roll!",
              "text-generation-launcher": "text_generation_router::server: Connected"}


def instance_document(api: httpx.Client, session: dict[str, Any]) -> dict[str, Any]:
    """The instance file the stand-ins read: the catalog's truths for this instance."""
    entry = next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session["id"])
    return json.loads((Path(entry["instance_dir"]) / "instance.json").read_text())


async def run(connection: Connection, command: str) -> Any:
    return await connection.run(command, stage=Stage.BENCHMARK, what=command, timeout=60, check=False)


async def stream_chat(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    """One streamed chat completion: its token chunks' arrival times and the usage chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "max_tokens": MAX_TOKENS, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    arrivals: list[float] = []
    usage: dict[str, int] | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        lines: list[str] = []
        async for line in response.aiter_lines():
            if not line:
                continue
            lines.append(line)
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter() - started)
    assert lines[-1] == "data: [DONE]"
    assert usage is not None
    return {"arrivals": arrivals, "usage": usage}


@pytest.mark.parametrize("program", sorted(LAUNCHERS))
def test_launcher_serves_the_catalog_model_and_stops_on_sigterm(api: httpx.Client, program: str) -> None:
    session, key = new_session(api)
    truth = instance_document(api, session)["models"][MODEL]
    port = free_port()
    log = f"$TMPDIR/{program}.log"  # the instance's own: not a file other runs on this machine share

    async def scenario() -> None:
        connection = await connect(session, key)
        try:
            version = await run(connection, VERSION_COMMANDS.get(program, f"{program} --version"))
            assert version.exit_status == 0 and (version.stdout + version.stderr).strip()
            command = LAUNCHERS[program](port)
            started = await run(connection, f"nohup sh -c {shlex.quote(command + '; echo exit=$?')} "
                                             f"> {log} 2>&1 & echo $!")
            pid = int(started.stdout.strip())
            local = await connection.forward("127.0.0.1", port)
            # Async HTTP: the SSH forward runs on this loop, a blocking call would stall it.
            client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{local}", timeout=30)
            statuses: list[tuple[int, str]] = []

            async def healthy() -> bool:
                try:
                    answer = await client.get("/health")
                except httpx.TransportError:
                    return False  # vLLM listens only once loaded; the forward refuses until then
                statuses.append((answer.status_code, answer.text))
                return answer.status_code == 200

            deadline = time.monotonic() + 60
            while not await healthy():
                assert time.monotonic() < deadline, f"{program} was not ready within 60 s: {statuses[-3:]}"
                await asyncio.sleep(0.05)
            loading = [s for s in statuses if s[0] != 200]
            if program == "llama-server":
                assert statuses[-1] == (200, '{"status":"ok"}')
                assert all(json.loads(text)["error"]["message"] == "Loading model" for code, text in loading)
                assert {code for code, _ in loading} <= {503}
            else:
                assert not loading

            models = (await client.get("/v1/models")).json()
            served = models["data"][0]["id"]
            assert models["object"] == "list" and models["data"][0]["owned_by"] == OWNER[program]

            sent_after = time.time()
            got = await stream_chat(client, served)
            await client.aclose()
            usage, arrivals = got["usage"], got["arrivals"]
            assert usage["completion_tokens"] == len(arrivals) > 1
            assert usage["prompt_tokens"] == count_prompt_tokens(PROMPT)
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            # The server's own request log says what it was sent, and when (the host's clock).
            logged = api.get(f"/sandbox/sessions/{session['id']}/requests").json()["requests"]
            assert [(e["route"], e["model"], e["messages"], e["prompt_tokens"], e["max_tokens"]) for e in logged] == \
                [("/v1/chat/completions", served, [{"role": "user", "content": PROMPT}], usage["prompt_tokens"],
                  MAX_TOKENS)]
            assert sent_after <= logged[0]["received_at"] <= time.time()
            # The catalog's truths: noise only ever adds delay to a token, so lower bounds are
            # tight and upper bounds generous. Tokens leave on an absolute schedule (a late one
            # does not push back the rest), so a first token delayed by a loaded machine shortens
            # the span to the last one: the lower bound is on the last token's arrival itself.
            ttft, decode = arrivals[0], arrivals[-1] - arrivals[0]
            expected_decode = (len(arrivals) - 1) / truth["tokens_per_second"]
            assert truth["ttft_ms"] / 1000 * 0.9 <= ttft <= truth["ttft_ms"] / 1000 + 2.0
            assert (truth["ttft_ms"] / 1000 + expected_decode) * 0.9 <= arrivals[-1]
            assert decode <= expected_decode * 2 + 1.0

            # The server is the child of the sh that reports its exit status.
            await run(connection, f"pkill -TERM -P {pid}")

            async def stopped() -> str:
                return (await run(connection, f"cat {log}")).stdout

            deadline = time.monotonic() + 30
            output = await stopped()
            while "exit=" not in output and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                output = await stopped()
            assert "exit=0" in output, output
            assert READY_LINE[program] in output
        finally:
            await connection.close()

    asyncio.run(scenario())
    if program == "vllm":  # once is enough: the log outlives the instance's directory
        logged = api.get(f"/sandbox/sessions/{session['id']}/requests").json()["requests"]
        assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 200
        wait_for(lambda: api.get(f"/api/v1/sessions/{session['id']}").json()["status"] == "stopped", 60,
                 "the session to stop")
        assert api.get(f"/sandbox/sessions/{session['id']}/requests").json()["requests"] == logged


def test_request_log_of_an_unknown_session_is_404(api: httpx.Client) -> None:
    answer = api.get("/sandbox/sessions/no-such-session/requests")
    assert answer.status_code == 404 and answer.json()["error"] == "session not found: no-such-session"


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("vllm serve no-such/model --port {port}", "is not a valid model identifier"),
        ("llama-server -m /models/no-such.gguf --port {port}", "failed to open GGUF file '/models/no-such.gguf'"),
        ("vllm serve deepseek-r1:70b --port {port}", "CUDA out of memory"),
        ("llama-server -m /models/deepseek-r1:70b.gguf --port {port}", "cudaMalloc failed: out of memory"),
        ("python3 -m sglang.launch_server --model-path no-such/model --port {port}", "is not a valid model identifier"),
        ("python3 -m sglang.launch_server --model-path deepseek-r1:70b --port {port}",
         "Not enough memory. Please try to increase --mem-fraction-static."),
        ("text-generation-launcher --model-id no-such/model --port {port}", "Error: DownloadError"),
        ("text-generation-launcher --model-id deepseek-r1:70b --port {port}", "Error: ShardCannotStart"),
        ("text-generation-launcher --model-id qwen2:7b --num-shard 2 --port {port}",
         "is greater than the number of GPUs (1)"),
    ],
)
def test_launcher_refuses_an_unknown_model_or_one_that_does_not_fit(api: httpx.Client, command: str,
                                                                    message: str) -> None:
    session, key = new_session(api)
    assert "deepseek-r1:70b" in instance_document(api, session)["models"]  # 42 GB: more than an RTX 4090

    async def scenario() -> Any:
        connection = await connect(session, key)
        try:
            return await run(connection, command.format(port=free_port()))
        finally:
            await connection.close()

    result = asyncio.run(scenario())
    assert result.exit_status == 1
    assert message in result.stderr, result.stderr


def test_readiness_while_loading_is_each_servers_own(tmp_path: Path) -> None:
    """llama.cpp answers 503 ``Loading model`` while it loads; vLLM, SGLang and TGI do not listen until loaded."""
    instance = write_instance(tmp_path)
    document = json.loads(instance.read_text())
    document["time_scale"] = 0.5  # qwen2:7b loads in 1.5 s: long enough to be seen loading
    instance.write_text(json.dumps(document))
    for program, args, loading in [
        ("llama-server", ["-m", f"{MODEL}.gguf"], (503, {"error": {"code": 503, "message": "Loading model",
                                                                  "type": "unavailable_error"}})),
        ("vllm", ["serve", MODEL], None),
        ("sglang", ["--model-path", MODEL], None),
        ("text-generation-launcher", ["--model-id", MODEL], None),
    ]:
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "pytest_gpubench.sandbox.openai_launchers", program, *args,
                                   "--port", str(port)], env=standin_env(instance, port),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            seen: list[Any] = []

            def answer() -> Any:
                try:
                    got = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                except httpx.TransportError:
                    seen.append(None)
                    return None
                seen.append((got.status_code, got.json() if got.content else None))
                return got.status_code == 200

            wait_for(answer, 30, f"{program} to be ready")
            if loading is None:
                assert seen[-1] == (200, None) and set(seen[:-1]) == {None}
            else:
                assert seen[-1] == (200, {"status": "ok"})
                assert loading in seen and all(s == loading for s in seen[:-1] if s is not None)
        finally:
            server.terminate()
            assert server.wait(10) == 0, server.stderr.read() if server.stderr else ""
