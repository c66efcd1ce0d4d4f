"""Issue 21 item 6: the load generator's config (every prompt of the dataset) travels on
stdin after the script, never as an argument, which Linux caps at 128 KiB.

Real parts: this machine's shell (``LocalShell``, the ``cloud: local`` connection, which
runs commands through ``bash -c`` as sshd does), this python3 and a small Ollama-speaking
HTTP server that records every prompt it is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from pytest_gpubench.measure.benchmark import (
    LOADGEN_BOOTSTRAP,
    LOADGEN_COMMAND,
    BenchmarkPlan,
    _local_lines,
    loadgen_input,
    run_benchmark,
)
from pytest_gpubench.remote.local import LocalShell

#: Linux's cap on one argument (MAX_ARG_STRLEN): the dataset here is far beyond it.
ARG_MAX = 128 * 1024


class Recorder(http.server.BaseHTTPRequestHandler):
    """``POST /api/generate``: one token, then done; the prompt's SHA-256 is kept."""

    protocol_version = "HTTP/1.1"
    seen: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(hashlib.sha256(body["prompt"].encode()).hexdigest())
        answer = (json.dumps({"response": "x", "done": False}, separators=(",", ":")) + "\n"
                  + json.dumps({"response": "", "done": True, "eval_count": 1}, separators=(",", ":")) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def dataset(megabytes: float = 5.0, size: int = 10_000) -> list[str]:
    """Distinct prompts of ``size`` characters, ``megabytes`` in all (a ShareGPT-sized dataset)."""
    count = int(megabytes * 1_000_000 // size)
    return [f"prompt {i}: " + "lorem ipsum dolor sit amet é " * (size // 30) for i in range(count)]


def plan(prompts: list[str]) -> BenchmarkPlan:
    return BenchmarkPlan(model="m", duration=0.5, max_tokens=2, prompts=prompts, warmup_requests=0,
                         progress_interval=10, checkpoint_every=50, checkpoint_path="", concurrency=1)


def sent_in_order(seen: list[str], prompts: list[str]) -> bool:
    """Every request carried the dataset's prompt of its index, byte for byte (concurrency 1: in order)."""
    digests = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
    return bool(seen) and seen == [digests[i % len(digests)] for i in range(len(seen))]


def test_the_command_is_short_and_the_config_follows_the_script_on_stdin():
    config = plan(dataset()).config("http://127.0.0.1:9")
    stdin = loadgen_input(config)
    assert len(json.dumps(config)) > 40 * ARG_MAX
    assert len(LOADGEN_COMMAND) < 1024 and "prompt" not in LOADGEN_COMMAND
    # The bootstrap reads exactly the script's bytes; the loadgen then parses what follows.
    length, _, rest = stdin.partition("\n")
    assert rest[int(length):] == json.dumps(config)


def test_a_5_mb_dataset_reaches_the_instance_through_stdin(server):
    url, seen = server

    async def scenario():
        shell = LocalShell.open(hide_gpu=True)  # commands run through `bash -c`, as sshd runs them
        try:
            return await run_benchmark(shell, plan(prompts), remote_server_url=url, local_server_url=url,
                                       timeout=60)
        finally:
            await shell.close()

    prompts = dataset()
    outcome = asyncio.run(scenario())
    assert outcome.status == "completed" and outcome.where == "instance", outcome.message
    assert outcome.successful >= 1 and sent_in_order(seen, prompts)


def test_the_local_fallback_takes_a_5_mb_dataset_too(server):
    """No python3 on the instance: the script runs here, against the forwarded port."""
    url, seen = server
    prompts = dataset()

    async def collect() -> list[dict]:
        return [json.loads(line) async for line in _local_lines(plan(prompts).config(url))]

    events = asyncio.run(collect())
    assert events[-1]["event"] == "finish" and events[-1]["status"] == "completed"
    assert sent_in_order(seen, prompts)


def test_a_missing_or_broken_config_is_one_line_not_a_traceback():
    for stdin in ("", "[1, 2]", "{not json"):
        source = loadgen_input({}).rsplit("{}", 1)[0] + stdin  # the script, then this config
        done = subprocess.run([sys.executable, "-c", LOADGEN_BOOTSTRAP], input=source, text=True,
                              capture_output=True, timeout=60)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("loadgen: ") and "Traceback" not in done.stderr, done.stderr
