"""Issue 21 item 17 (a): a load generator against a server that fails every request at once
backs off, instead of re-sending at once (a closed loop against a failing server was a tight
loop: one cell logged errors=68658 in its minutes).

The schedule is plain arithmetic; the loop runs for real: the load generator in a python
subprocess, against a closed port (a crashed server) and an HTTP server that answers 503.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from pytest_gpubench.measure.benchmark import LOADGEN_BOOTSTRAP, BenchmarkPlan, loadgen_input
from pytest_gpubench.remote.loadgen import BACKOFF_AFTER, BACKOFF_CAP, BACKOFF_FIRST, backoff_pause


def test_the_pause_doubles_from_the_third_failure_in_a_row_up_to_its_cap():
    assert [backoff_pause(n) for n in range(BACKOFF_AFTER)] == [0.0] * BACKOFF_AFTER
    pauses = [backoff_pause(n) for n in range(BACKOFF_AFTER, BACKOFF_AFTER + 12)]
    assert pauses[:4] == [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST, 8 * BACKOFF_FIRST]
    assert all(b == min(BACKOFF_CAP, 2 * a) for a, b in zip(pauses, pauses[1:]))
    assert pauses[-1] == BACKOFF_CAP == backoff_pause(10**9)  # a long streak neither overflows nor grows


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again once this returns: connections are refused


class Flaky(http.server.BaseHTTPRequestHandler):
    """503 at once for the first ``failing`` requests (every one when None), as an overloaded or
    broken server answers; then one token and done, as Ollama does."""

    protocol_version = "HTTP/1.1"
    failing: int | None
    count: list[int]

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.count.append(1)
        if self.failing is None or len(self.count) <= self.failing:
            status, body = 503, b'{"error":"server overloaded"}'
        else:
            status, body = 200, b'{"response":"x","done":false}\n{"response":"","done":true,"eval_count":1}\n'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def serve() -> Iterator:
    """``serve(failing)``: a :class:`Flaky` server's URL and the list its requests are counted in."""
    servers = []

    def start(failing: int | None) -> tuple[str, list[int]]:
        count: list[int] = []
        handler = type("Handler", (Flaky,), {"failing": failing, "count": count})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", count

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


DURATION = 1.5


def start_loadgen(url: str, **load: object) -> subprocess.Popen[str]:
    plan = BenchmarkPlan(model="m", duration=DURATION, max_tokens=8, prompts=["hi"], warmup_requests=0,
                         progress_interval=1.0, checkpoint_every=100, checkpoint_path="", concurrency=8)
    process = subprocess.Popen([sys.executable, "-c", LOADGEN_BOOTSTRAP], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdin.write(loadgen_input({**plan.config(url), **load}))
    process.stdin.close()
    return process


def events_of(process: subprocess.Popen[str]) -> list[dict]:
    out = process.stdout.read()  # to its end: the process has exited or is about to
    assert process.wait(timeout=60) == 0, process.stderr.read()
    return [json.loads(line) for line in out.splitlines()]


def test_a_server_that_fails_every_request_at_once_gets_few_of_them_until_it_recovers(serve):
    """A crashed server (connection refused) at concurrency 8 and at 200 requests/s, one that
    answers 503 at once, and one that recovers after 5 such answers: side by side, 1.5 s each."""
    refused = f"http://127.0.0.1:{closed_port()}"
    (unavailable, answered), (recovering, _) = serve(None), serve(5)
    running = {"concurrency": start_loadgen(refused), "rate": start_loadgen(refused, rate=200.0),
               "503": start_loadgen(unavailable), "recovering": start_loadgen(recovering)}
    runs = {name: events_of(process) for name, process in running.items()}
    for name, events in runs.items():
        requests = [e for e in events if e["event"] == "request"]
        finish = events[-1]
        assert finish["event"] == "finish" and finish["status"] == "completed", name
        assert finish["duration_seconds"] < DURATION + 1.0, name  # a pause ends at the deadline
        (started, *ended) = [e for e in events if e["event"] == "backoff"]  # when it starts, never per error
        assert started["status"] == "started" and started["errors"] == BACKOFF_AFTER, name
        assert started["pause_s"] == BACKOFF_FIRST and finish["backoffs"] == 1, name
        if name == "recovering":
            continue
        assert not ended and all(r["error"] for r in requests), name
        # Three at once, then pauses of 0.05, 0.1, 0.2 ... s, one request at a time. Without the
        # backoff, each of these loops sent thousands.
        assert BACKOFF_AFTER <= len(requests) <= 20, (name, len(requests))
    assert "Connection refused" in [e for e in runs["rate"] if e["event"] == "backoff"][0]["error"]
    assert [e["error"] for e in runs["503"] if e["event"] == "request"][0] == "HTTP 503: server overloaded"
    assert len(answered) == len([e for e in runs["503"] if e["event"] == "request"])
    # Recovered: the first success ends the backoff (said once), and the full load resumes.
    events = runs["recovering"]
    backoff = [e for e in events if e["event"] == "backoff"]
    assert [e["status"] for e in backoff] == ["started", "ended"]
    assert BACKOFF_AFTER <= backoff[1]["errors"] <= 5  # 8 in flight at first: a success may end it early
    requests = [e for e in events if e["event"] == "request"]
    assert sum(1 for r in requests if r["error"]) == 5
    assert sum(1 for r in requests if r["error"] is None) > 100  # nothing holds it back any more
