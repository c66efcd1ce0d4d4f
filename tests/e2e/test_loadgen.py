"""The load generator as it runs on an instance: against a real Ollama stand-in for
the truth it must measure, and against a small fake server for HTTP framings."""

import asyncio
import glob
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading

import pytest
from standin_helpers import RATE, THINKING_MODEL, TTFT_MS, Server, write_instance

from pytest_gpubench.measure.benchmark import (
    LOADGEN_BOOTSTRAP,
    LOADGEN_SOURCE,
    BenchmarkPlan,
    _local_lines,
    loadgen_input,
)
from pytest_gpubench.matrix.cells import SEED_PROMPTS
from pytest_gpubench.measure.results import summarize
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.standin_state import StateStore, StreamFault

PARALLEL = 4


@pytest.fixture(scope="module")
def ollama(tmp_path_factory):
    server = Server(write_instance(tmp_path_factory.mktemp("loadgen")), OLLAMA_NUM_PARALLEL=str(PARALLEL))
    server.pull("qwen2:7b")
    yield server
    server.stop()


def run_loadgen(config, python=sys.executable):
    # As the plugin runs it: the bootstrap reads the script, then the config, from stdin.
    done = subprocess.run([python, "-c", LOADGEN_BOOTSTRAP], input=loadgen_input(config), text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def config(url, tmp_path, **extra):
    base = BenchmarkPlan(model="qwen2:7b", duration=2.0, max_tokens=48, prompts=SEED_PROMPTS, warmup_requests=1,
                         progress_interval=0.5, checkpoint_every=3,
                         checkpoint_path=str(tmp_path / "ck" / "checkpoint.json")).config(url)
    base.update(extra)
    return base


def measured(events):
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    return sorted((r for r in records if not r.warmup), key=lambda r: r.index)


# ------------------------------------------------------------ against the stand-in


def test_events_records_checkpoint_and_measured_truth(ollama, tmp_path):
    events = run_loadgen(config(ollama.url, tmp_path))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "connection" and kinds[-1] == "finish"
    assert events[-1]["status"] == "completed"
    assert kinds.count("progress") >= 3  # every 0.5 s over 2 s, plus the final one
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert records[0].warmup and not any(r.warmup for r in records[1:])
    assert len(records) >= 4
    assert all(r.ok and r.output_tokens == r.eval_count for r in records)
    results = summarize(records, events[-1]["duration_seconds"])
    # The stand-in streams at exactly RATE after TTFT_MS: the client must see that.
    # The median, not the mean: one stream stalled and flushed in a burst skews the mean.
    assert results.p50_tokens_per_second == pytest.approx(RATE, rel=0.03)
    assert results.p50_ttft_ms == pytest.approx(TTFT_MS, abs=15)
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert checkpoint["status"] == "completed"
    assert len(checkpoint["results"]) == len(records)  # seed 001: every record on the instance's disk
    assert [RequestRecord.model_validate(r) for r in checkpoint["results"]] == records


def test_errors_are_records_not_crashes(ollama, tmp_path):
    events = run_loadgen(config(ollama.url, tmp_path, model="not-pulled:1b", duration=0.3, warmup_requests=0))
    records = [e for e in events if e["event"] == "request"]
    assert records and all("not found" in r["error"] for r in records)
    assert records[0]["error"].startswith("HTTP 404: ")
    assert events[-1] == {**events[-1], "event": "finish", "status": "completed"}


def test_local_fallback_streams_the_same_events(ollama, tmp_path):
    async def collect():
        return [line async for line in _local_lines(config(ollama.url, tmp_path, duration=0.5))]

    lines = asyncio.run(collect())
    assert json.loads(lines[-1])["event"] == "finish"


def test_fixed_concurrency_keeps_n_in_flight_at_the_true_rate(ollama, tmp_path):
    events = run_loadgen(config(ollama.url, tmp_path, concurrency=PARALLEL))
    finish, records = events[-1], measured(events)
    assert finish["delivered_concurrency"] == pytest.approx(PARALLEL, rel=0.1)
    assert all(r.ok for r in records) and len(records) >= 3 * PARALLEL
    results = summarize(records, finish["duration_seconds"])
    assert results.p50_tokens_per_second == pytest.approx(RATE, rel=0.05)  # bench/fidelity.py measures tighter
    # A request is due when a slot frees: the first N at the start, each later one
    # when an earlier one's final chunk arrived; it is sent at once.
    assert [r.scheduled_at for r in records[:PARALLEL]] == [0.0] * PARALLEL
    ends = [r.scheduled_at + (r.send_lag_ms + r.latency_ms) / 1000 for r in records]
    for later in records[PARALLEL:]:
        assert min(abs(later.scheduled_at - end) for end in ends) < 0.05
    assert all(0 <= r.send_lag_ms < 1000 for r in records)  # generous: CI machines stall
    for r in records:
        assert r.tpot_ms == pytest.approx((r.latency_ms - r.ttft_ms) / (r.output_tokens - 1), rel=1e-3)
        # >= 0, not > 0: on a starved CI machine a whole stream can arrive in one read.
        assert r.itl_max_ms >= r.itl_mean_ms >= 0
        assert r.server_tokens_per_second == pytest.approx(RATE, rel=1e-6)
        assert r.done_reason in ("stop", "length") and r.total_duration_ns > r.prompt_eval_duration_ns > 0
    # The finish event's figures.
    itl = finish["itl_ms"]
    assert itl["count"] == sum(r.output_tokens - 1 for r in records)
    assert itl["mean"] == pytest.approx(1000 / RATE, rel=0.1)
    assert 0 < itl["p50"] <= itl["p90"] <= itl["p95"] <= itl["p99"] <= itl["max"]
    assert 0 < finish["cpu_seconds"] < finish["duration_seconds"]
    # Both figures are rounded to 4 decimals: 1% still catches a wrong formula.
    assert finish["cpu_seconds_per_1k_tokens"] == pytest.approx(
        finish["cpu_seconds"] / (sum(r.output_tokens for r in records) / 1000), rel=1e-2)
    lag = finish["send_lag_ms"]
    assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"] < 1000
    assert finish["unsent"] == 0 and finish["abandoned"] == 0
    progress = [e for e in events if e["event"] == "progress"]
    assert all(0 <= p["in_flight"] <= PARALLEL for p in progress) and progress[-1]["in_flight"] == 0


def poisson_schedule(rate, seed, duration):
    rng = random.Random(seed)
    times, at = [], rng.expovariate(rate)
    while at < duration:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def test_rate_sends_seeded_poisson_arrivals_on_schedule(ollama, tmp_path):
    rate, seed, duration = 20.0, 7, 1.5
    expected = poisson_schedule(rate, seed, duration)
    events = run_loadgen(config(ollama.url, tmp_path, rate=rate, seed=seed, duration=duration,
                                warmup_requests=0, max_tokens=8))
    finish, records = events[-1], measured(events)
    assert finish["unsent"] == 0 and len(records) == len(expected)
    assert [r.scheduled_at for r in records] == pytest.approx(expected, abs=1e-5)
    assert all(r.ok and 0 <= r.send_lag_ms < 250 for r in records)


def test_rate_beyond_max_in_flight_waits_and_shows_the_lag(ollama, tmp_path):
    rate, seed, duration = 100.0, 3, 0.6
    expected = poisson_schedule(rate, seed, duration)
    events = run_loadgen(config(ollama.url, tmp_path, rate=rate, seed=seed, duration=duration,
                                warmup_requests=0, max_tokens=8, max_in_flight=2))
    finish, records = events[-1], measured(events)
    assert len(records) + finish["unsent"] == len(expected) and finish["unsent"] > 0
    assert finish["delivered_concurrency"] <= 2.0 + 1e-9
    assert [r.scheduled_at for r in records] == pytest.approx(expected[: len(records)], abs=1e-5)
    assert finish["send_lag_ms"]["max"] > 100  # the schedule ran away from a capped client


def test_sigterm_ends_the_run_as_interrupted(ollama, tmp_path):
    process = subprocess.Popen([sys.executable, "-", json.dumps(config(ollama.url, tmp_path, duration=60,
                                                                       concurrency=2))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    process.stdin.write(LOADGEN_SOURCE)
    process.stdin.close()
    for line in process.stdout:
        event = json.loads(line)
        if event["event"] == "request" and not event["warmup"]:
            break
    process.send_signal(signal.SIGTERM)
    rest = [json.loads(line) for line in process.stdout]
    assert process.wait(10) == 0
    assert rest[-1]["event"] == "finish" and rest[-1]["status"] == "interrupted"
    assert rest[-1]["duration_seconds"] < 30
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert checkpoint["status"] == "interrupted"


def test_cut_at_deadline_ends_the_run_there_and_keeps_what_was_streamed(ollama, tmp_path):
    # 4,000 tokens at 200 tokens/s take 20 s: at the 1 s deadline both requests are mid-answer.
    max_tokens, duration = 4000, 1.0
    events = run_loadgen(config(ollama.url, tmp_path, duration=duration, concurrency=2, warmup_requests=0,
                                max_tokens=max_tokens, cut_at_deadline=True))
    finish, records = events[-1], measured(events)
    assert finish["status"] == "completed" and finish["incomplete"] == 2
    # Ended at the deadline, not after the answers (generous: a CI machine stalls).
    assert duration <= finish["duration_seconds"] < duration + 5
    assert len(records) == 2
    for r in records:
        assert r.incomplete and r.error is None and not r.ok and r.streamed
        assert 10 < r.output_tokens < max_tokens and r.eval_count is None and r.matched is None
        assert r.tokens_per_second == pytest.approx(RATE, rel=0.1)
        # TPOT runs to the last token received, not to the cut.
        assert r.tpot_ms == pytest.approx(1000 / r.tokens_per_second, rel=1e-3)
    results = summarize(records, finish["duration_seconds"])
    assert results.total_requests == 2 and results.total_errors == 0
    assert results.total_tokens == sum(r.output_tokens for r in records)
    assert results.p50_ttft_ms == pytest.approx((records[0].ttft_ms + records[1].ttft_ms) / 2)
    assert results.avg_latency_ms == 0 and results.requests_per_minute == 0  # nothing completed
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert [r["incomplete"] for r in checkpoint["results"]] == [True, True]
    # The server dropped the cut streams: a new run gets every slot at once.
    events = run_loadgen(config(ollama.url, tmp_path, duration=0.5, concurrency=PARALLEL, warmup_requests=0,
                                max_tokens=8))
    assert all(r.ok and r.ttft_ms < TTFT_MS + 150 for r in measured(events))


def test_without_cut_at_deadline_requests_in_flight_finish_and_count(ollama, tmp_path):
    duration = 0.05  # shorter than one answer: TTFT alone is 40 ms, then 200 tokens/s
    events = run_loadgen(config(ollama.url, tmp_path, duration=duration, warmup_requests=0, max_tokens=100))
    finish, records = events[-1], measured(events)
    assert finish["incomplete"] == 0 and len(records) == 1 and records[0].ok and not records[0].incomplete
    assert records[0].output_tokens > 10 and finish["duration_seconds"] >= records[0].latency_ms / 1000 > duration


# ------------------------------------------------------- framings, against a fake


TOKENS = ["Hello", ",", " World", "", "!"]  # the empty one is not an output token
FINAL = {"done_reason": "stop", "eval_count": 4, "eval_duration": 40_000_000, "prompt_eval_count": 3,
         "prompt_eval_duration": 1_000_000, "load_duration": 5, "total_duration": 50_000_000}


def ndjson(compact=True):
    separators = (",", ":") if compact else (", ", ": ")
    lines = [{"model": "m", "created_at": "2026-01-01T00:00:00Z", "response": t, "done": False} for t in TOKENS]
    lines.append({"model": "m", "created_at": "2026-01-01T00:00:00Z", "response": "", "done": True, **FINAL})
    return b"".join(json.dumps(line, separators=separators).encode() + b"\n" for line in lines)


def thinking_ndjson(compact=True):
    """Two reasoning chunks, the swallowed closing tag (empty), then the answer."""
    separators = (",", ":") if compact else (", ", ": ")
    head = {"model": "m", "created_at": "2026-01-01T00:00:00Z"}
    lines = [{**head, "response": "", "thinking": t, "done": False} for t in ("Okay", ", so")]
    lines.append({**head, "response": "", "done": False})
    lines += [{**head, "response": t, "done": False} for t in ("Hi", "!")]
    lines.append({**head, "response": "", "done": True, **FINAL, "eval_count": 5})
    return b"".join(json.dumps(line, separators=separators).encode() + b"\n" for line in lines)


class FakeOllama(http.server.BaseHTTPRequestHandler):
    """Answers /api/generate in the framing its prompt names."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self):
        FakeOllama.connections += 1
        super().setup()

    def log_message(self, *args):
        pass

    def head(self, status=200, **headers):
        self.send_response(status)
        self.send_header("Content-Type", "application/x-ndjson")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()

    def chunked(self, payload, size=7):
        self.head(Transfer_Encoding="chunked")
        for start in range(0, len(payload), size):  # chunks that cut lines anywhere
            piece = payload[start:start + size]
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()

    def do_POST(self):
        mode = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
        if mode == "chunked":
            self.chunked(ndjson())
            self.wfile.write(b"0\r\nX-Trailer: 1\r\n\r\n")
        elif mode in ("length", "length-spaced"):
            payload = ndjson(compact=mode == "length")
            self.head(Content_Length=str(len(payload)))
            self.wfile.write(payload)
        elif mode == "close":
            self.head(Connection="close")
            self.wfile.write(ndjson())
            self.close_connection = True
        elif mode in ("thinking", "thinking-spaced"):  # Ollama 0.12.4+ on a thinking model
            payload = thinking_ndjson(compact=mode == "thinking")
            self.head(Content_Length=str(len(payload)))
            self.wfile.write(payload)
        elif mode == "whole":  # a server that ignores "stream": one object, no newline
            payload = json.dumps({"model": "m", "response": "Hello, World!", "done": True, **FINAL}).encode()
            self.head(Content_Length=str(len(payload)))
            self.wfile.write(payload)
        elif mode == "missing":
            payload = b'{"error":"model \\"m\\" not found, try pulling it first"}'
            self.head(404, Content_Length=str(len(payload)))
            self.wfile.write(payload)
        elif mode == "midstream":
            self.chunked(ndjson().split(b"\n")[0] + b'\n{"error":"out of memory"}\n', size=1000)
            self.wfile.write(b"0\r\n\r\n")
        elif mode == "truncated":
            self.chunked(ndjson()[:150])
            self.close_connection = True


def serve(handler, path=""):
    """Serve ``handler`` on a free port in a thread; yields the base URL (with ``path``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def fake():
    yield from serve(FakeOllama)


def fake_config(url, tmp_path, prompts, **extra):
    return config(url, tmp_path, **{"model": "m", "prompts": prompts, "duration": 0.2, "warmup_requests": 0, **extra})


@pytest.mark.parametrize("mode", ["thinking", "thinking-spaced"])
def test_reasoning_chunks_are_tokens_and_the_answer_is_timed_apart(fake, tmp_path, mode):
    records = measured(run_loadgen(fake_config(fake, tmp_path, [mode])))
    assert records
    for r in records:
        assert r.ok, r.error
        # Compact lines (the fast path) and spaced ones (parsed) count alike.
        assert (r.output_tokens, r.thinking_tokens, r.eval_count) == (4, 2, 5)
        assert r.ttfat_ms >= r.ttft_ms > 0


@pytest.mark.parametrize("framing", ["chunked", "length", "length-spaced", "close", "whole"])
def test_every_body_framing_parses(fake, tmp_path, framing):
    before = FakeOllama.connections
    events = run_loadgen(fake_config(fake, tmp_path, [framing]))
    records = measured(events)
    assert len(records) >= 3 and events[-1]["status"] == "completed"
    for r in records:
        assert r.ok, r.error
        assert r.output_tokens == (1 if framing == "whole" else 4)
        assert (r.eval_count, r.eval_duration_ns, r.prompt_tokens, r.done_reason) == (4, 40_000_000, 3, "stop")
        assert (r.prompt_eval_duration_ns, r.load_duration_ns, r.total_duration_ns) == (1_000_000, 5, 50_000_000)
        assert r.server_tokens_per_second == 100.0
    if framing in ("chunked", "length"):  # kept alive: a few connections carry many requests
        assert FakeOllama.connections - before < len(records) / 2


def test_quality_expectations_match_case_insensitively(fake, tmp_path):
    prompts = [{"prompt": "chunked", "expect": ["nope", "WORLD"]}, {"prompt": "length", "expect": ["absent"]},
               "close", {"prompt": "whole", "expect": "hello, world!"}]
    records = measured(run_loadgen(fake_config(fake, tmp_path, prompts, concurrency=4)))
    matched = {r.prompt_index: r.matched for r in records}
    assert matched == {0: True, 1: False, 2: None, 3: True}


@pytest.mark.parametrize(("framing", "error"), [
    ("missing", 'HTTP 404: model "m" not found, try pulling it first'),
    ("midstream", "out of memory"),
    ("truncated", "connection closed before the final chunk"),
])
def test_failures_are_error_records(fake, tmp_path, framing, error):
    records = measured(run_loadgen(fake_config(fake, tmp_path, [framing])))
    assert records and all(r.error == error and r.matched is None for r in records)
    assert all(r.output_tokens == (1 if framing == "midstream" else 0) for r in records if framing != "truncated")


def test_lost_stdout_leaves_a_complete_checkpoint(fake, tmp_path):
    process = subprocess.Popen([sys.executable, "-", json.dumps(fake_config(fake, tmp_path, ["length"], duration=0.5))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    process.stdin.write(LOADGEN_SOURCE.encode())
    process.stdin.close()
    assert json.loads(process.stdout.readline())["event"] == "connection"
    process.stdout.close()  # the SSH channel is gone
    assert process.wait(10) == 0
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert checkpoint["status"] == "completed" and len(checkpoint["results"]) >= 3
    assert checkpoint["summary"]["requests"] == len(checkpoint["results"])


def python_3_8():
    """A working Python 3.8 interpreter (the oldest the generator supports), or None."""
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    candidates = [shutil.which("python3.8"), *pyenv]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                               text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
            return candidate
    return None


PYTHON_3_8 = python_3_8()


@pytest.mark.skipif(PYTHON_3_8 is None, reason="no Python 3.8 interpreter here")
def test_runs_on_python_3_8(fake, tmp_path):
    events = run_loadgen(fake_config(fake, tmp_path, ["chunked", {"prompt": "length", "expect": ["world"]}],
                                     concurrency=2), python=PYTHON_3_8)
    records = measured(events)
    assert events[-1]["status"] == "completed" and records and all(r.ok for r in records)


# ------------------------------------- the OpenAI-compatible protocol (SSE), against the stand-in

OPENAI = ["openai-chat", "openai-completions"]


@pytest.mark.parametrize("protocol", OPENAI)
def test_openai_streams_measure_the_truth_and_the_servers_counts(ollama, tmp_path, protocol):
    events = run_loadgen(config(ollama.url, tmp_path, protocol=protocol, concurrency=2))
    finish, records = events[-1], measured(events)
    assert finish["status"] == "completed" and finish["incomplete"] == 0 and len(records) >= 4
    for r in records:
        assert r.ok, r.error
        # The client's count of token chunks is the server's usage.completion_tokens.
        assert r.output_tokens == r.eval_count > 1 and r.prompt_tokens > 0
        assert r.done_reason in ("stop", "length") and r.thinking_tokens == 0 and r.ttfat_ms == r.ttft_ms
        assert r.tpot_ms == pytest.approx((r.latency_ms - r.ttft_ms) / (r.output_tokens - 1), rel=1e-2)
    results = summarize(records, finish["duration_seconds"])
    assert results.p50_tokens_per_second == pytest.approx(RATE, rel=0.05)
    assert results.p50_ttft_ms == pytest.approx(TTFT_MS, abs=15)
    assert finish["itl_ms"]["count"] == sum(r.output_tokens - 1 for r in records)
    assert finish["delivered_concurrency"] == pytest.approx(2, rel=0.1)
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert [RequestRecord.model_validate(r) for r in checkpoint["results"]] == [
        RequestRecord.model_validate(e) for e in events if e["event"] == "request"]


@pytest.mark.parametrize("protocol", OPENAI)
def test_openai_max_tokens_per_prompt_and_quality_checks(ollama, tmp_path, protocol):
    prompts = [{"prompt": SEED_PROMPTS[0], "max_tokens": 2}, {"prompt": SEED_PROMPTS[1], "expect": ["zzz-absent"]}]
    records = measured(run_loadgen(config(ollama.url, tmp_path, protocol=protocol, prompts=prompts, max_tokens=9)))
    assert {r.prompt_index for r in records} == {0, 1}
    for r in records:
        limit = 2 if r.prompt_index == 0 else 9
        assert r.ok and r.output_tokens == r.eval_count <= limit
        assert (r.done_reason == "length") == (r.eval_count == limit)
        assert r.matched is (None if r.prompt_index == 0 else False)
    assert max(r.eval_count for r in records if r.prompt_index == 1) > 2  # the prompt's own cap, not the run's


def test_extra_body_fields_reach_the_server_last(ollama, tmp_path):
    records = measured(run_loadgen(config(ollama.url, tmp_path, protocol="openai-chat", duration=0.5,
                                          extra_body={"max_tokens": 3})))
    assert records and all(r.ok and r.eval_count == r.output_tokens <= 3 for r in records)


def test_openai_chat_reasoning_deltas_are_thinking_tokens(ollama, tmp_path):
    ollama.pull(THINKING_MODEL)
    records = measured(run_loadgen(config(ollama.url, tmp_path, protocol="openai-chat", model=THINKING_MODEL,
                                          max_tokens=2000, duration=1.0)))
    assert records
    for r in records:
        assert r.ok, r.error
        assert 0 < r.thinking_tokens < r.output_tokens and r.ttfat_ms > r.ttft_ms > 0
        # One token of slack, as on Ollama's API: the swallowed closing </think> tag.
        assert r.eval_count - 1 <= r.output_tokens <= r.eval_count


@pytest.mark.parametrize("protocol", OPENAI)
def test_openai_unknown_model_is_a_clear_request_error(ollama, tmp_path, protocol):
    events = run_loadgen(config(ollama.url, tmp_path, protocol=protocol, model="not-pulled:1b", duration=0.3,
                                warmup_requests=0))
    records = [e for e in events if e["event"] == "request"]
    assert records and all(r["error"].startswith("HTTP 404: ") and "not found" in r["error"] for r in records)
    assert "{" not in records[0]["error"]  # the message, not OpenAI's error object
    assert events[-1]["status"] == "completed"


def test_openai_stalled_stream_is_aborted_at_the_stall_timeout(ollama, tmp_path):
    store = StateStore(ollama.instance.parent / "state")
    store.write_stream_faults([StreamFault(id=1, kind="stall", after_tokens=3, times=1)])
    try:
        records = measured(run_loadgen(config(ollama.url, tmp_path, protocol="openai-chat", warmup_requests=0,
                                              duration=0.5, request_timeout=1)))
    finally:
        store.write_stream_faults([])
    stalled = records[0]
    assert stalled.error == "stalled: no data for 1 s (stall timeout)" and stalled.output_tokens == 3
    assert all(r.ok for r in records[1:])


@pytest.mark.parametrize("protocol", OPENAI)
def test_openai_cut_at_deadline_keeps_what_was_streamed(ollama, tmp_path, protocol):
    max_tokens, duration = 4000, 1.0
    events = run_loadgen(config(ollama.url, tmp_path, protocol=protocol, duration=duration, concurrency=2,
                                warmup_requests=0, max_tokens=max_tokens, cut_at_deadline=True))
    finish, records = events[-1], measured(events)
    assert finish["incomplete"] == 2 and duration <= finish["duration_seconds"] < duration + 5
    for r in records:
        assert r.incomplete and r.error is None and 10 < r.output_tokens < max_tokens and r.eval_count is None
        assert r.tokens_per_second == pytest.approx(RATE, rel=0.1)


def test_openai_server_dying_mid_stream_is_a_request_error(tmp_path):
    server = Server(write_instance(tmp_path / "dying"))
    try:
        server.pull("qwen2:7b")
        process = subprocess.Popen(
            [sys.executable, "-", json.dumps(config(server.url, tmp_path, protocol="openai-completions", duration=3,
                                                    max_tokens=4000, progress_interval=0.2))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        process.stdin.write(LOADGEN_SOURCE)
        process.stdin.close()
        for line in process.stdout:
            if json.loads(line)["event"] == "progress":  # the measured request is streaming (TTFT 40 ms)
                break
        server.proc.kill()
        events = [json.loads(line) for line in process.stdout]
        assert process.wait(30) == 0
    finally:
        server.stop()
    records = measured(events)
    assert records[0].error == "connection closed before the final chunk"
    assert all(r.error for r in records) and events[-1]["status"] == "completed"


# ------------------------------------------------ SSE framings and errors, against a fake


def sse(chunks, done=True, newline=b"\n"):
    events = [b"data: " + json.dumps(c, separators=(",", ":")).encode() + newline + newline for c in chunks]
    return b"".join(events) + (b"data: [DONE]" + newline + newline if done else b"")


def chat_chunk(finish=None, **delta):
    return {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


USAGE = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}
# vLLM's shape: a role-only first chunk, reasoning under either name, the last token with the finish.
REASONING_STREAM = [chat_chunk(role="assistant", content=""), chat_chunk(reasoning="Hm"),
                    chat_chunk(reasoning_content=", ok", content=None), chat_chunk(content="Hi"),
                    chat_chunk(finish="length", content=" there"), USAGE]


class FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """Answers /v1/chat/completions in the way its (last) message names."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, payload, status=200, content_type="text/event-stream", **headers):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions" and body["stream"] and body["stream_options"]["include_usage"]
        mode = body["messages"][-1]["content"]
        if mode == "reasoning":
            self.reply(sse(REASONING_STREAM))
        elif mode == "crlf-comments":  # sse-starlette's line ends, and keep-alive comments
            self.reply(b": ping\r\n\r\n" + sse(REASONING_STREAM, newline=b"\r\n"))
        elif mode == "no-done":  # a body that ends after the usage chunk, without [DONE]
            self.reply(sse(REASONING_STREAM, done=False))
        elif mode == "whole":  # a server that ignored "stream"
            answer = {"id": "c", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hi there"}, "finish_reason": "stop"}],
                "usage": USAGE["usage"]}
            self.reply(json.dumps(answer).encode(), content_type="application/json")
        elif mode == "auth":
            if self.headers.get("Authorization") == "Bearer s3cret-token":
                self.reply(sse(REASONING_STREAM))
            else:
                self.reply(b'{"error":{"message":"Invalid API key","type":"invalid_request_error"}}', 401,
                           content_type="application/json")
        elif mode == "ignore-eos":  # answers only a request that asks to generate past end-of-sequence
            if body.get("ignore_eos") is True:
                self.reply(sse(REASONING_STREAM))
            else:
                self.reply(b'{"object":"error","message":"expected ignore_eos","code":400}', 400,
                           content_type="application/json")
        elif mode == "vllm-error":
            self.reply(b'{"object":"error","message":"max_tokens is too large","type":"BadRequestError",'
                       b'"param":null,"code":400}', 400, content_type="application/json")
        elif mode == "midstream":
            self.reply(sse([chat_chunk(content="Hi"), {"error": {"message": "CUDA out of memory", "code": 500}}]))
        elif mode == "truncated":  # the server went away after two tokens, before the finish
            payload = sse([chat_chunk(content="Hi"), chat_chunk(content="!")], done=False)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True


@pytest.fixture(scope="module")
def fake_openai():
    yield from serve(FakeOpenAI, "/v1")  # a base URL as OpenAI clients take it: the generator drops the /v1


@pytest.mark.parametrize("mode", ["reasoning", "crlf-comments", "no-done", "whole"])
def test_openai_framings_count_tokens_reasoning_and_usage(fake_openai, tmp_path, mode):
    records = measured(run_loadgen(fake_config(fake_openai, tmp_path, [mode], protocol="openai-chat")))
    assert records
    for r in records:
        assert r.ok, r.error
        assert (r.eval_count, r.prompt_tokens) == (4, 7)
        if mode == "whole":
            assert (r.output_tokens, r.thinking_tokens, r.done_reason) == (1, 0, "stop")
        else:
            assert (r.output_tokens, r.thinking_tokens, r.done_reason) == (4, 2, "length")
            assert r.ttfat_ms >= r.ttft_ms > 0


def test_openai_bearer_token_comes_from_the_environment_and_goes_nowhere_else(fake_openai, tmp_path):
    cfg = fake_config(fake_openai, tmp_path, ["auth"], protocol="openai-chat", api_key_env="GPUBENCH_TEST_KEY")
    done = subprocess.run([sys.executable, "-", json.dumps(cfg)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "GPUBENCH_TEST_KEY": "s3cret-token"})
    records = measured([json.loads(line) for line in done.stdout.splitlines()])
    assert records and all(r.ok for r in records)
    assert "s3cret" not in done.stdout + done.stderr + (tmp_path / "ck" / "checkpoint.json").read_text()
    # Without the token: the server's 401 message; with the variable unset: a failed run that says so.
    records = measured(run_loadgen(fake_config(fake_openai, tmp_path, ["auth"], protocol="openai-chat")))
    assert records and all(r.error == "HTTP 401: Invalid API key" for r in records)
    env = {k: v for k, v in os.environ.items() if k != "GPUBENCH_TEST_KEY"}
    done = subprocess.run([sys.executable, "-", json.dumps(cfg)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120, env=env)
    finish = json.loads(done.stdout.splitlines()[-1])
    assert finish["status"] == "failed" and "GPUBENCH_TEST_KEY" in finish["message"]


@pytest.mark.parametrize(("mode", "error", "tokens"), [
    ("vllm-error", "HTTP 400: max_tokens is too large", 0),
    ("midstream", "CUDA out of memory", 1),
    ("truncated", "stream ended before the final chunk", 2),  # a close-delimited body: the close ends it
])
def test_openai_failures_are_error_records(fake_openai, tmp_path, mode, error, tokens):
    records = measured(run_loadgen(fake_config(fake_openai, tmp_path, [mode], protocol="openai-chat")))
    assert records and all(r.error == error and r.output_tokens == tokens for r in records)


def test_unknown_protocol_fails_the_run_clearly(fake_openai, tmp_path):
    done = subprocess.run([sys.executable, "-", json.dumps(fake_config(fake_openai, tmp_path, ["reasoning"],
                                                                      protocol="grpc"))],
                          input=LOADGEN_SOURCE, text=True, capture_output=True, timeout=120)
    finish = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 1 and finish["status"] == "failed" and "unknown protocol 'grpc'" in finish["message"]


def test_a_prompt_s_ignore_eos_is_sent_on_the_openai_protocol_only(fake_openai, ollama, tmp_path):
    entry = [{"prompt": "ignore-eos", "ignore_eos": True}]
    records = measured(run_loadgen(fake_config(fake_openai, tmp_path, entry, protocol="openai-chat")))
    assert records and all(r.ok and r.eval_count == 4 for r in records), [r.error for r in records]
    plain = measured(run_loadgen(fake_config(fake_openai, tmp_path, ["ignore-eos"], protocol="openai-chat")))
    assert plain and not any(r.ok for r in plain)
    # Ollama has no such option: the same entry is a plain request there (its API refuses nothing).
    prompts = [{"prompt": SEED_PROMPTS[0], "ignore_eos": True, "max_tokens": 3}]
    on_ollama = measured(run_loadgen(config(ollama.url, tmp_path, prompts=prompts, duration=0.5)))
    assert on_ollama and all(r.ok and r.eval_count <= 3 for r in on_ollama)


# ------------------------------------------------------------ trace replay (issue 23 item 4)


def test_a_schedule_sends_request_i_with_prompt_i_at_its_time(ollama, tmp_path):
    """``schedule``: measured request i is prompt i, sent at t_i (open loop, whatever is in flight);
    the server's request log agrees on what arrived and when (within 10 ms of the schedule).

    The 10 ms is the schedule's precision on a free CPU: a busy machine only ever makes a send
    late (and the record says by how much), so one of three tries on time shows the precision."""
    from pytest_gpubench.sandbox.standin_state import read_requests

    offsets = [0.0, 0.05, 0.3, 0.32, 0.6]
    prompts = [{"prompt": f"trace request number {i} " + "word " * (3 * i), "max_tokens": 2 + i}
               for i in range(len(offsets))]
    late = []
    for _ in range(3):
        before = len(read_requests(ollama.instance.parent / "state"))
        events = run_loadgen(config(ollama.url, tmp_path, prompts=prompts, schedule=offsets, duration=offsets[-1],
                                    warmup_requests=0))
        records = measured(events)
        assert [r.scheduled_at for r in records] == pytest.approx(offsets, abs=1e-6)
        assert all(r.ok for r in records)
        assert all(1 <= r.output_tokens <= 2 + i for i, r in enumerate(records))  # each prompt's own max_tokens
        finish = events[-1]
        assert finish["unsent"] == 0 and finish["send_lag_ms"]["max"] == max(r.send_lag_ms for r in records)
        logged = read_requests(ollama.instance.parent / "state")[before:]
        assert [e["prompt"] for e in logged] == [p["prompt"] for p in prompts]
        arrived = [e["received_at"] - logged[0]["received_at"] for e in logged]
        # What the record says was sent is what the server saw arrive (a generous bound). A starved
        # server stamps its arrivals late too (105 ms once, in a full suite), so this is retried with
        # the rest: a record that misstates its sends would miss in every try.
        sent = [r.scheduled_at + r.send_lag_ms / 1000 for r in records]
        disagreement = max(abs(a - (s - sent[0])) for a, s in zip(arrived, sent, strict=True))
        worst = max(max(r.send_lag_ms for r in records) / 1000,
                    max(abs(a - t) for a, t in zip(arrived, offsets, strict=True)))
        if worst < 0.010 and disagreement < 0.050:
            return
        late.append(f"{worst * 1000:.1f} ms off the schedule, sends and arrivals {disagreement * 1000:.1f} ms apart "
                    f"(arrived {arrived}, sent {sent})")
    pytest.fail(f"three tries, each with a request more than 10 ms off its schedule: {late}")


def test_a_schedule_held_by_max_in_flight_sends_late_and_shows_the_lag(ollama, tmp_path):
    """At the cap the schedule waits (nothing is dropped): the late requests' lag is the wait."""
    offsets = [0.0, 0.01, 0.02]
    events = run_loadgen(config(ollama.url, tmp_path, prompts=["one two three"] * 3, schedule=offsets,
                                duration=offsets[-1], warmup_requests=0, max_tokens=8, max_in_flight=1))
    records = measured(events)
    assert len(records) == 3 and events[-1]["unsent"] == 0
    for earlier, later in zip(records, records[1:]):  # each waited for the one before to finish
        assert later.send_lag_ms / 1000 + later.scheduled_at >= earlier.scheduled_at + \
            (earlier.send_lag_ms + earlier.latency_ms) / 1000 - 0.002


def test_a_trace_conversation_is_sent_as_recorded_on_the_chat_protocol(ollama, tmp_path):
    from pytest_gpubench.sandbox.standin_state import read_requests

    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."},
               {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another?"}]
    entry = {"prompt": "Be brief.\n\nName a prime.\n\nSeven.\n\nAnother?", "messages": history, "max_tokens": 3}
    before = len(read_requests(ollama.instance.parent / "state"))
    events = run_loadgen(config(f"{ollama.url}/v1", tmp_path, protocol="openai-chat", prompts=[entry],
                                schedule=[0.0], duration=0.0, warmup_requests=0))
    assert measured(events)[0].ok
    logged = read_requests(ollama.instance.parent / "state")[before:]
    assert [e["messages"] for e in logged] == [history]
