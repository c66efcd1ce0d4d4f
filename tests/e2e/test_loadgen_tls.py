"""The load generator over TLS: an https:// endpoint, verified by default, against a CA
file when given, with the bearer token sent inside the encrypted stream; and the
``runtime: openai`` cell that measures such an endpoint, its ``ca_file`` honoured."""

import http.server
import json
import os
import subprocess
import sys

import pytest
from tls_helpers import https_server, make_loopback_certs

from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan
from pytest_gpubench.remote.readings import RequestRecord

TOKEN = "tls-s3cret-token"
TOKENS = 5


class StreamingOpenAI(http.server.BaseHTTPRequestHandler):
    """/v1/chat/completions streamed as SSE in small writes (several TLS records), behind a bearer token."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        payload = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]} if authorized
                             else {"error": {"message": "Invalid API key"}}).encode()
        self.send_response(200 if authorized and self.path == "/v1/models" else 401 if not authorized else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            payload = b'{"error":{"message":"Invalid API key"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        assert body["stream"] and body["stream_options"]["include_usage"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}]}
                  for i in range(TOKENS)]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}})
        for chunk in chunks:
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_loopback_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(certs):
    with https_server(StreamingOpenAI, certs) as url:
        yield url


def run(url, tmp_path, *, env_token=TOKEN, **extra):
    config = BenchmarkPlan(model="m", duration=0.3, max_tokens=8, prompts=["hi"], warmup_requests=1,
                           progress_interval=0.2, checkpoint_every=3, concurrency=4,
                           checkpoint_path=str(tmp_path / "checkpoint.json"), protocol="openai-chat",
                           api_key_env="GPUBENCH_TLS_TEST_KEY").config(url)
    config.update(extra)
    env = {**os.environ, "GPUBENCH_TLS_TEST_KEY": env_token}
    done = subprocess.run([sys.executable, "-", json.dumps(config)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120, env=env)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert TOKEN not in done.stdout + done.stderr
    return events, [RequestRecord.model_validate(e) for e in events if e["event"] == "request" and not e["warmup"]]


def test_https_with_the_ca_file_streams_and_sends_the_token(server, certs, tmp_path):
    events, records = run(server, tmp_path, ca_file=str(certs.ca))
    assert events[-1]["status"] == "completed", events[-1]
    assert len(records) >= 4  # four in flight, kept-alive TLS connections reused
    for record in records:
        assert record.ok, record.error
        assert (record.output_tokens, record.eval_count, record.prompt_tokens) == (TOKENS, TOKENS, 3)
        assert record.ttft_ms > 0


def test_https_verification_is_on_by_default(server, tmp_path):
    # The test CA is in no trust store: the run fails at once, saying why.
    events, records = run(server, tmp_path)
    assert not records
    assert events[-1]["status"] == "failed"
    assert "CERTIFICATE_VERIFY_FAILED" in events[-1]["message"] or "certificate verify failed" in events[-1]["message"]


def test_a_wrong_token_over_https_is_the_server_s_401(server, certs, tmp_path):
    events, records = run(server, tmp_path, env_token="wrong", ca_file=str(certs.ca))
    assert records and all(r.error == "HTTP 401: Invalid API key" for r in records)


def test_an_https_endpoint_cell_is_checked_and_measured_with_its_ca_file(server, certs, tmp_path, monkeypatch):
    import asyncio

    from pytest_gpubench.errors import Stage, StageError
    from pytest_gpubench.matrix.cells import expand, parse_matrix
    from pytest_gpubench.measure.repeats import measure_once
    from pytest_gpubench.remote.local import LocalShell
    from pytest_gpubench.runtimes.registry import runtime_for

    monkeypatch.setenv("GPUBENCH_TLS_TEST_KEY", TOKEN)

    def runtime(ca: str):
        text = (f"runtime: {{name: openai, endpoint: '{server}/v1', api_key_env: GPUBENCH_TLS_TEST_KEY{ca}}}\n"
                "matrix:\n  - {gpu: RTX 4090, model: m}\n")
        (cell,) = expand(parse_matrix(text, str(tmp_path / "gpubench_tls.yaml")))
        return runtime_for(cell, LocalShell.open(hide_gpu=True))

    async def measured(verified):
        try:
            await verified.ensure_serving(10)
            await verified.pull("m", 10)
            plan = BenchmarkPlan(model="m", duration=0.3, max_tokens=8, prompts=["hi"], warmup_requests=0,
                                 progress_interval=0.2, checkpoint_every=3, checkpoint_path=".gpubench/ck.json",
                                 protocol=str(verified.endpoint.api), api_key_env=verified.endpoint.api_key_env,
                                 ca_file=verified.endpoint.ca_file)
            outcome, _ = await measure_once(verified, plan, timeout=60, telemetry_interval=0.5,
                                            on_event=lambda event: None)
            return [r for r in outcome.records if not r.warmup]
        finally:
            await verified.conn.close()

    records = asyncio.run(measured(runtime(f", ca_file: '{certs.ca}'")))
    assert records and all(r.ok and r.output_tokens == TOKENS for r in records)
    unverified = runtime("")
    with pytest.raises(StageError) as info:
        asyncio.run(unverified.ensure_serving(1.5))
    assert info.value.stage is Stage.RUNTIME_SETUP and server in info.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.message and TOKEN not in info.value.message
    asyncio.run(unverified.conn.close())
