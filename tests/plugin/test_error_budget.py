"""Issue 21 item 17: a cell whose requests mostly fail is recorded ``partial``, never ``success``.

One cell with ``runtime: openai`` against a small OpenAI-compatible server on loopback that
answers the first two measured requests and then 503 to every one (an overloaded or broken
server), measured by pytest in a subprocess on this machine (no sandbox, no API): the load
generator backs off and says so once in the progress file, and the default error budget makes
the cell partial, its figures kept. Before issue 21 this cell was a success.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import manifest_rows, run_pytest

MODEL = "qwen2:7b"
ANSWERED = 2  # measured requests answered before the server starts failing


class Failing(http.server.BaseHTTPRequestHandler):
    """``/v1/models``; a non-streamed chat completion (the warm-up) answered; streamed ones
    answered ``ANSWERED`` times, then 503 at once."""

    protocol_version = "HTTP/1.1"
    streamed: list[int]

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            return self.reply(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        self.reply(404, b'{"error": "not found"}')

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not request.get("stream"):
            return self.reply(200, json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"},
                                                            "finish_reason": "stop"}],
                                               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode())
        self.streamed.append(1)
        if len(self.streamed) > ANSWERED:
            return self.reply(503, b'{"error": {"message": "server overloaded", "code": 503}}')
        chunks = [{"choices": [{"delta": {"content": word}, "finish_reason": None}]} for word in ("a", "b", "c")]
        chunks.append({"choices": [{"delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
        body = "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.reply(200, body.encode(), "text/event-stream")


@pytest.fixture
def server() -> Iterator[str]:
    handler = type("Handler", (Failing,), {"streamed": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_cell_whose_requests_mostly_fail_is_partial_not_a_success(server, tmp_path):
    matrix = tmp_path / "gpubench_failing.yaml"
    matrix.write_text(f"""
workload: {{duration: 1s, max_tokens: 8, warmup_requests: 0, progress_interval: 0.5s}}
matrix:
  - {{gpu: RTX 4090, model: '{MODEL}', runtime: {{name: openai, endpoint: '{server}/v1'}}}}
""")
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", "http://127.0.0.1:9", "-o",
                      "gpubench_files=gpubench_*.yaml", "--rootdir", str(tmp_path))
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"], row["failure_reason"]) == (
        "partial", "results", "ErrorBudgetExceeded"), row
    assert "of the measured requests failed, above the default error budget of 50%" in row["error_message"]
    assert "; the requests failed with: HTTP 503: server overloaded (" in row["error_message"]
    assert "Traceback" not in done.stdout
    # What was measured is kept: the two answers, and the errors (a few: the generator backed off).
    assert row["benchmark_id"] and row["total_requests"] - row["error_count"] == ANSWERED
    assert 3 <= row["error_count"] <= 15, row["error_count"]
    progress = Path(row["progress_file"]).read_text()
    (line,) = [line for line in progress.splitlines() if "STATUS: LOADGEN_BACKOFF" in line]
    assert "errors=3 " in line and "HTTP 503: server overloaded" in line, line
