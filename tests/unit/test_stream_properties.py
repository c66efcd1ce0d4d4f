"""Property-based tests of the stream parsers that read what a server or a container
writes (issue 21): the load generator's HTTP/NDJSON (Ollama) and SSE (OpenAI) response
parser, its seed-004 worker event parser, and the controller's reader of the load
generator's own events. Any bytes, split at any point, invalid UTF-8 and oversized lines
included: each request ends in exactly one record the controller accepts (a clean result
or an error record), never an exception out of the parser or a hang."""

from __future__ import annotations

import array
import asyncio
import json

import pytest
from hypothesis import example, given, settings, strategies as st

from parser_properties import PARSER_SETTINGS, within
from pytest_gpubench.measure.benchmark import LoadgenPass, _consume
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.remote import loadgen


# ------------------------------------------------------------------ a request on fake I/O


class FakeSocket:
    """The bytes a server sends, in the pieces ``recv`` returns them; then the end."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.closed = False

    def recv(self, size: int) -> bytes:
        if not self.pieces:
            return b""  # the server closed the connection
        piece = self.pieces.pop(0)
        if len(piece) > size:
            self.pieces.insert(0, piece[size:])
            piece = piece[:size]
        return piece

    def close(self) -> None:
        self.closed = True


class FakeRun:
    """What an :class:`~loadgen.Exchange` asks of its load generator."""

    tls = None

    def __init__(self, chat: bool = True, expect: list[str] | None = None) -> None:
        self.chat = chat
        self.prompts = [("prompt", expect, None, False)]
        self.gaps = array.array("d")
        self.idle: list[object] = []
        self.open: set[object] = set()
        self.start = 0.0
        self.records: list[dict] = []

    def finished(self, exchange: object, record: dict, now: float) -> None:
        self.records.append(record)


def exchange_over(kind: type, pieces: list[bytes], *, chat: bool = True, expect: list[str] | None = None):
    """Run one request of ``kind`` over a socket that delivers ``pieces``, then closes;
    the records it produced."""
    run = FakeRun(chat=chat, expect=expect)
    exchange = kind(run, 0, False, 0, 0.0)
    exchange.sent = exchange.last_io = exchange.started_at = 0.0
    exchange.sock = FakeSocket(pieces)
    exchange.reused = exchange.received = False
    exchange.retried = True  # no reconnect: a fake socket has no server behind it
    exchange.state = loadgen.HEAD
    exchange.status = None
    exchange.buffer = exchange.partial = exchange.detail = b""
    run.open.add(exchange)
    with within():
        for _ in range(len(pieces) + 64 * (1 + sum(len(p) for p in pieces) // loadgen.RECV_SIZE) + 2):
            if exchange.state not in (loadgen.HEAD, loadgen.BODY) or exchange.sock is None:
                break
            exchange.read()
    return exchange, run.records


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the offsets ``cuts`` (any order, repeats ignored)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return [p for p in pieces if p]


def assert_one_clean_record(exchange, records: list[dict]) -> dict:
    """The request ended, once, in a record the controller takes (``_consume`` validates
    each with RequestRecord and drops one that does not validate: a lost measurement)."""
    assert not exchange.active, "the request is still in flight after the connection closed"
    assert len(records) == 1, f"{len(records)} records for one request"
    record = records[0]
    text = json.dumps(record, separators=(",", ":"))
    RequestRecord.model_validate(json.loads(text))
    if record["error"] is not None:
        assert isinstance(record["error"], str) and record["error"].strip() and len(record["error"]) <= 1100
    return record


# ------------------------------------------------------------------ strategies


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes or [len(body)]:
        piece = body[pos:pos + max(1, size)]
        if not piece:
            break
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        pos += len(piece)
    if pos < len(body):
        out += b"%x\r\n" % (len(body) - pos) + body[pos:] + b"\r\n"
    return out + b"0\r\n\r\n"


def response(body: bytes, framing: str, sizes: list[int], status: int = 200) -> bytes:
    head = b"HTTP/1.1 %d OK\r\nContent-Type: application/x-ndjson\r\n" % status
    if framing == "chunked":
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, sizes)
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    return head + b"Connection: close\r\n\r\n" + body


token_texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
framings = st.sampled_from(["chunked", "length", "close"])
cut_points = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12)
chunk_sizes = st.lists(st.integers(min_value=1, max_value=64), max_size=8)

#: JSON values a server might put where a number or a word belongs.
odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300, max_value=10**310),
    st.floats(), st.text(max_size=20), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def ollama_stream(tokens: list[str], final: dict) -> bytes:
    lines = [json.dumps({"model": "m", "response": t, "done": False}, separators=(",", ":")) for t in tokens]
    lines.append(json.dumps({"model": "m", "response": "", "done": True, **final}, separators=(",", ":"),
                            allow_nan=True))
    return ("\n".join(lines) + "\n").encode()


def sse_stream(tokens: list[str], usage: dict, timings: dict) -> bytes:
    events = [json.dumps({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]},
                         separators=(",", ":")) for t in tokens]
    events.append(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                              "usage": usage, "timings": timings}, separators=(",", ":"), allow_nan=True))
    return b"".join(b"data: " + e.encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


# ------------------------------------------------------------------ the HTTP response parser


@PARSER_SETTINGS
@given(tokens=st.lists(token_texts, min_size=1, max_size=20), framing=framings, sizes=chunk_sizes, cuts=cut_points)
def test_an_ollama_stream_split_anywhere_reads_as_a_whole(tokens, framing, sizes, cuts):
    data = response(ollama_stream(tokens, {"eval_count": len(tokens), "eval_duration": 10**9}), framing, sizes)
    exchange, records = exchange_over(loadgen.Exchange, splits(data, cuts), expect=["zzz"])
    record = assert_one_clean_record(exchange, records)
    assert record["error"] is None, record["error"]
    assert record["output_tokens"] == sum(1 for t in tokens if t) and record["eval_count"] == len(tokens)
    assert record["matched"] is ("zzz" in "".join(tokens).lower())


@PARSER_SETTINGS
@given(tokens=st.lists(token_texts, min_size=1, max_size=20), framing=framings, sizes=chunk_sizes, cuts=cut_points)
def test_an_sse_stream_split_anywhere_reads_as_a_whole(tokens, framing, sizes, cuts):
    data = response(sse_stream(tokens, {"completion_tokens": len(tokens), "prompt_tokens": 3}, {}), framing, sizes)
    exchange, records = exchange_over(loadgen.SSEExchange, splits(data, cuts), expect=["zzz"])
    record = assert_one_clean_record(exchange, records)
    assert record["error"] is None, record["error"]
    assert record["output_tokens"] == len(tokens) and record["eval_count"] == len(tokens)
    assert record["matched"] is ("zzz" in "".join(tokens).lower())


def ollama_chat_stream(tokens: list[str]) -> bytes:
    lines = [json.dumps({"message": {"role": "assistant", "content": t}, "done": False}, separators=(",", ":"))
             for t in tokens]
    lines.append(json.dumps({"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": len(tokens)},
                            separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def chunk_per_line(body: bytes) -> list[bytes]:
    """A chunked body as servers stream it at low load: each line (an SSE event with its blank line)
    its own chunk, and each chunk its own read."""
    ends = body.replace(b"\n\n", b"\0\0").split(b"\n")  # keep an event's blank line with it
    lines = [e.replace(b"\0\0", b"\n\n") + (b"" if e.endswith(b"\0\0") else b"\n") for e in ends if e]
    return [b"%x\r\n" % len(line) + line + b"\r\n" for line in lines] + [b"0\r\n\r\n"]


@PARSER_SETTINGS
@given(tokens=st.lists(token_texts, min_size=1, max_size=20), protocol=st.sampled_from(["ollama", "chat", "openai"]),
       pick=st.integers(min_value=0))
def test_a_stream_read_one_whole_chunk_at_a_time_counts_every_token_and_its_text(tokens, protocol, pick):
    # The read of one whole single-line chunk is framed on its own short path (issue 23 item 8):
    # it must count the same tokens and keep the same text as the general chunk parser.
    if protocol == "ollama":
        kind, body = loadgen.Exchange, ollama_stream(tokens, {"eval_count": len(tokens)})
    elif protocol == "chat":
        kind, body = loadgen.OllamaChatExchange, ollama_chat_stream(tokens)
    else:
        kind, body = loadgen.SSEExchange, sse_stream(tokens, {"completion_tokens": len(tokens)}, {})
    wanted = tokens[pick % len(tokens)].lower().strip() or "zzz"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    exchange, records = exchange_over(kind, [head] + chunk_per_line(body), expect=[wanted])
    record = assert_one_clean_record(exchange, records)
    assert record["error"] is None, record["error"]
    assert record["output_tokens"] == sum(1 for t in tokens if t) and record["eval_count"] == len(tokens)
    assert record["matched"] is (wanted in "".join(tokens).lower())


@PARSER_SETTINGS
@given(final=st.dictionaries(st.sampled_from(["eval_count", "eval_duration", "prompt_eval_count",
                                              "prompt_eval_duration", "load_duration", "total_duration",
                                              "done_reason", "response"]), odd_values, max_size=8),
       framing=framings, cuts=cut_points)
# A count past what a float holds: eval_count / seconds raised OverflowError, out of the parser.
@example(final={"eval_count": 10**400, "eval_duration": 1}, framing="length", cuts=[])
# Counters of another type: the record did not validate and the controller dropped it.
@example(final={"eval_count": "12", "done_reason": 5}, framing="length", cuts=[])
def test_odd_server_counters_give_a_record_the_controller_keeps(final, framing, cuts):
    data = response(ollama_stream(["a", "b"], final), framing, [])
    exchange, records = exchange_over(loadgen.Exchange, splits(data, cuts), expect=["a"])
    assert_one_clean_record(exchange, records)


@PARSER_SETTINGS
@given(usage=st.dictionaries(st.sampled_from(["completion_tokens", "prompt_tokens"]), odd_values, max_size=2),
       timings=st.dictionaries(st.sampled_from(["predicted_ms", "prompt_ms"]), odd_values, max_size=2),
       cuts=cut_points)
# llama.cpp's timings as infinity: int(inf * 1e6) raised OverflowError, out of the parser.
@example(usage={}, timings={"predicted_ms": float("inf")}, cuts=[])
@example(usage={"completion_tokens": 1.5}, timings={"prompt_ms": 10**400}, cuts=[])
def test_odd_usage_and_timings_give_a_record_the_controller_keeps(usage, timings, cuts):
    data = response(sse_stream(["a"], usage, timings), "chunked", [7])
    exchange, records = exchange_over(loadgen.SSEExchange, splits(data, cuts))
    assert_one_clean_record(exchange, records)


@PARSER_SETTINGS
@given(lines=st.lists(st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b'{"done":false,"response":"x"}', b'{"done":true}', b'[{"done":false,"response":"x"}]',
                     b'{"done":false,"response":"x"', b'{"response":5,"done":true}', b'{"error":{"a":1}}',
                     b'{"error":null}', b'{"error":""}', b'{"error":"' + b"e" * 5000 + b'"}', b"\xff\xfe",
                     b"[" * 3000, b"null", b"1e999999"]),
), max_size=6), framing=framings, sizes=chunk_sizes, cuts=cut_points, expect=st.booleans())
# Nested deeper than json's recursion limit: RecursionError, not ValueError, ended the whole run.
@example(lines=[b"[" * 100000], framing="length", sizes=[], cuts=[], expect=False)
# A body that ends at the connection's close with a line that is not JSON: the ValueError
# came out of eof(), outside the parser's guard, and ended the whole run.
@example(lines=[b"garbage"], framing="close", sizes=[], cuts=[], expect=False)
# A token line that is JSON but not an object (or not JSON at all) kept for the expectation
# check: record() raised after the request was marked done, so it was never recorded and
# the run waited for it forever.
@example(lines=[b'[{"done":false,"response":"x"}]', b'{"done":true}'], framing="length", sizes=[], cuts=[],
         expect=True)
@example(lines=[b'{"done":false,"response":"x"', b'{"done":true}'], framing="length", sizes=[], cuts=[],
         expect=True)
# A final chunk whose text is not a string: "".join raised TypeError.
@example(lines=[b'{"response":5,"done":true}'], framing="length", sizes=[], cuts=[], expect=True)
# An error with no message was an error record with an empty one; a long one was kept whole.
@example(lines=[b'{"error":""}'], framing="length", sizes=[], cuts=[], expect=False)
@example(lines=[b'{"error":"' + b"e" * 5000 + b'"}'], framing="length", sizes=[], cuts=[], expect=False)
def test_any_ollama_body_ends_in_one_record(lines, framing, sizes, cuts, expect):
    data = response(b"\n".join(lines) + b"\n", framing, sizes)
    exchange, records = exchange_over(loadgen.Exchange, splits(data, cuts), expect=["x"] if expect else None)
    assert_one_clean_record(exchange, records)


@PARSER_SETTINGS
@given(lines=st.lists(st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b'data: {"choices":[{"delta":{"content":"x"},"finish_reason":null}]}',
                     b'data: [{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}]',
                     b'data: {"choices":[{"delta":{"content":5},"finish_reason":"stop"}]}',
                     b'data: {"choices":[{"message":{"content":["x"]}}]}', b'{"choices":[{"text":7}]}',
                     b'data: {"error":{"message":"boom"}}', b"data: [DONE]", b"data: " + b"[" * 3000,
                     b": ping", b"event: x", b"data:", b"data: {\xff}"]),
), max_size=6), framing=framings, sizes=chunk_sizes, cuts=cut_points, chat=st.booleans(), expect=st.booleans())
@example(lines=[b"data: " + b"[" * 100000], framing="chunked", sizes=[], cuts=[], chat=True, expect=False)
# A content that is not a string, kept for the expectation check: "".join raised TypeError.
@example(lines=[b'data: {"choices":[{"delta":{"content":5},"finish_reason":"stop"}]}', b"data: [DONE]"],
         framing="chunked", sizes=[], cuts=[], chat=True, expect=True)
@example(lines=[b'data: [{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}]', b"data: [DONE]"],
         framing="chunked", sizes=[], cuts=[], chat=True, expect=True)
def test_any_sse_body_ends_in_one_record(lines, framing, sizes, cuts, chat, expect):
    data = response(b"\n".join(lines) + b"\n", framing, sizes)
    exchange, records = exchange_over(loadgen.SSEExchange, splits(data, cuts), chat=chat,
                                      expect=["x"] if expect else None)
    assert_one_clean_record(exchange, records)


@PARSER_SETTINGS
@given(head=st.binary(max_size=120), body=st.binary(max_size=60), cuts=cut_points)
# A status line with no status: IndexError, not ValueError, ended the whole run.
@example(head=b"HTTP/1.1\r\n\r\n", body=b"", cuts=[])
# A negative chunk size: the chunk parser went back and forth over the same bytes forever.
@example(head=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", body=b"-6\r\nxx", cuts=[])
@example(head=b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", body=b'{"done":true}\n', cuts=[])
# An error status whose body nests deeper than json's recursion limit: RecursionError.
@example(head=b"HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n", body=b"[" * 100000, cuts=[])
def test_any_response_head_and_body_end_in_one_record(head, body, cuts):
    prefix = head if head.startswith(b"HTTP/") else b"HTTP/1.1 200 OK\r\n" + head + b"\r\n\r\n"
    exchange, records = exchange_over(loadgen.Exchange, splits(prefix + body, cuts))
    assert_one_clean_record(exchange, records)


def test_thousands_of_interim_answers_are_read_in_a_loop():
    # head() called itself once per interim answer (100 Continue) in a read: RecursionError.
    head = b"HTTP/1.1 100 Continue\r\n\r\n" * 3000 + b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n"
    exchange, records = exchange_over(loadgen.Exchange, [head + b'{"done":true}\n'])
    assert assert_one_clean_record(exchange, records)["error"] is None


@PARSER_SETTINGS
@given(framing=framings, newline=st.booleans())
def test_an_oversized_line_is_a_request_error_not_unbounded_memory(framing, newline):
    # Longer than one read (RECV_SIZE), so that it waits for its end in the parser's buffer.
    body = b'{"done":false,"response":"' + b"x" * 200_000 + (b'"}\n' if newline else b"")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loadgen, "LINE_MAX", 1000)
        exchange, records = exchange_over(loadgen.Exchange, [response(body, framing, [700, 700])])
    record = assert_one_clean_record(exchange, records)
    assert "longer than" in (record["error"] or ""), record


# ------------------------------------------------------------------ seed 004's worker events


class FakePipe:
    def close(self) -> None:
        pass


class FakeProcess:
    """A worker's process that has exited: nothing to signal."""

    pid = -1

    def __init__(self) -> None:
        self.stdin, self.stdout, self.stderr = FakePipe(), FakePipe(), FakePipe()

    def poll(self) -> int:
        return 0


class FakeSelector:
    def unregister(self, pipe: object) -> None:
        raise KeyError(pipe)


def worker_over(pieces: list[bytes], expect: list[str] | None):
    """A worker that is up, sent one request, and writes ``pieces`` to its stdout."""
    run = FakeRun(expect=expect)
    run.selector, run.idle_workers, run.worker_statuses, run.worker_problem = FakeSelector(), [], set(), None
    run.output = type("Events", (), {"emit": lambda self, event, **fields: None})()
    worker = object.__new__(loadgen.WorkerProcess)
    worker.run, worker.number, worker.started, worker.up = run, 0, 0.0, True
    worker.pending, worker.stdout, worker.stderr, worker.code = b"", bytearray(), b"", None
    worker.proc, worker.writing = FakeProcess(), False
    exchange = loadgen.WorkerExchange(run, 0, False, 0, 0.0)
    exchange.started_at = exchange.last_io = exchange.sent = 0.0
    exchange.worker, worker.exchange = worker, exchange
    run.open.add(exchange)
    with within():
        for piece in pieces:
            worker.received(piece, 1.0)
        if exchange.active:  # the container ended without a finish: the run's stall check fails it
            exchange.fail("stalled", 2.0)
    return exchange, run.records


worker_lines = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b'{"event":"text_delta","delta":"x"}', b'{"event":"text_delta","delta":5}',
                     b'{"event":"text","content":["x"]}', b'{"event":"finish","status":"completed"}',
                     b'{"event":"finish","status":"failed","message":{"a":1}}', b'{"event":"worker","status":1}',
                     b'{"event":5}', b"[1]", b"\xff\xfe{}", b"[" * 3000, b'{"event":"finish","status":null}']),
)


@PARSER_SETTINGS
@given(lines=st.lists(worker_lines, max_size=6), cuts=cut_points, expect=st.booleans())
# Nested deeper than json's recursion limit: RecursionError, not ValueError, ended the run.
@example(lines=[b"[" * 100000], cuts=[], expect=False)
def test_any_worker_output_split_anywhere_ends_in_one_record(lines, cuts, expect):
    data = b"\n".join(lines) + b"\n"
    exchange, records = worker_over(splits(data, cuts), ["x"] if expect else None)
    assert_one_clean_record(exchange, records)


@PARSER_SETTINGS
@given(tokens=st.lists(token_texts, min_size=1, max_size=10), cuts=cut_points)
def test_a_worker_stream_split_anywhere_reads_as_a_whole(tokens, cuts):
    events = [{"event": "text_delta", "delta": t} for t in tokens]
    events += [{"event": "text", "content": "".join(tokens)}, {"event": "finish", "status": "completed"}]
    data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    exchange, records = worker_over(splits(data, cuts), ["zzz"])
    record = assert_one_clean_record(exchange, records)
    assert record["error"] is None and record["output_tokens"] == len(tokens)
    assert record["matched"] is ("zzz" in "".join(tokens).lower())


def test_an_oversized_worker_line_is_a_request_error(monkeypatch):
    monkeypatch.setattr(loadgen, "LINE_MAX", 1000)
    exchange, records = worker_over([b'{"event":"text_delta","delta":"' + b"x" * 700] * 3, None)
    record = assert_one_clean_record(exchange, records)
    assert "longer than" in (record["error"] or ""), record
    assert exchange.worker is None


# ------------------------------------------------------------------ the controller's reader


def consume(lines: list[str]) -> LoadgenPass:
    outcome = LoadgenPass()

    async def source():
        for line in lines:
            yield line

    events: list[dict] = []
    with within():
        asyncio.run(_consume(source(), outcome, events.append))
    return outcome


loadgen_lines = st.one_of(
    st.text(max_size=30),
    st.builds(lambda kind, fields: json.dumps({"event": kind, **fields}),
              st.sampled_from(["request", "progress", "finish", "worker", "connection", None, 5]),
              st.dictionaries(st.sampled_from(["status", "duration_seconds", "message", "elapsed", "index",
                                               "latency_ms", "container"]), odd_values, max_size=4)),
    st.sampled_from(["5", "[1]", "null", '"text"', "[" * 3000, '{"event":"finish","duration_seconds":"x"}']),
)


@PARSER_SETTINGS
@given(lines=st.lists(loadgen_lines, max_size=8))
# A line of JSON that is not an object: .pop raised AttributeError and the stream "broke off".
@example(lines=["5", '{"event":"finish","status":"completed","duration_seconds":1}'])
@example(lines=['{"event":"finish","status":"completed","duration_seconds":"soon"}'])
@example(lines=["[" * 100000])
def test_the_controller_reads_any_loadgen_output_without_breaking_off(lines):
    outcome = consume(lines)
    assert isinstance(outcome.status, str) and isinstance(outcome.message, str)
    assert isinstance(outcome.duration_seconds, float)


# ------------------------------------------------------------------ Ollama's own API streams (pull, ps)


class CannedServer:
    """A real HTTP server on loopback that answers every request with ``status`` and ``body``."""

    def __init__(self) -> None:
        import http.server
        import threading

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self.answer()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer()

            def answer(self) -> None:
                self.send_response(server.status)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: object) -> None:
                pass

        self.status, self.body = 200, b""
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def canned():
    server = CannedServer()
    yield server
    server.close()


pull_lines = st.one_of(
    st.builds(lambda fields: json.dumps(fields), st.dictionaries(
        st.sampled_from(["status", "error", "digest", "total", "completed"]), odd_values, max_size=3)),
    st.text(max_size=20), st.sampled_from(['{"status":"success"}', "[1]", "5", "null", "[" * 100_000, "\x00"]),
)


@settings(PARSER_SETTINGS, max_examples=50)  # a real HTTP round trip each
@given(status=st.sampled_from([200, 200, 404, 500]), lines=st.lists(pull_lines, max_size=5))
# A line that is not JSON: JSONDecodeError came out of pull() raw, not a model_pull error.
@example(status=200, lines=["pulling manifest", '{"status":"success"}'])
@example(status=200, lines=["5"])  # JSON that is not an object: `"error" in 5` raised TypeError
@example(status=200, lines=["[" * 100_000])
@example(status=200, lines=[json.dumps({"error": "line one\nline two" * 1000})])
def test_any_pull_stream_succeeds_or_is_a_one_line_model_pull_error(canned, status, lines):
    from pytest_gpubench.errors import Stage, StageError
    from pytest_gpubench.runtimes.ollama import OllamaRuntime

    canned.status, canned.body = status, "\n".join(lines).encode() + b"\n"
    runtime = OllamaRuntime(conn=None, local_port=canned.port)  # type: ignore[arg-type]
    try:
        with within():
            asyncio.run(runtime.pull("qwen2:7b", timeout=10))
    except StageError as exc:
        assert exc.stage == Stage.MODEL_PULL
        message = str(exc)
        assert "\n" not in message and len(message) <= 1200, message[:200]


@settings(PARSER_SETTINGS, max_examples=50)  # a real HTTP round trip each
@given(status=st.sampled_from([200, 500]), body=st.one_of(
    st.builds(lambda models: json.dumps({"models": models}), st.one_of(
        odd_values, st.lists(st.one_of(odd_values, st.dictionaries(st.sampled_from(["name", "model"]), odd_values)),
                             max_size=3))),
    st.binary(max_size=30), st.just(b"[" * 100_000)))
# Models that are not a list of objects: AttributeError out of loaded_models().
@example(status=200, body=b'{"models": [1]}')
@example(status=200, body=b'{"models": {"a": 1}}')
@example(status=200, body=b"[" * 100_000)
def test_any_ps_answer_gives_a_list_of_names(canned, status, body):
    from pytest_gpubench.runtimes.ollama import OllamaRuntime

    canned.status, canned.body = status, body if isinstance(body, bytes) else body.encode()
    runtime = OllamaRuntime(conn=None, local_port=canned.port)  # type: ignore[arg-type]
    with within():
        names = asyncio.run(runtime.loaded_models())
    assert isinstance(names, list) and all(isinstance(name, str) for name in names)
