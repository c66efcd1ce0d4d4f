"""The load generator that runs on the instance, next to the model.

Standard library only, Python 3.8 or newer: it is sent over SSH as the stdin of
``python3 -c BOOTSTRAP``, its config after it on the same stdin (``read_config``;
``python3 - CONFIG`` works too, for a config small enough to be an argument), and
must run on whatever Python an instance has. It must also never be the bottleneck
it measures, so it is one thread driving non-blocking
sockets through ``selectors`` with its own minimal HTTP/1.1 client (chunked,
Content-Length and close-delimited bodies, kept-alive connections). Every
timestamp is ``perf_counter()`` taken as the bytes are received, and a token
chunk costs a few substring tests, not a JSON parse: only the final chunk is
parsed, and a token's text only when its prompt carries an expectation.

Config (one JSON object, after the script on stdin or as the one argument):
``server_url`` (the server's base URL, whatever the protocol), ``protocol``
(below), ``model``, ``prompts`` (strings, or objects ``{"prompt": str, "expect":
[str, ...], "max_tokens": n, "ignore_eos": true}``: any one expected substring
matching, case-insensitive; ``max_tokens`` there overrides the run's; ``ignore_eos``
is sent on the OpenAI protocols only; ``"answer": "N"`` instead of ``expect`` scores
exactly: the reply's :func:`final_answer` must equal N, and ``matched`` is None when
the reply has no number), ``requests`` (at a fixed concurrency, the measured phase
sends at most this many requests, the prompts in order, and ends once they are
answered); ``system``: a system prompt sent before it, and
``turns``: ``[{"prompt", "max_tokens", "think_s"}, ...]``, the later turns of a
conversation, see below), ``max_tokens``, ``think`` (Ollama only: sent
as the request's ``think`` only when set: absent or null leaves the model's
default), ``extra_body`` (fields
merged into every request body last, e.g. ``ignore_eos`` or
``chat_template_kwargs`` for a server that takes them), ``api_key_env`` (the
name of an environment variable on the instance whose value is sent as
``Authorization: Bearer``; the token itself is never in the config, a file, a
log or an event; the run fails if the variable is unset), ``ca_file`` (an https://
server's certificate is verified against this CA file alone; without it, against the
system's trust store), ``duration``,
``warmup_requests`` (sent first,
one at a time, outside the run clock), ``progress_interval``, ``checkpoint_every``,
``checkpoint_path``, ``request_timeout`` (the stall timeout: a request that receives
nothing for that many seconds is aborted and recorded as an error, and the run goes
on), ``cut_at_deadline`` (default false: requests in flight at the end of the
duration finish and count; true: they are cut there, see below), and the load:

* ``concurrency`` N (default 1): N requests in flight for the duration; a request
  is due the moment a slot frees;
* ``rate`` R (requests/s, wins over ``concurrency``): Poisson arrivals drawn from
  ``random.Random(seed)``, sent on schedule whatever is in flight, up to
  ``max_in_flight`` (default 1024); arrivals still waiting at the end are
  ``unsent``;
* ``schedule`` [t_0, t_1, ...] (seconds into the run, not decreasing; wins over both):
  trace replay, measured request *i* is prompt *i*, sent at ``t_i`` whatever is in
  flight, up to ``max_in_flight``; one the cap holds back goes late (its
  ``send_lag_ms`` shows it). ``duration`` should be the last time: the run ends when
  every scheduled request was sent and has finished.

A prompt object may carry ``messages`` (a trace's conversation): the chat protocol
sends them as given; the others send ``prompt`` (the contents joined).
* conversations (prompts with ``turns``; wins over ``rate`` and ``concurrency``): N conversations in flight
  (:class:`ConversationSlots`), the prompts started in turn. Turn k is sent with the
  whole history, the model's own answers included as they streamed back (so a turn's
  text is kept, as for an expectation), ``think_s`` after the previous answer; an error
  or a cut ends a conversation, and its slot starts the next at once (:class:`Dialogue`).
  On Ollama the run speaks ``ollama-chat`` (``/api/chat``: ``/api/generate`` has no
  history).

Protocols (``protocol``, default ``ollama``):

* ``ollama``: ``POST /api/generate`` streamed as NDJSON, ``options.num_predict``
  for ``max_tokens``; the final ``"done": true`` chunk's counters fill the record.
  ``ollama-chat``: ``POST /api/chat`` with ``messages``, the text in ``message.content``.
* ``openai-chat`` / ``openai-completions``: ``POST /v1/chat/completions`` (one user
  message) or ``/v1/completions`` (``prompt``) with ``stream: true``,
  ``stream_options: {"include_usage": true}`` and ``max_tokens`` (a base URL
  ending in ``/v1`` is taken as OpenAI clients take it). Server-Sent Events: a
  ``data:`` chunk with non-empty ``delta.content`` (``text``) is an answer token,
  one with ``delta.reasoning`` or ``delta.reasoning_content`` a thinking token;
  ``data: [DONE]`` ends the request (a body that ends cleanly after the finish or
  usage chunk without it counts too). The usage chunk's ``completion_tokens`` and
  ``prompt_tokens`` go where Ollama's ``eval_count`` and ``prompt_eval_count`` go,
  ``finish_reason`` to ``done_reason``; the server's durations are unknown
  (llama.cpp's ``timings``, when sent, give ``eval_duration_ns`` and
  ``prompt_eval_duration_ns``). Errors, ``{"error": {"message": ...}}`` with an
  HTTP status, vLLM's ``{"object": "error", "message": ...}``, or an error event
  mid-stream, are request errors carrying the message.

* ``worker``: seed 004's container workers. ``worker_command`` is the argv of one
  container (``docker run --rm -i --gpus device=N -e ... IMAGE [CMD]``); ``worker_pool``
  containers (default: the concurrency) are started and must send their first event
  before the run clock starts, more start when more requests are in flight. Each
  request is one JSON line on the container's stdin (``{"prompt", "max_tokens",
  "model"}``, ``ignore_eos`` when asked, ``extra_body`` merged); the container answers
  with events on stdout, one JSON object per line: ``text_delta`` (``delta``) is a token,
  ``text`` (``content``) the whole answer for expectations, ``worker`` (``status``,
  ``message``) is passed on as a ``worker`` event with its ``container`` number the
  first time the run sees that pair, ``finish`` (``status: completed`` or ``failed`` with ``message``) ends the
  request. A session worker then reads the next line; a one-off worker exits, and
  the request sent to it meanwhile starts a new container (its wait for the first
  event is the record's ``startup_ms``, outside the TTFT). Output tokens are the
  ``text_delta`` count (workers report no counts). A line that is not a JSON object
  with an ``event``, a failed ``finish``, an exit before ``finish`` (with the stderr
  tail) and a stall are request errors; the container is then stopped. At the end
  every container's stdin closes, then SIGTERM, then SIGKILL to its process group.

Whatever a server or a container sends ends its request in one record, never the run:
a malformed answer (an HTTP head or chunk size that does not parse, JSON that does not
parse or nests past the interpreter's limit, a line longer than ``LINE_MAX``) is that
request's error (``bad response: ...``), and a server's counter of another type or size
(not a whole number from 0 to 2**63-1) is left out of the record (None), which the
controller would otherwise drop as invalid.

Events, one JSON object per line on stdout (seed 004's protocol, extended)::

    {"event": "connection", "status": "connected", "url": ...}
    {"event": "worker", "status": "warmup" | "running"}
    {"event": "request", <RequestRecord fields>}
    {"event": "progress", "requests", "tokens", "tps", "errors", "elapsed", "in_flight"}
    {"event": "backoff", "status": "started", "errors", "pause_s", "max_pause_s", "error"}
    {"event": "backoff", "status": "ended", "errors"}
    {"event": "finish", "status": "completed" | "interrupted" | "failed",
     "duration_seconds", "message", "itl_ms": {count, mean, p50, p90, p95, p99, max},
     "cpu_seconds", "cpu_seconds_per_1k_tokens", "delivered_concurrency",
     "send_lag_ms": {p50, p99, max}, "unsent", "abandoned", "incomplete", "backoffs"}

``delivered_concurrency`` is the time-weighted mean of requests in flight (sent,
final chunk not yet received) from the run's start to its deadline;
``cpu_seconds`` the generator's own CPU time over the measured run (per 1,000
output tokens of successful measured requests in ``cpu_seconds_per_1k_tokens``);
``unsent`` counts arrivals ``max_in_flight`` (or a backoff) held back past the deadline,
``abandoned`` requests still in flight when a signal ended the run.

Prefix reuse: every record says ``sent_prompt_tokens`` and ``cacheable_prompt_tokens``
(estimates by the 1.3-tokens-per-word rule of what a prefix cache could serve, from what
was sent before) and ``cached_prompt_tokens`` (the server's count), a conversation's
turn also ``conversation`` and ``turn``: see ``LoadGenerator.prefix_fields``.

Backoff: a server that fails every request at once (refused, an HTTP error before any
token) would meet a tight loop, each freed slot re-sent at once. After ``BACKOFF_AFTER``
requests in a row failed before any token, the generator pauses (``backoff_pause``:
0.05 s, doubled by each further such failure, at most 2 s) and then sends one request
at a time until one succeeds, which ends it. ``backoff`` events say when it starts and
ends, never once per error; ``backoffs`` in the finish event counts the starts.

With ``cut_at_deadline`` the run ends at its deadline, as GuideLLM's
``--max-seconds`` does: each measured request still in flight is closed there and
recorded with ``"incomplete": true`` and no error. Its TTFT, token gaps and decode
rate cover what it received (``tpot_ms`` runs to its last token, ``latency_ms`` to
the cut); ``incomplete`` in the finish event counts them. The sandbox's clock uses
this: a 6-second benchmark cannot wait 71 s for a slow model's 256-token answer.

Reasoning models: Ollama streams a thinking model's reasoning in ``thinking``
chunks with an empty ``response`` before the answer, and its ``eval_count``
counts both. A chunk with text of either kind is a generated token:
``output_tokens``, the TTFT, the ITL gaps and the decode rate cover both (an
empty chunk, such as the closing ``</think>`` tag the server swallows, is not
counted, as before: one token of slack against ``eval_count``). A record adds
``thinking_tokens`` (chunks of reasoning) and ``ttfat_ms``, the time to the first
answer token (None when the request ended before answering). Every record
is also checkpointed to a JSON file on the instance (seed 001's format, plus the
generator's ``pid``), so a
lost connection loses nothing measured: a reader that stalls or goes away never
blocks the run, which keeps going to the end. SIGTERM and SIGINT end it as
``interrupted``; requests then still in flight are abandoned, not recorded.
"""

import array
import errno
import heapq
import json
import os
import random
import re
import selectors
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
import traceback
import urllib.parse
from collections import deque

perf = time.perf_counter
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
RECV_SIZE = 65536
GAPS_SORTED_MAX = 4000000  # beyond this many gaps, ITL percentiles come from an even sample
OUTPUT_MAX = 32 * 1024 * 1024  # unread stdout beyond this: the reader is gone
LINE_MAX = 16 * 1024 * 1024  # a stream line (NDJSON, SSE, a worker's event) longer than this: a malformed answer
COUNT_MAX = 2 ** 63 - 1  # a server's counter beyond this fits no store's integer column
ERROR_MAX = 1000  # characters of a server's error message a record keeps
CONNECTING, SENDING, HEAD, BODY, CLOSED, HANDSHAKE = range(6)
THINKING, ANSWER = range(2)  # what a token chunk carries
CHUNKED, LENGTH, UNTIL_CLOSE = range(3)
BACKOFF_AFTER = 3  # consecutive requests that failed before any token: then the generator backs off
BACKOFF_FIRST = 0.05  # seconds: the first pause, doubled by each further such failure
BACKOFF_CAP = 2.0  # seconds: the longest pause


def backoff_pause(streak):
    """Seconds to wait before the next request after ``streak`` consecutive requests that failed
    before any token (0.0 below ``BACKOFF_AFTER``): exponential from ``BACKOFF_FIRST``, capped."""
    if streak < BACKOFF_AFTER:
        return 0.0
    return min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** min(streak - BACKOFF_AFTER, 64))


PROTOCOLS = ("ollama", "ollama-chat", "openai-chat", "openai-completions", "worker")
ENDPOINTS = {"ollama": "/api/generate", "ollama-chat": "/api/chat", "openai-chat": "/v1/chat/completions",
             "openai-completions": "/v1/completions"}
OLLAMA_PROTOCOLS = ("ollama", "ollama-chat")


def server_address(url, protocol="ollama"):
    """(host, port, path prefix) of the server's base URL, http:// or https://."""
    parsed = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if parsed.scheme not in ("http", "https"):
        raise ValueError("only http:// and https:// URLs are supported, not %r" % parsed.scheme)
    prefix = parsed.path.rstrip("/")
    if protocol not in OLLAMA_PROTOCOLS and prefix.endswith("/v1"):
        prefix = prefix[:-3]  # a base URL given as OpenAI clients take it, ending in /v1
    default_port = 443 if parsed.scheme == "https" else 11434 if protocol in OLLAMA_PROTOCOLS else 80
    return parsed.hostname or "127.0.0.1", parsed.port or default_port, prefix


def tls_context(url, ca_file=None):
    """The TLS context of an https:// URL (None for http://): certificates and host names
    verified, against ``ca_file`` alone when given, else the system's trust store."""
    if urllib.parse.urlsplit(url if "://" in url else "http://" + url).scheme != "https":
        return None
    return ssl.create_default_context(cafile=ca_file or None)


#: A non-blocking TLS socket's "not yet": the handshake, a read or a write waits for the socket.
TLS_WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


#: What a malformed answer raises in the parsers below: ValueError (JSON, int()), and
#: RecursionError for JSON nested deeper than the interpreter's limit (``[[[[...``).
MALFORMED = (ValueError, RecursionError)


def server_count(value):
    """A server's counter (tokens, nanoseconds) as a record keeps it: a whole number from 0 to
    COUNT_MAX, else None. A server that sends another type or size says nothing usable, and a
    record carrying it would not validate on the controller, which would drop the request."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= COUNT_MAX:
        return value
    return None


def nanoseconds(milliseconds):
    """llama.cpp's ``timings`` milliseconds as a record's nanoseconds; None for anything else."""
    if isinstance(milliseconds, (int, float)) and not isinstance(milliseconds, bool):
        try:
            return server_count(int(milliseconds * 1e6))
        except (OverflowError, ValueError):  # infinity, NaN, an integer past a float
            pass
    return None


def chunk_size(line):
    """The size of a chunk from its size line (hex digits, maybe ``;extensions``). int(x, 16)
    alone takes ``-6``, and a negative size sent the chunk parser back over the same bytes forever."""
    size = line.split(b";", 1)[0].strip()
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise ValueError("bad chunk size %r" % line[:40])
    return int(size, 16)


def error_message(payload):
    """The message of an error body: Ollama's ``{"error": "..."}``, OpenAI's
    ``{"error": {"message": ...}}`` or vLLM's ``{"object": "error", "message": ...}``."""
    error = payload.get("error", payload.get("message"))
    if isinstance(error, dict):
        error = error.get("message") or json.dumps(error, sort_keys=True)
    return clipped(str(error).strip() or "an error with no message")  # a request error always says something


def clipped(text):
    """A server's error text as a record keeps it: at most ERROR_MAX characters."""
    return text if len(text) <= ERROR_MAX else text[:ERROR_MAX - 3] + "..."


def percentile(ordered, p):
    """Linear interpolation between closest ranks, as results.percentile does."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def ms(seconds):
    return round(seconds * 1000.0, 4)


def parse_prompt(entry):
    """(text, lower-cased expectations or None, its own max_tokens or None, ignore_eos) of one
    config prompt."""
    if isinstance(entry, dict):
        expect = entry.get("expect")
        if isinstance(expect, str):
            expect = [expect]
        expect = [str(e).lower() for e in expect or []] or None
        if entry.get("answer") is not None:
            expect = Exact(entry["answer"])
        max_tokens = entry.get("max_tokens")
        return (str(entry["prompt"]), expect, None if max_tokens is None else int(max_tokens),
                entry.get("ignore_eos") is True)
    return str(entry), None, None, False


def parse_chat(entry):
    """(system prompt or None, later turns) of one config prompt: ``system`` is sent before the
    prompt on every request; ``turns`` (``[{"prompt", "max_tokens", "think_s"}, ...]``) make it a
    conversation, each turn as (text, max_tokens or None, seconds to wait after the previous answer)."""
    if not isinstance(entry, dict):
        return None, ()
    system = entry.get("system")
    turns = tuple((str(t["prompt"]), None if t.get("max_tokens") is None else int(t["max_tokens"]),
                   max(0.0, float(t.get("think_s") or 0.0))) for t in entry.get("turns") or ())
    return (None if system is None else str(system)), turns


def estimated_tokens(words):
    """Tokens of ``words`` words by the tokenizer-free rule (matrix/synthetic.py: 1.3 per word)."""
    return int(round(words * TOKENS_PER_WORD))


TOKENS_PER_WORD = 1.3


def transcript(messages):
    """A message list as one text, for the protocols that take a prompt, not messages."""
    lines = ["%s: %s" % (m["role"].capitalize(), m["content"]) for m in messages]
    return "\n\n".join(lines + ["Assistant:"]) if len(messages) > 1 else messages[0]["content"]


class Dialogue:
    """One conversation in flight (a workload prompt with ``turns``): its history, the model's own
    answers included as it streamed them, and the next turn.

    It holds a concurrency slot from its first turn to its last: each answer schedules the next
    turn ``think_s`` later; an error, a cut or the last answer ends it, and the slot starts the
    next conversation at once."""

    __slots__ = ("number", "prompt_index", "messages", "turn", "turns", "request", "history_words", "sent_words")

    def __init__(self, run, number, prompt_index):
        self.number, self.prompt_index = number, prompt_index
        text, _, max_tokens, _ = run.prompts[prompt_index]
        system, later = run.chats[prompt_index]
        self.turns = ((text, max_tokens, 0.0),) + later
        self.messages = [] if system is None else [{"role": "system", "content": system}]
        self.turn = 0
        self.history_words = self.sent_words = 0
        self.request = None

    def next_request(self, run):
        """The bytes of the next turn: the history and the new user message."""
        text, max_tokens, _ = self.turns[self.turn]
        self.turn += 1
        self.messages.append({"role": "user", "content": text})
        self.sent_words = self.history_words + len(text.split())
        ignore_eos = run.prompts[self.prompt_index][3]
        self.request = run.encoded(run.config["max_tokens"] if max_tokens is None else max_tokens, ignore_eos,
                                   self.messages)
        self.history_words = self.sent_words
        return self.request

    def answered(self, run, record, answer, now):
        """Its turn ended: the next is due after its think time, or the next conversation starts now."""
        pattern = run.pattern
        if not hasattr(pattern, "resume"):
            return
        if record["error"] is None and not record["incomplete"] and self.turn < len(self.turns):
            self.messages.append({"role": "assistant", "content": answer})
            self.history_words += len(answer.split())
            pattern.resume(self, now + self.turns[self.turn][2])
        else:
            pattern.resume(None, now)


# A reply's final answer: the number after its last "Answer:" / "answer is" / "####" marker
# (markdown bold and a dollar sign allowed between), else its last number. A number is
# whole or decimal, "1,234" with thousands commas.
_NUMBER = r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?"
_MARKED = re.compile(r"(?:\banswer\b(?:\s+is)?|####)\s*[:=]?[\s*]*\$?\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(r"(?<![0-9.,])" + _NUMBER)


def canonical_number(text):
    """``"1,234"`` -> ``"1234"``, ``"12.50"`` -> ``"12.5"``, ``"12.0"`` -> ``"12"``, ``"-0"`` -> ``"0"``."""
    text = text.replace(",", "")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    negative = text.startswith("-")
    digits = text.lstrip("-").lstrip("0")
    if not digits or digits.startswith("."):
        digits = "0" + digits
    return "-" + digits if negative and digits != "0" else digits


def final_answer(text):
    """The reply's final answer as :func:`canonical_number` writes it, or None without a number:
    the number after the last answer marker, else the last number in the reply."""
    marked = _MARKED.findall(text)
    if marked:
        return canonical_number(marked[-1])
    numbers = _ANY_NUMBER.findall(text)
    return canonical_number(numbers[-1]) if numbers else None


class Exact(object):
    """A prompt's exact answer (``"answer"``): the reply's final answer must equal it."""

    def __init__(self, answer):
        self.answer = canonical_number(str(answer).strip())

    def matches(self, text):
        """True or False; None when the reply has no number at all (unanswered)."""
        found = final_answer(text)
        return None if found is None else found == self.answer


class Output:
    """Events on stdout. On a pipe or socket, writes are non-blocking and queue in
    the event loop; a broken pipe or too much unread output stops them for good."""

    def __init__(self):
        self.pending = bytearray()
        self.alive = True
        self.nonblocking = False
        self.selector = None
        self.watching = False
        try:
            mode = os.fstat(1).st_mode
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                os.set_blocking(1, False)
                self.nonblocking = True
        except OSError:
            self.alive = False

    def emit(self, event, **fields):
        self.write(json.dumps(dict(event=event, **fields), separators=(",", ":")) + "\n")

    def write(self, text):
        if not self.alive:
            return
        self.pending += text.encode()
        if len(self.pending) > OUTPUT_MAX:
            self.lost()
        else:
            self.flush()

    def flush(self):
        while self.pending and self.alive:
            try:
                written = os.write(1, self.pending)
            except BlockingIOError:
                self.watch(True)
                return
            except OSError:
                self.lost()
                return
            del self.pending[:written]
        self.watch(False)

    def ready(self, mask):
        self.flush()

    def watch(self, on):
        if self.selector is None or on == self.watching:
            return
        if on:
            self.selector.register(1, WRITE, self)
        else:
            self.selector.unregister(1)
        self.watching = on

    def lost(self):
        self.alive = False
        self.pending = bytearray()
        self.watch(False)

    def close(self, wait=30.0):
        """Deliver what is queued (for at most ``wait`` seconds), then restore stdout."""
        deadline = perf() + wait
        while self.pending and self.alive and self.selector is not None and perf() < deadline:
            for key, mask in self.selector.select(max(0.0, deadline - perf())):
                key.data.ready(mask)  # this flushes, or drains a signal's wake-up byte
        self.watch(False)
        if self.nonblocking:
            try:
                os.set_blocking(1, True)
            except OSError:
                pass


class Checkpoint:
    """Seed 001's checkpoint file: every record so far, rewritten atomically.

    Each record is serialised once (the same text goes to stdout); rewrites are
    asked for every ``checkpoint_every`` records but spaced so that they take at
    most ~2 % of the wall time, so a long run never turns quadratic.
    """

    def __init__(self, path, model, every):
        self.path = path
        self.model = model
        self.every = max(1, int(every))
        self.records = []
        self.due = False
        self.not_before = 0.0

    def add(self, record_json):
        self.records.append(record_json)
        if len(self.records) % self.every == 0:
            self.due = True

    def wake(self):
        return self.not_before if self.due else None

    def write(self, status, summary):
        self.due = False
        if not self.path:
            return
        began = perf()
        # The pid lets a reader that lost the stream tell a run still going from a dead one.
        text = '{"status":%s,"model":%s,"pid":%d,"timestamp":%s,"results":[%s],"summary":%s}' % (
            json.dumps(status), json.dumps(self.model), os.getpid(),
            json.dumps(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            ",".join(self.records), json.dumps(summary),
        )
        try:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(self.path + ".tmp", "w") as handle:
                handle.write(text)
            os.replace(self.path + ".tmp", self.path)
        except OSError as exc:
            sys.stderr.write("loadgen: checkpoint %s not written, giving up on it: %s\n" % (self.path, exc))
            self.path = None
        self.not_before = perf() + 50 * (perf() - began)


class Exchange:
    """One streamed POST /api/generate: its socket, its parser and its clock.

    :class:`SSEExchange` speaks the OpenAI protocol over the same HTTP client."""

    __slots__ = (
        "run", "index", "warmup", "prompt_index", "expect", "scheduled", "sent", "started_at",
        "sock", "events", "reused", "retried", "out", "state", "status", "keep_alive", "mode",
        "left", "skip", "trailer", "buffer", "partial", "detail", "received", "active", "final",
        "first", "last", "tokens", "itl_sum", "itl_max", "texts", "gaps", "end", "last_io",
        "thinking", "first_answer", "dialogue",
    )

    def __init__(self, run, index, warmup, prompt_index, scheduled):
        self.run = run
        self.index = index
        self.warmup = warmup
        self.prompt_index = prompt_index
        self.expect = run.prompts[prompt_index][1]
        self.scheduled = scheduled
        self.sock = None
        self.events = 0
        self.retried = False
        self.active = True
        self.final = None
        self.first = self.last = self.end = self.first_answer = None
        self.tokens = self.thinking = 0
        self.itl_sum = self.itl_max = 0.0
        self.texts = [] if self.expect else None
        self.gaps = None if warmup else run.gaps
        self.dialogue = None

    # -- connection and request -------------------------------------------------

    def start(self, now):
        self.sent = self.last_io = now
        self.started_at = time.time()
        self.connect(self.run.idle_socket())

    def connect(self, sock):
        self.reused = sock is not None
        self.state = SENDING
        self.out = memoryview(self.run.requests[self.prompt_index] if self.dialogue is None else self.dialogue.request)
        self.status = None
        self.buffer = self.partial = self.detail = b""
        self.received = False
        if sock is None:
            try:
                sock = self.sock = socket.socket(self.run.family, socket.SOCK_STREAM)  # closed if what follows fails
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.run.tls is not None:  # the handshake follows the TCP connect (state HANDSHAKE)
                    sock = self.run.tls.wrap_socket(sock, server_hostname=self.run.host,
                                                    do_handshake_on_connect=False)
                self.sock = sock
                code = sock.connect_ex(self.run.sockaddr)
            except OSError as exc:
                return self.broken(exc)
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EINTR):
                self.state = CONNECTING
                return self.want(WRITE)
            if code:
                return self.broken(OSError(code, os.strerror(code)))
            if self.run.tls is not None:
                self.sock = sock
                return self.handshake()
        self.sock = sock
        self.send()

    def handshake(self):
        """TLS on a new connection, one step per readiness of its socket."""
        self.state = HANDSHAKE
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            return self.want(READ)
        except ssl.SSLWantWriteError:
            return self.want(WRITE)
        except OSError as exc:  # includes a certificate that fails verification
            return self.fail("TLS handshake failed: %s" % exc, perf())
        self.state = SENDING
        self.send()

    def want(self, events):
        if events == self.events:
            return
        selector = self.run.selector
        if not self.events:
            selector.register(self.sock, events, self)
        elif not events:
            selector.unregister(self.sock)
        else:
            selector.modify(self.sock, events, self)
        self.events = events

    def send(self):
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError,) + TLS_WAIT:
            sent = 0
        except OSError as exc:
            return self.broken(exc)
        self.out = self.out[sent:]
        if len(self.out):
            return self.want(WRITE)
        self.state = HEAD
        self.want(READ)

    def ready(self, mask):
        state = self.state
        if state == BODY or state == HEAD:
            self.read()
            # TLS decrypts a whole record at once: bytes already read from the socket
            # wait in the TLS object, and the selector would not say so.
            while self.state in (HEAD, BODY) and self.run.tls is not None and self.sock.pending():
                self.read()
        elif state == SENDING:
            self.send()
        elif state == CONNECTING:
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                return self.broken(OSError(code, os.strerror(code)))
            if self.run.tls is not None:
                return self.handshake()
            self.state = SENDING
            self.send()
        elif state == HANDSHAKE:
            self.handshake()

    # -- response ---------------------------------------------------------------

    def read(self):
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError,) + TLS_WAIT:
            return
        except OSError as exc:
            return self.broken(exc)
        now = perf()  # the moment these bytes reached us
        self.last_io = now
        try:
            if not data:
                return self.eof(now)  # a body that ends at the close is parsed here too
            self.received = True
            if self.state != BODY:
                self.head(data, now)
            elif self.mode != CHUNKED:
                self.body(data, now)
            elif (self.active and self.status == 200
                  and not (self.buffer or self.left or self.skip or self.trailer or self.partial)):
                # At low concurrency every read is one whole chunk holding one whole line (an NDJSON
                # line, an SSE event) and every token is a wake-up: each step here is paid per token,
                # from a cold cache, so such a read is framed here and goes straight to the line. Its
                # size line must give exactly the bytes that came; anything else takes dechunk's path.
                start = data.find(b"\r\n", 0, 10) + 2
                try:
                    size = int(data[:start - 2], 16) if start > 2 else 0
                except ValueError:
                    size = 0
                stop = start + size - 1  # the line's newline
                if size > 0 and len(data) == stop + 3 and data[stop] == 10:
                    if stop > start and data[stop - 1] == 10:
                        stop -= 1  # an SSE event ends with a blank line
                    if data.find(b"\n", start, stop) < 0:
                        return self.line(data[start:stop], now)
                self.dechunk(data, now)
            else:
                self.dechunk(data, now)
        except MALFORMED as exc:  # a malformed response: this request's error, not the run's end
            self.fail("bad response: %s" % (exc if isinstance(exc, ValueError) else "JSON nested too deep"), now)

    def head(self, data, now):
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > 65536:
                    raise ValueError("response head longer than 64 KiB")
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            rest, self.buffer = self.buffer[end + 4:], b""
            version, _, status = lines[0].partition(" ")
            if not version.startswith("HTTP/"):
                raise ValueError("not an HTTP response: %r" % lines[0][:80])
            status = int((status.split(None, 1) or ["(none)"])[0])
            if status >= 200:
                break
            self.buffer = rest  # interim (100 Continue): the real head follows (a loop: there may be thousands)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get("connection", "")
        self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        self.status = status
        self.state = BODY
        if "chunked" in headers.get("transfer-encoding", ""):
            self.mode, self.left, self.skip, self.trailer = CHUNKED, 0, 0, False
        elif "content-length" in headers:
            self.mode, self.left = LENGTH, int(headers["content-length"])
            if self.left < 0:
                raise ValueError("negative Content-Length %d" % self.left)
            if not self.left:
                return self.message_end(now)
        else:
            self.mode, self.keep_alive = UNTIL_CLOSE, False
        if rest:
            self.body(rest, now)

    def body(self, data, now):
        mode = self.mode
        if mode == CHUNKED:
            self.dechunk(data, now)
        elif mode == LENGTH:
            if len(data) < self.left:
                self.left -= len(data)
                self.content(data, now)
            else:
                self.content(data[:self.left], now)
                self.left = 0
                self.message_end(now)
        else:
            self.content(data, now)

    def dechunk(self, data, now):
        """The chunked body, whatever its reads hold (a read of one whole line is taken in :meth:`read`)."""
        if self.buffer:
            data, self.buffer = self.buffer + data, b""
        pos, size = 0, len(data)
        while pos < size and self.state == BODY:
            if self.left:  # inside a chunk's data
                end = pos + self.left
                if end > size:
                    self.left = end - size
                    return self.content(data[pos:], now)
                self.left, self.skip = 0, 2
                self.content(data[pos:end], now)
                pos = end
            elif self.skip:  # the CRLF after a chunk's data
                taken = min(self.skip, size - pos)
                self.skip -= taken
                pos += taken
            else:
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    self.buffer = data[pos:]
                    if len(self.buffer) > 4096:
                        raise ValueError("chunk header longer than 4 KiB")
                    return
                line, pos = data[pos:line_end], line_end + 2
                if self.trailer:
                    if not line:
                        return self.message_end(now)
                elif line:
                    self.left = chunk_size(line)
                    self.trailer = not self.left

    def content(self, data, now):
        if self.status != 200:
            if len(self.detail) < 4096:
                self.detail += data
            return
        if not self.active:
            return  # the final chunk is in: the rest only drains the connection
        if self.partial:
            data, self.partial = self.partial + data, b""
        start = 0
        while self.active:
            newline = data.find(b"\n", start)
            if newline < 0:
                self.partial = data[start:]
                if len(self.partial) > LINE_MAX:
                    raise ValueError("a stream line longer than %d bytes" % LINE_MAX)
                return
            self.line(data[start:newline], now)
            start = newline + 1

    def line(self, line, now):
        # Ollama (Go's encoder) writes compact JSON, and a quote inside a string is
        # escaped, so these substrings can only be the keys themselves.
        if b'"done":false' in line and b'"response":"' in line:
            if b'"response":""' not in line:
                self.token(now, ANSWER, line)
            elif b'"thinking":"' in line and b'"thinking":""' not in line:
                self.token(now, THINKING)
            return
        if b'"done":true' not in line and not line.strip():
            return
        chunk = json.loads(line)
        if not isinstance(chunk, dict):
            raise ValueError("a stream line is not a JSON object")
        if "error" in chunk:
            return self.fail(error_message(chunk), now)
        text, thinking = chunk.get("response"), chunk.get("thinking")
        if text:
            self.token(now, ANSWER, text)
        elif thinking:
            self.token(now, THINKING)
        if chunk.get("done"):
            self.final = chunk
            self.complete(now)

    def ended(self):
        """Whether a body that ends here, without the protocol's own last word, is whole."""
        return False

    def complete(self, now):
        """The final chunk is in: record the request."""
        self.active = False
        self.end = now
        self.run.finished(self, self.record(None), now)

    def answer_text(self, chunk):
        """The answer text of a parsed token chunk ("" when it has none as text)."""
        text = chunk.get("response") if isinstance(chunk, dict) else None
        return text if isinstance(text, str) else ""

    def kept_text(self, piece):
        """The text of a token kept for the expectation check: a token line is kept unparsed,
        and one the server wrote wrong (not JSON, not an object) has none."""
        if not isinstance(piece, bytes):
            return piece if isinstance(piece, str) else ""
        try:
            return self.answer_text(json.loads(piece))
        except MALFORMED:
            return ""

    def token(self, now, kind, text=None):
        """A token arrived at ``now``; an answer's ``text`` (or the raw line it came in, parsed only if
        needed) is kept for the request's expectation check, when it has one."""
        if kind == ANSWER:
            if self.first_answer is None:
                self.first_answer = now
            if self.texts is not None and text is not None:
                self.texts.append(text)
        elif kind == THINKING:
            self.thinking += 1
        if self.tokens:
            gap = now - self.last
            self.itl_sum += gap
            if gap > self.itl_max:
                self.itl_max = gap
            if self.gaps is not None:
                self.gaps.append(gap)
        else:
            self.first = now
        self.last = now
        self.tokens += 1

    def message_end(self, now):
        if self.state == CLOSED:
            return  # an error in the body closed it already
        if self.partial and self.active and self.status == 200:
            line, self.partial = self.partial, b""
            self.line(line, now)
        if self.active:
            if self.status != 200:
                return self.fail(http_error(self.status, self.detail), now)
            if self.ended():
                return self.complete(now)
            return self.fail("stream ended before the final chunk", now)
        if self.keep_alive:
            self.want(0)
            self.run.idle.append(self.sock)
            self.sock = None
        self.close()

    def eof(self, now):
        if self.state == BODY and self.mode == UNTIL_CLOSE:
            return self.message_end(now)
        if self.active and self.reused and not self.received and not self.retried:
            return self.retry()
        self.fail("connection closed before the final chunk", now)

    def broken(self, exc):
        if self.active and self.reused and not self.received and not self.retried:
            return self.retry()
        self.fail("%s: %s" % (type(exc).__name__, exc.strerror or exc), perf())

    def retry(self):
        """A kept-alive connection the server had closed: once more on a new one."""
        self.close(keep_open=True)
        self.retried = True
        self.connect(None)

    def cut(self, now):
        """The run's time is up: record what this request received, then close it."""
        self.active = False
        self.end = now
        self.run.finished(self, self.record(None, incomplete=True), now)
        self.close()

    def fail(self, message, now):
        if self.active:
            self.active = False
            self.end = now
            self.run.finished(self, self.record(message), now)
        self.close()

    def close(self, keep_open=False):
        if self.sock is not None:
            self.want(0)
            self.sock.close()
            self.sock = None
        if not keep_open:
            self.state = CLOSED
            self.run.open.discard(self)

    # -- the record -------------------------------------------------------------

    def record(self, error, incomplete=False):
        sent, count, final = self.sent, self.tokens, self.final or {}
        # A cut request's decode ends at its last token, a finished one's at the final chunk.
        decode_end = self.last if incomplete else self.end
        decode = self.last - self.first if count >= 2 else 0.0
        # The server's own figures, kept only as the types a record holds: it must never raise here.
        eval_count, eval_ns = server_count(final.get("eval_count")), server_count(final.get("eval_duration"))
        done_reason = final.get("done_reason")
        server_rate = None
        if eval_count is not None and eval_ns:
            server_rate = round(eval_count / (eval_ns / 1e9), 4)
        matched = None
        if self.expect and error is None and not incomplete:
            text = "".join(self.kept_text(t) for t in self.texts).lower()
            if isinstance(self.expect, Exact):
                matched = self.expect.matches(text)
            else:
                matched = any(e in text for e in self.expect)
        return {
            "index": self.index,
            "warmup": self.warmup,
            "prompt_index": self.prompt_index,
            "started_at": self.started_at,
            "scheduled_at": None if self.warmup else round(self.scheduled - self.run.start, 6),
            "send_lag_ms": None if self.warmup else ms(sent - self.scheduled),
            "ttft_ms": ms(self.first - sent) if self.first is not None else None,
            "ttfat_ms": ms(self.first_answer - sent) if self.first_answer is not None else None,
            "latency_ms": ms(self.end - sent),
            "output_tokens": count,
            "thinking_tokens": self.thinking,
            "eval_count": eval_count,
            "eval_duration_ns": eval_ns,
            "prompt_tokens": server_count(final.get("prompt_eval_count")),
            "prompt_eval_duration_ns": server_count(final.get("prompt_eval_duration")),
            "load_duration_ns": server_count(final.get("load_duration")),
            "total_duration_ns": server_count(final.get("total_duration")),
            "done_reason": done_reason[:200] if isinstance(done_reason, str) else None,
            "tokens_per_second": round((count - 1) / decode, 4) if decode > 0 else None,
            "tpot_ms": ms((decode_end - self.first) / (count - 1)) if count >= 2 else None,
            "itl_mean_ms": ms(self.itl_sum / (count - 1)) if count >= 2 else None,
            "itl_max_ms": ms(self.itl_max) if count >= 2 else None,
            "server_tokens_per_second": server_rate,
            "matched": matched,
            "error": error,
            "incomplete": incomplete,
        }


def http_error(status, detail):
    text = detail.decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except MALFORMED:
        payload = None
    if isinstance(payload, dict) and ("error" in payload or "message" in payload):
        text = error_message(payload)
    return "HTTP %d: %s" % (status, clipped(text))


class SSEExchange(Exchange):
    """One streamed OpenAI-compatible completion: Server-Sent Events, ``data: {chunk}``
    per event, ``data: [DONE]`` last, the server's counts in the ``usage`` chunk.

    Each ``data:`` line is taken as a whole event (every OpenAI-compatible server
    writes its JSON on one line); blank lines, comments (``: ping``) and ``event:``,
    ``id:``, ``retry:`` fields carry no token. As for Ollama, a token chunk costs a
    few substring tests on the compact JSON servers write; a chunk that may end
    the answer or carry ``usage`` or an error is parsed.
    """

    __slots__ = ("finish_reason", "usage", "timings")

    def __init__(self, run, index, warmup, prompt_index, scheduled):
        Exchange.__init__(self, run, index, warmup, prompt_index, scheduled)
        self.finish_reason = self.usage = self.timings = None

    def line(self, line, now):
        if not line.startswith(b"data:"):
            if line[:1] == b"{":  # a server that ignored "stream": one JSON answer
                return self.parsed(line, now, whole=True)
            return  # a blank line between events, a comment or another field
        # Tested on the whole line, not a copy without "data:", which holds none of these keys: at low
        # concurrency this runs once per wake-up, and each step here costs more than its size says.
        if b'"finish_reason":null' in line and b'"usage":{' not in line:
            # A token chunk (compact JSON; a quote inside a string is escaped).
            if self.run.chat:
                if b'"content":"' in line and b'"content":""' not in line:
                    self.token(now, ANSWER, line)
                elif ((b'"reasoning":"' in line and b'"reasoning":""' not in line)
                      or (b'"reasoning_content":"' in line and b'"reasoning_content":""' not in line)):
                    self.token(now, THINKING)
            elif b'"text":"' in line and b'"text":""' not in line:
                self.token(now, ANSWER, line)
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return self.complete(now)
        if payload:
            self.parsed(payload, now)

    def kept_text(self, piece):
        if isinstance(piece, bytes) and piece.startswith(b"data:"):
            piece = piece[5:]  # a token's event, kept whole
        return Exchange.kept_text(self, piece)

    def parsed(self, payload, now, whole=False):
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise ValueError("an event is not a JSON object")
        if "error" in chunk or chunk.get("object") == "error":
            return self.fail(error_message(chunk), now)
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        text = self.answer_text(chunk)
        if text:
            self.token(now, ANSWER, text)
        elif self.reasoning_text(choice.get("message" if whole else "delta")):
            self.token(now, THINKING)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):  # llama.cpp's server: its own clock
            self.timings = chunk["timings"]
        if whole:
            self.complete(now)

    def answer_text(self, chunk):
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if not self.run.chat:
            text = choice.get("text")
        else:
            message = choice.get("delta") or choice.get("message")
            text = message.get("content") if isinstance(message, dict) else None
        return text if isinstance(text, str) else ""

    @staticmethod
    def reasoning_text(message):
        """Reasoning in a delta: ``reasoning`` (vLLM, Ollama) or ``reasoning_content`` (older vLLM, SGLang)."""
        if not isinstance(message, dict):
            return ""
        return message.get("reasoning") or message.get("reasoning_content") or ""

    def ended(self):
        # A body that ends cleanly after the finish or usage chunk but without [DONE].
        return self.finish_reason is not None or self.usage is not None

    def complete(self, now):
        """Put the server's counts where the Ollama path puts ``eval_count`` and the like."""
        usage, timings = self.usage or {}, self.timings or {}
        final = {"eval_count": usage.get("completion_tokens"), "prompt_eval_count": usage.get("prompt_tokens"),
                 "done_reason": self.finish_reason}
        details = usage.get("prompt_tokens_details")  # vLLM, SGLang: the prompt tokens its prefix cache served
        if isinstance(details, dict):
            final["cached_tokens"] = details.get("cached_tokens")
        final["eval_duration"] = nanoseconds(timings.get("predicted_ms"))
        final["prompt_eval_duration"] = nanoseconds(timings.get("prompt_ms"))
        self.final = final
        Exchange.complete(self, now)


class OllamaChatExchange(Exchange):
    """One streamed ``POST /api/chat`` (Ollama with a message list: conversations): NDJSON as
    ``/api/generate`` but the text in ``message.content`` (reasoning in ``message.thinking``)."""

    __slots__ = ()

    def line(self, line, now):
        if b'"done":false' in line and b'"message":{' in line:
            if b'"content":"' in line and b'"content":""' not in line:
                self.token(now, ANSWER, line)
            elif b'"thinking":"' in line and b'"thinking":""' not in line:
                self.token(now, THINKING)
            return
        if b'"done":true' not in line and not line.strip():
            return
        chunk = json.loads(line)
        if not isinstance(chunk, dict):
            raise ValueError("a stream line is not a JSON object")
        if "error" in chunk:
            return self.fail(error_message(chunk), now)
        message = chunk.get("message") if isinstance(chunk.get("message"), dict) else {}
        text = self.answer_text(chunk)
        if text:
            self.token(now, ANSWER, text)
        elif message.get("thinking"):
            self.token(now, THINKING)
        if chunk.get("done"):
            self.final = chunk
            self.complete(now)

    def answer_text(self, chunk):
        message = chunk.get("message") if isinstance(chunk, dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        return text if isinstance(text, str) else ""


# -- container workers (seed 004) --------------------------------------------------


WORKER_TAIL = 1500  # bytes of a worker's stderr kept for its error message
WORKER_GRACE = 3.0  # seconds a stopped worker gets after its stdin closes, then SIGTERM, then SIGKILL


def parse_worker_line(line):
    """One line of a worker's stdout as its event dict; ValueError names what is wrong.

    Seed 004: every line is one JSON object with a string ``event``."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    try:
        event = json.loads(text)
    except MALFORMED:
        raise ValueError("not JSON: %r" % text[:200])
    if not isinstance(event, dict):
        raise ValueError("not a JSON object: %r" % text[:200])
    if not isinstance(event.get("event"), str):
        raise ValueError("no \"event\" name: %r" % text[:200])
    return event


def worker_request(config, text, max_tokens, ignore_eos=False):
    """The request line a worker reads on stdin: ``{"prompt", "max_tokens", "model"}``, ``extra_body`` last."""
    request = {"prompt": text, "max_tokens": max_tokens, "model": config["model"]}
    if ignore_eos:
        request["ignore_eos"] = True
    request.update(config.get("extra_body") or {})
    return (json.dumps(request, separators=(",", ":")) + "\n").encode()


class WorkerProcess:
    """One worker container (``worker_command``, e.g. ``docker run --rm -i ... IMAGE``) and its pipes.

    It reads request lines on stdin and writes seed-004 events on stdout; it is *up*
    from its first event on. A session worker then takes request after request; a
    one-off worker exits after its ``finish``, and the next request starts another
    (the time to its first event is the record's ``startup_ms``, outside the TTFT).
    """

    def __init__(self, run, number):
        self.run = run
        self.number = number
        self.started = perf()
        self.up = False
        self.exchange = None
        self.pending = b""  # request bytes not yet written to stdin
        self.stdout = bytearray()
        self.stderr = b""
        self.code = None
        # Its own process group: stopping it reaches the container's client and what it started.
        self.proc = subprocess.Popen(run.config["worker_command"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        self.out = WorkerPipe(self, "out")
        self.err = WorkerPipe(self, "err")
        run.selector.register(self.proc.stdout, READ, self.out)
        run.selector.register(self.proc.stderr, READ, self.err)
        self.writing = False

    @property
    def alive(self):
        return self.code is None and self.proc.poll() is None

    def send(self, data):
        self.pending += data
        self.flush()

    def flush(self):
        try:
            written = os.write(self.proc.stdin.fileno(), self.pending) if self.pending else 0
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self.pending = b""
            if self.exchange is not None:
                self.exchange.fail("worker's stdin closed: %s" % (exc.strerror or exc), perf())
            return
        self.pending = self.pending[written:]
        want = bool(self.pending)
        if want != self.writing:
            if want:
                self.run.selector.register(self.proc.stdin, WRITE, WorkerPipe(self, "in"))
            else:
                self.run.selector.unregister(self.proc.stdin)
            self.writing = want

    def received(self, data, now):
        self.stdout += data
        while True:
            newline = self.stdout.find(b"\n")
            if newline < 0:
                break
            line = bytes(self.stdout[:newline]).strip()
            del self.stdout[:newline + 1]
            if line:
                self.line(line, now)
            if self.code is not None:
                return
        if len(self.stdout) > LINE_MAX:  # no end of line in sight: the worker's output is broken
            del self.stdout[:]
            self.malformed("a line longer than %d bytes" % LINE_MAX, now)

    def malformed(self, problem, now):
        """Its output is not seed 004's: the request fails (which stops the worker), or the run says why."""
        message = "malformed worker output: %s" % problem
        if self.exchange is not None:
            self.exchange.fail(message, now)  # this stops the worker too
        else:
            self.run.worker_problem = message
            self.stop()

    def line(self, line, now):
        exchange = self.exchange
        if exchange is not None:
            exchange.last_io = now
            exchange.received = True
        try:
            event = parse_worker_line(line)
        except ValueError as exc:
            return self.malformed(exc, now)
        kind = event["event"]
        if not self.up:
            self.up = True
            if exchange is not None:
                exchange.startup = now - self.started
                exchange.write(now)
        if kind == "text_delta" and exchange is not None:
            if exchange.sent is not None:
                exchange.token(now, ANSWER, str(event.get("delta") or ""))
        elif kind == "text" and exchange is not None and exchange.texts is not None:
            exchange.whole = str(event.get("content") or "")
        elif kind == "finish" and exchange is not None and exchange.sent is not None:
            self.exchange = None
            if event.get("status", "completed") == "completed":
                exchange.complete(now)
            else:
                exchange.fail("worker finished with status %s: %s" % (
                    event.get("status"), event.get("message") or event.get("error") or "no message"), now)
            if self.alive and self.exchange is None and self.code is None:
                self.run.idle_workers.append(self)
        elif kind == "worker":
            shown = (str(event.get("status")), str(event.get("message") or ""))
            if shown not in self.run.worker_statuses:  # each once a run: one-off workers repeat them all
                self.run.worker_statuses.add(shown)
                self.run.output.emit("worker", container=self.number, status=shown[0], message=shown[1])

    def eof(self, now):
        """Its stdout closed: it exited (or is about to)."""
        try:
            self.code = self.proc.wait(timeout=5)
        except Exception:
            self.stop()
            self.code = -1
        self.drain_stderr()
        self.close_pipes()
        exchange, self.exchange = self.exchange, None
        if self in self.run.idle_workers:
            self.run.idle_workers.remove(self)
        if exchange is None or not exchange.active:
            return
        if self.code == 0 and exchange.sent is not None and not exchange.received and not exchange.retried:
            return exchange.restart(now)  # a one-off worker that ended after its last finish
        tail = self.stderr.decode("utf-8", "replace").strip()[-300:]
        if not self.up:
            what = "worker exited with status %d before its first event" % self.code
        elif self.code:
            what = "worker exited with status %d before its finish event" % self.code
        else:
            what = "worker exited before its finish event"
        exchange.fail(what + ("; its stderr ends: %s" % tail if tail else ""), now)

    def drain_stderr(self):
        """Read what its stderr still holds: stdout's end can be seen before the last
        words it wrote to stderr (its error message), which the selector has not read yet."""
        while True:
            try:
                data = os.read(self.proc.stderr.fileno(), RECV_SIZE)
            except (BlockingIOError, OSError, ValueError):
                return  # nothing more now (a process it started may hold the pipe open)
            if not data:
                return
            self.stderr = (self.stderr + data)[-WORKER_TAIL:]

    def close_pipes(self):
        for pipe in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            try:
                self.run.selector.unregister(pipe)
            except (KeyError, ValueError):
                pass
        self.writing = False
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self):
        """End it now (a request failed mid-stream, or the run is over): stdin closed, SIGTERM."""
        if self in self.run.idle_workers:
            self.run.idle_workers.remove(self)
        self.close_pipes()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
        if self.code is None:
            self.code = -signal.SIGTERM


class WorkerPipe:
    """A worker's stdin, stdout or stderr in the selector."""

    __slots__ = ("worker", "which")

    def __init__(self, worker, which):
        self.worker, self.which = worker, which

    def ready(self, mask):
        worker = self.worker
        if self.which == "in":
            return worker.flush()
        pipe = worker.proc.stdout if self.which == "out" else worker.proc.stderr
        try:
            data = os.read(pipe.fileno(), RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        now = perf()
        if self.which == "err":
            if data:
                worker.stderr = (worker.stderr + data)[-WORKER_TAIL:]
            else:
                try:
                    worker.run.selector.unregister(pipe)
                except (KeyError, ValueError):
                    pass
            return
        if data:
            worker.received(data, now)
        else:
            worker.eof(now)


class WorkerExchange(Exchange):
    """One request to a container worker: a JSON line on its stdin, seed-004 events back.

    TTFT runs from writing the request to the first ``text_delta``, the decode rate
    from ``text_delta`` timing, and ``output_tokens`` counts ``text_delta`` events
    (workers report no token counts). A request waits for a new container's first
    event before it is written; that wait is its ``startup_ms``.
    """

    __slots__ = ("worker", "startup", "whole")

    def __init__(self, run, index, warmup, prompt_index, scheduled):
        Exchange.__init__(self, run, index, warmup, prompt_index, scheduled)
        self.worker = None
        self.startup = None
        self.whole = None
        self.sent = None
        self.received = False

    def start(self, now):
        self.last_io = now
        self.started_at = time.time()
        self.assign(self.run.worker_for_request(), now)

    def assign(self, worker, now):
        self.worker = worker
        worker.exchange = self
        if worker.up:
            self.write(now)

    def write(self, now):
        self.sent = self.last_io = now
        self.worker.send(self.run.requests[self.prompt_index] if self.dialogue is None else self.dialogue.request)

    def restart(self, now):
        """The worker had exited after its last request: once more on a new container."""
        self.retried = True
        self.sent = None
        self.assign(self.run.start_worker(), now)

    def answer_text(self, chunk):
        return chunk

    def fail(self, message, now):
        if self.active and self.sent is None:
            self.sent = now  # it never reached the worker: its latency is the wait
        Exchange.fail(self, message, now)

    def cut(self, now):
        if self.sent is None:
            self.sent = now
        Exchange.cut(self, now)

    def close(self, keep_open=False):
        worker, self.worker = self.worker, None
        if worker is not None and worker.exchange is self:
            worker.exchange = None
            worker.stop()  # mid-request: its state is unknown, so it goes
        self.state = CLOSED
        self.run.open.discard(self)

    def complete(self, now):
        if self.whole is not None and self.texts is not None:
            self.texts = [self.whole]
        self.final = {}
        self.worker = None
        Exchange.complete(self, now)
        self.close()

    def record(self, error, incomplete=False):
        record = Exchange.record(self, error, incomplete)
        record["startup_ms"] = ms(self.startup) if self.startup is not None else None
        return record


class WorkerPool:
    """The load generator's containers: idle ones are reused, new ones started on demand."""

    def prepare_workers(self):
        """Start ``worker_pool`` containers (default: the concurrency) and wait for each one's
        first event, outside the run clock; one that exits first ends the run with why."""
        self.workers, self.idle_workers, self.worker_problem = [], [], None
        self.worker_statuses = set()  # the containers' (status, message) pairs passed on so far
        self.requests = [worker_request(self.config, text, self.config["max_tokens"] if mt is None else mt, eos)
                         for text, _, mt, eos in self.prompts]
        count = int(self.config.get("worker_pool") or self.config.get("concurrency") or 1)
        starting = [self.start_worker() for _ in range(max(1, count))]
        deadline = perf() + self.timeout
        while any(not w.up and w.alive for w in starting) and perf() < deadline and not self.stopping:
            for key, mask in self.selector.select(max(0.0, min(1.0, deadline - perf()))):
                key.data.ready(mask)
        for worker in starting:
            if not worker.up:
                tail = worker.stderr.decode("utf-8", "replace").strip()[-300:]
                reason = ("exited with status %s" % worker.proc.poll() if worker.proc.poll() is not None
                          else "sent no event within %g s" % self.timeout)
                if self.worker_problem:
                    reason = self.worker_problem
                raise RuntimeError("the worker did not start: %s%s" % (reason, "; its stderr ends: %s" % tail
                                                                      if tail else ""))
            self.idle_workers.append(worker)

    def start_worker(self):
        worker = WorkerProcess(self, len(self.workers))
        self.workers.append(worker)
        return worker

    def worker_for_request(self):
        while self.idle_workers:
            worker = self.idle_workers.pop()
            if worker.alive:
                return worker
        return self.start_worker()

    def stop_workers(self, grace=WORKER_GRACE):
        """Close every worker's stdin (a session worker ends there), then SIGTERM, then SIGKILL."""
        for worker in getattr(self, "workers", ()):
            worker.close_pipes()
        deadline = perf() + grace
        for worker in getattr(self, "workers", ()):
            while worker.proc.poll() is None and perf() < deadline:
                time.sleep(0.02)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if worker.proc.poll() is not None:
                    break
                try:
                    os.killpg(worker.proc.pid, sig)
                    worker.proc.wait(timeout=grace)
                except Exception:
                    pass
            try:
                os.killpg(worker.proc.pid, signal.SIGKILL)  # anything the worker left in its group
            except OSError:
                pass


# -- load patterns ----------------------------------------------------------------


class Warmup:
    """``count`` requests, one after another."""

    def __init__(self, count):
        self.left = count

    def launch(self, run, now):
        if self.left and not run.in_flight and not run.held(now):
            self.left -= 1
            run.launch(True, now)

    def exhausted(self, now):
        return not self.left

    def wake(self, run):
        return 0.0 if self.left and not run.in_flight else None

    def freed(self, now):
        pass


class FixedConcurrency:
    """N requests in flight until the deadline (or until ``limit`` requests were sent);
    each is due when a slot frees."""

    def __init__(self, concurrency, start, deadline, limit=None):
        self.due = deque([start] * concurrency)
        self.deadline = deadline
        self.left = limit

    def launch(self, run, now):
        if now < self.deadline:
            # Only the slots free now: one that fails at once is refilled next turn.
            for _ in range(len(self.due)):
                if run.held(now) or self.left == 0:
                    return  # backing off: the slot waits, and its send lag shows it
                if self.left is not None:
                    self.left -= 1
                run.launch(False, self.due.popleft())

    def exhausted(self, now):
        return now >= self.deadline or self.left == 0

    def wake(self, run):
        if perf() >= self.deadline or self.left == 0:
            return None
        return 0.0 if self.due else self.deadline

    def freed(self, now):
        self.due.append(now)

    def unsent(self):
        return 0


class ConversationSlots:
    """N conversations in flight until the deadline (a closed loop of conversations): each slot
    runs one conversation turn by turn, its next turn due ``think_s`` after the answer, and starts
    the next conversation (the prompts in turn) when one ends. No turn is sent after the deadline."""

    def __init__(self, concurrency, start, deadline):
        self.due = [(start, n, None) for n in range(concurrency)]  # (due time, tie-break, dialogue or None)
        self.order = concurrency
        self.deadline = deadline

    def launch(self, run, now):
        while self.due and self.due[0][0] <= now < self.deadline and not run.held(now):
            due, _, dialogue = heapq.heappop(self.due)
            if dialogue is None:
                dialogue = Dialogue(run, run.conversations, run.conversations % len(run.prompts))
                run.conversations += 1
            run.launch(False, due, dialogue=dialogue)

    def resume(self, dialogue, due):
        """``dialogue``'s next turn (None: a new conversation) is due at ``due``."""
        self.order += 1
        heapq.heappush(self.due, (due, self.order, dialogue))

    def exhausted(self, now):
        return now >= self.deadline

    def wake(self, run):
        if perf() >= self.deadline:
            return None
        return min(self.due[0][0], self.deadline) if self.due else self.deadline

    def freed(self, now):
        pass  # the conversation, told by the run, schedules what its slot does next

    def unsent(self):
        return 0


class PoissonArrivals:
    """Arrivals at ``rate`` per second with exponential gaps, sent on schedule up to
    ``cap`` in flight; a late one keeps its schedule, so its lag shows."""

    def __init__(self, rate, seed, cap, start, deadline):
        self.rng = random.Random(seed)
        self.rate, self.cap, self.deadline = rate, cap, deadline
        self.next = start + self.rng.expovariate(rate)

    def launch(self, run, now):
        if now >= self.deadline:
            return  # arrivals the cap held back stay unsent
        while self.next <= now and self.next < self.deadline and run.in_flight < self.cap and not run.held(now):
            run.launch(False, self.next)
            self.next += self.rng.expovariate(self.rate)

    def exhausted(self, now):
        return self.next >= self.deadline or now >= self.deadline

    def wake(self, run):
        if self.exhausted(perf()):
            return None
        # At the cap only a completion can help, and that wakes the loop anyway.
        return self.deadline if run.in_flight >= self.cap else min(self.next, self.deadline)

    def freed(self, now):
        pass

    def unsent(self):
        """Arrivals due before the deadline that were never sent (the cap held them)."""
        count = 0
        while self.next < self.deadline:
            count += 1
            self.next += self.rng.expovariate(self.rate)
        return count


class TraceSchedule:
    """Trace replay: request ``i`` (prompt ``i``) sent at ``start + offsets[i]``, open loop, up to
    ``cap`` in flight; a late one keeps its time, so its lag shows. Every request is sent: the
    schedule is the workload, so the cap delays requests rather than dropping them."""

    def __init__(self, offsets, cap, start):
        self.times = [start + float(t) for t in offsets]
        self.cap = cap
        self.sent = 0

    def launch(self, run, now):
        times = self.times
        while self.sent < len(times) and times[self.sent] <= now and run.in_flight < self.cap and not run.held(now):
            run.launch(False, times[self.sent], self.sent)
            self.sent += 1

    def exhausted(self, now):
        return self.sent >= len(self.times)

    def wake(self, run):
        if self.sent >= len(self.times) or run.in_flight >= self.cap:
            return None  # at the cap only a completion can help, and that wakes the loop anyway
        return self.times[self.sent]

    def freed(self, now):
        pass

    def unsent(self):
        """Scheduled requests never sent (a signal ended the run first)."""
        return len(self.times) - self.sent


class Wakeup:
    """Makes a signal interrupt the selector's wait at once."""

    def __init__(self, selector):
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.writer.setblocking(False)
        signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        selector.register(self.reader, READ, self)

    def ready(self, mask):
        try:
            self.reader.recv(4096)
        except OSError:
            pass


# -- the run ----------------------------------------------------------------------


class LoadGenerator(WorkerPool):
    """One pass of the load generator: its connections, its load pattern and its clock."""

    def __init__(self, config, output):
        self.config = config
        self.output = output
        self.prompts = [parse_prompt(p) for p in config["prompts"]]
        self.chats = [parse_chat(p) for p in config["prompts"]]
        self.conversing = any(turns for _, turns in self.chats)
        self.protocol = config.get("protocol") or "ollama"
        if self.conversing and self.protocol == "ollama":
            self.protocol = "ollama-chat"  # /api/generate takes no history: conversations go to /api/chat
        self.host, self.tls = "", None  # the server's host name and TLS context (https://), set by prepare
        self.chat = self.protocol == "openai-chat"
        self.exchange = {"ollama": Exchange, "ollama-chat": OllamaChatExchange,
                         "worker": WorkerExchange}.get(self.protocol, SSEExchange)
        # What a prefix cache could serve (see prefix_fields): prefixes already sent, by key.
        self.sent_prefixes = set()
        self.conversations = 0  # conversations started
        self.timeout = float(config.get("request_timeout", 120))
        # How often in-flight requests are checked for a stall: often enough that
        # one is noticed within a quarter of the timeout beyond it, at most each second.
        self.scan_every = min(1.0, max(0.05, self.timeout / 4))
        self.checkpoint = Checkpoint(config.get("checkpoint_path"), config["model"],
                                     config.get("checkpoint_every", 10))
        self.selector = selectors.DefaultSelector()
        output.selector = self.selector
        self.idle = []  # kept-alive sockets, ready for the next request
        self.open = set()  # exchanges that still hold a socket
        self.next_index = 0
        self.in_flight = 0
        self.ended = 0  # requests finished (recorded) so far: the event loop re-plans after one
        self.stopping = self.interrupted = False
        self.start = self.deadline = None
        self.pattern = None
        self.ok = self.errors = self.tokens = self.abandoned = self.incomplete = 0
        self.cut_at_deadline = bool(config.get("cut_at_deadline"))
        self.gaps = array.array("d")  # every inter-token gap of measured requests, seconds
        self.lags = array.array("d")  # send lag of measured requests, ms
        self.area = self.area_at = 0.0  # integral of requests in flight over the run
        self.interval = float(config.get("progress_interval", 60))
        self.timer = 0.0  # when housekeeping is next due
        # Backing off: ``streak`` requests in a row failed before any token (a server that refuses
        # at once would otherwise meet a closed loop's tight loop); none is sent before ``hold_until``.
        self.streak = self.backoffs = 0
        self.hold_until = 0.0

    def prepare(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError("unknown protocol %r (one of %s)" % (self.protocol, ", ".join(PROTOCOLS)))
        if self.protocol == "worker":
            return self.prepare_workers()
        host, port, prefix = server_address(self.config["server_url"], self.protocol)
        self.host = host
        self.tls = tls_context(self.config["server_url"], self.config.get("ca_file"))
        addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        self.family, self.sockaddr = addresses[0][0], addresses[0][4]
        # "localhost" may name ::1 first while the server listens on 127.0.0.1 only:
        # use the first address that accepts, and keep that connection for the first request.
        for family, _, _, _, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(10)
                sock.connect(sockaddr)
            except OSError:
                sock.close()
                continue
            if self.tls is not None:  # a certificate that fails verification stops the run here, clearly
                try:
                    sock = self.tls.wrap_socket(sock, server_hostname=host)
                except ssl.SSLError as exc:
                    sock.close()
                    raise ValueError("TLS to %s:%d failed: %s" % (host, port, exc))
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.family, self.sockaddr = family, sockaddr
            self.idle.append(sock)
            break
        host_header = "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)
        head = ("POST %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: gpubench-loadgen\r\n"
                "Content-Type: application/json\r\n" % (prefix, ENDPOINTS[self.protocol], host_header))
        head += "Accept: %s\r\n" % ("application/x-ndjson" if self.protocol in OLLAMA_PROTOCOLS
                                      else "text/event-stream")
        head += self.authorization()
        self.head = head
        self.requests = []
        for entry, (text, _, max_tokens, ignore_eos), (system, _) in zip(self.config["prompts"], self.prompts,
                                                                         self.chats):
            messages = None if system is None else [{"role": "system", "content": system},
                                                    {"role": "user", "content": text}]
            if self.chat and isinstance(entry, dict) and entry.get("messages"):
                messages = entry["messages"]  # a trace's conversation, sent as recorded
            self.requests.append(self.encoded(self.config["max_tokens"] if max_tokens is None else max_tokens,
                                              ignore_eos, messages, text))

    def encoded(self, max_tokens, ignore_eos, messages, text=None):
        """One request's bytes, head and body: ``text`` alone, or a message list (a system prompt,
        a conversation's history)."""
        if self.protocol == "worker":
            return worker_request(self.config, transcript(messages) if messages else text, max_tokens, ignore_eos)
        body = json.dumps(self.request_body(text, max_tokens, ignore_eos, messages)).encode()
        return (self.head + "Content-Length: %d\r\n\r\n" % len(body)).encode("latin-1") + body

    def request_body(self, text, max_tokens, ignore_eos=False, messages=None):
        """One prompt's request in the configured protocol, ``extra_body`` merged in last.

        ``messages`` (a system prompt, a conversation's history) go as they are on the chat
        protocols; Ollama's ``/api/generate`` takes a system prompt as ``system``, and
        ``/v1/completions`` a transcript of them. ``ignore_eos`` (generate to ``max_tokens``
        past end-of-sequence) is sent on the OpenAI protocols only, as vLLM, SGLang and
        llama.cpp's server take it; Ollama has no such option."""
        config = self.config
        if self.protocol in OLLAMA_PROTOCOLS:
            request = {"model": config["model"], "stream": True, "options": {"num_predict": max_tokens}}
            if self.protocol == "ollama-chat":
                request["messages"] = messages or [{"role": "user", "content": text}]
            elif messages and messages[0]["role"] == "system" and len(messages) == 2:
                request["system"], request["prompt"] = messages[0]["content"], messages[1]["content"]
            else:
                request["prompt"] = transcript(messages) if messages else text
            if config.get("think") is not None:  # absent: the model's default (a thinking model thinks)
                request["think"] = config["think"]
        else:
            request = {"model": config["model"], "stream": True, "stream_options": {"include_usage": True},
                       "max_tokens": max_tokens}
            if self.chat:
                request["messages"] = messages or [{"role": "user", "content": text}]
            else:
                request["prompt"] = transcript(messages) if messages else text
            if ignore_eos:
                request["ignore_eos"] = True
        request.update(config.get("extra_body") or {})
        return request

    def authorization(self):
        """The bearer token's header, from the instance's environment: never in a file, log or event."""
        name = self.config.get("api_key_env")
        if not name:
            return ""
        token = os.environ.get(name)
        if not token:
            raise ValueError("api_key_env names %s, which is not set in the environment" % name)
        return "Authorization: Bearer %s\r\n" % token

    def idle_socket(self):
        while self.idle:
            sock = self.idle.pop()
            try:
                # Closed by the server (b"") or stray bytes; a TLS socket is peeked beneath its TLS.
                socket.socket.recv(sock, 1, socket.MSG_PEEK)
            except BlockingIOError:
                return sock
            except OSError:
                pass
            sock.close()
        return None

    def launch(self, warmup, scheduled, prompt=None, dialogue=None):
        """Send the next request, scheduled at ``scheduled``: a conversation's next turn
        (``dialogue``), prompt ``prompt`` (a trace's own), else the prompts in turn."""
        index = self.next_index
        self.next_index += 1
        chosen = index % len(self.prompts) if prompt is None else prompt % len(self.prompts)
        if dialogue is not None:
            chosen = dialogue.prompt_index
        exchange = self.exchange(self, index, warmup, chosen, scheduled)
        if dialogue is not None:
            dialogue.next_request(self)
            exchange.dialogue = dialogue
            if exchange.texts is None:
                exchange.texts = []  # the answer is the next turn's history
        self.open.add(exchange)
        now = perf()
        self.account(now)
        self.in_flight += 1
        exchange.start(now)

    def account(self, now):
        """Integrate requests in flight over [start, deadline]."""
        if self.start is not None:
            until = min(now, self.deadline)
            if until > self.area_at:
                self.area += self.in_flight * (until - self.area_at)
                self.area_at = until

    def finished(self, exchange, record, now):
        """``exchange`` is no longer in flight: record it, free its slot."""
        self.account(now)
        self.in_flight -= 1
        self.ended += 1
        self.prefix_fields(exchange, record)
        record_json = json.dumps(record, separators=(",", ":"))
        self.output.write('{"event":"request",' + record_json[1:] + "\n")
        self.checkpoint.add(record_json)
        if self.checkpoint.due and self.checkpoint.not_before < self.timer:
            self.timer = self.checkpoint.not_before
        self.pace(record, now)
        if not exchange.warmup:
            if record["error"] is None:
                if record["incomplete"]:
                    self.incomplete += 1
                else:
                    self.ok += 1
                self.tokens += record["output_tokens"]
            else:
                self.errors += 1
            self.lags.append(record["send_lag_ms"])
        self.pattern.freed(now)
        if exchange.dialogue is not None and not exchange.warmup:
            answer = "".join(exchange.kept_text(t) for t in exchange.texts or ())
            exchange.dialogue.answered(self, record, answer, now)

    def prefix_fields(self, exchange, record):
        """Add to ``record`` what a prefix cache could serve and what the server says it did.

        ``sent_prompt_tokens`` and ``cacheable_prompt_tokens`` are estimates by the tokenizer-free
        rule (1.3 tokens per word of the messages' text): cacheable is, for a conversation's turn,
        its whole history (the previous turn's prompt and answer); for a prompt with a system
        prompt, that system prompt once it was sent before; for a prompt sent before, all of it.
        ``cached_prompt_tokens`` is the server's own count: OpenAI usage's
        ``prompt_tokens_details.cached_tokens``, or for Ollama (which counts in
        ``prompt_eval_count`` only the tokens it evaluated) the prompt's estimated length less
        that count; None when the server says nothing. ``conversation`` and ``turn`` (from 1)
        name a conversation's turn."""
        dialogue = exchange.dialogue
        text, system = self.prompts[exchange.prompt_index][0], self.chats[exchange.prompt_index][0]
        if dialogue is not None:
            record["conversation"], record["turn"] = dialogue.number, dialogue.turn
        if dialogue is not None and dialogue.turn > 1:
            sent, cacheable = dialogue.sent_words, dialogue.sent_words - len(dialogue.messages[-1]["content"].split())
        else:  # a prompt, or a conversation's first turn: the same text as the prompt's
            system_words = len(system.split()) if system else 0
            sent = system_words + len(text.split())
            if ("p", exchange.prompt_index) in self.sent_prefixes:
                cacheable = sent
            else:
                cacheable = system_words if system and ("s", system) in self.sent_prefixes else 0
            self.sent_prefixes.add(("p", exchange.prompt_index))
        if system:
            self.sent_prefixes.add(("s", system))
        sent_tokens = max(1, estimated_tokens(sent))
        record["sent_prompt_tokens"] = sent_tokens
        record["cacheable_prompt_tokens"] = min(sent_tokens, estimated_tokens(cacheable))
        final = exchange.final or {}
        cached = server_count(final.get("cached_tokens"))
        if cached is None and self.protocol in OLLAMA_PROTOCOLS and record["prompt_tokens"] is not None:
            cached = max(0, sent_tokens - record["prompt_tokens"])
        record["cached_prompt_tokens"] = cached

    def pace(self, record, now):
        """Back off after ``BACKOFF_AFTER`` requests in a row failed before any token: pause
        (``backoff_pause``), then send one request at a time until one succeeds. Said once, when
        it starts and when it ends, as ``backoff`` events, never once per error."""
        if record["error"] is None:
            if self.streak >= BACKOFF_AFTER:
                self.output.emit("backoff", status="ended", errors=self.streak)
            self.streak = 0
            return
        if record["output_tokens"]:
            return  # it failed mid-answer: the server answers, so no pause (and the streak goes on)
        self.streak += 1
        pause = backoff_pause(self.streak)
        if pause:
            self.hold_until = now + pause
            if self.streak == BACKOFF_AFTER:
                self.backoffs += 1
                self.output.emit("backoff", status="started", errors=self.streak, pause_s=pause,
                                 max_pause_s=BACKOFF_CAP, error=str(record["error"])[:300])

    def held(self, now):
        """Whether no request may go now: backing off, its pause not over or its one request in flight."""
        return self.streak >= BACKOFF_AFTER and (now < self.hold_until or self.in_flight > 0)

    def totals(self, now):
        elapsed = now - self.start if self.start is not None else 0.0
        return {
            "requests": self.ok,
            "tokens": self.tokens,
            "tps": round(self.tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "errors": self.errors,
            "elapsed": round(elapsed, 3),
            "in_flight": self.in_flight,
            "incomplete": self.incomplete,
        }

    def drive(self, pattern, measuring):
        """Run the event loop until ``pattern`` is done and nothing is in flight."""
        self.pattern = pattern
        self.next_progress = self.start + self.interval if measuring else None
        self.next_scan = perf() + self.scan_every
        self.timer = self.next_scan if self.next_progress is None else min(self.next_scan, self.next_progress)
        select = self.selector.select
        cutting = measuring and self.cut_at_deadline
        # At low concurrency every token is a wake-up of its own, so the turn that only received
        # bytes is kept short: the pattern is asked again only once a request was sent or ended
        # or the time the loop was to wake at came.
        wake, asked, now = None, None, perf()
        while not self.stopping:
            if asked != (self.in_flight, self.ended) or now >= wake:
                pattern.launch(self, now)
                now = perf()
                if cutting and self.in_flight and now >= self.deadline:
                    self.cut(now)
                if not self.in_flight and pattern.exhausted(now):
                    break
                wake, asked = pattern.wake(self), (self.in_flight, self.ended)
            elif cutting and self.in_flight and now >= self.deadline:
                self.cut(now)
            if wake is not None and self.streak >= BACKOFF_AFTER:
                # Backing off: the pause's end, or the request in flight's completion (select wakes).
                wake = None if self.in_flight else max(wake, self.hold_until)
                if wake is not None and measuring and wake > self.deadline:
                    wake = self.deadline
            if wake is None or wake > self.timer:
                wake = self.timer
            if cutting and now < self.deadline < wake:
                wake = self.deadline
            for key, mask in select(wake - now if wake > now else 0.0):
                key.data.ready(mask)
            now = perf()
            if now >= self.timer:
                self.housekeeping(now, measuring)

    def housekeeping(self, now, measuring):
        """Progress events, checkpoints and timeouts, each when its time comes."""
        if self.next_progress is not None and now >= self.next_progress:
            if now < self.deadline:
                self.output.emit("progress", **self.totals(now))
            while self.next_progress <= now:
                self.next_progress += self.interval
            if self.next_progress >= self.deadline:
                self.next_progress = None  # the last one comes with the finish event
        if self.checkpoint.due and now >= self.checkpoint.not_before:
            self.checkpoint.write("running", self.totals(now) if measuring else None)
        if now >= self.next_scan:
            self.expire(now)
            self.next_scan = now + self.scan_every
        self.timer = min(t for t in (self.next_scan, self.next_progress, self.checkpoint.wake()) if t is not None)

    def expire(self, now):
        for exchange in list(self.open):
            quiet = now - exchange.last_io
            if exchange.active and quiet > self.timeout:
                exchange.fail("stalled: no data for %g s (stall timeout)" % self.timeout, now)
            elif not exchange.active and quiet > 10:
                exchange.close()  # a response that never finished draining

    def cut(self, now):
        """End every measured request still in flight as incomplete (``cut_at_deadline``)."""
        for exchange in sorted(self.open, key=lambda e: e.index):
            if exchange.active and not exchange.warmup:
                exchange.cut(now)

    def abandon(self):
        """Close every connection; requests still in flight are not recorded."""
        for exchange in list(self.open):
            if exchange.active:
                self.abandoned += 1
                exchange.active = False
            exchange.close()
        self.in_flight = 0
        for sock in self.idle:
            sock.close()
        self.idle = []
        if self.protocol == "worker":
            self.stop_workers()

    def run(self):
        config, output = self.config, self.output
        self.prepare()
        output.emit("connection", status="connected", url=config["server_url"])
        self.checkpoint.write("started", None)
        warmups = int(config.get("warmup_requests", 0))
        if warmups:
            output.emit("worker", status="warmup")
            self.drive(Warmup(warmups), measuring=False)
        output.emit("worker", status="running")
        cpu_before = time.process_time()
        self.start = self.area_at = perf()
        self.deadline = self.start + float(config["duration"])
        pattern = None
        if not self.stopping:
            if config.get("schedule") is not None:
                pattern = TraceSchedule(config["schedule"], int(config.get("max_in_flight", 1024)), self.start)
            elif self.conversing:
                pattern = ConversationSlots(max(1, int(config.get("concurrency", 1))), self.start, self.deadline)
            elif config.get("rate"):
                pattern = PoissonArrivals(float(config["rate"]), config.get("seed", 0),
                                          int(config.get("max_in_flight", 1024)), self.start, self.deadline)
            else:
                limit = config.get("requests")
                pattern = FixedConcurrency(max(1, int(config.get("concurrency", 1))), self.start, self.deadline,
                                           None if limit is None else int(limit))
            self.drive(pattern, measuring=True)
        end = perf()
        self.account(end)
        cpu_seconds = time.process_time() - cpu_before
        self.abandon()
        status = "interrupted" if self.interrupted else "completed"
        self.checkpoint.write(status, self.totals(end))
        output.emit("progress", **self.totals(end))
        window = min(end, self.deadline) - self.start
        output.emit(
            "finish", status=status, duration_seconds=end - self.start, message="",
            itl_ms=self.itl_summary(), cpu_seconds=round(cpu_seconds, 4),
            cpu_seconds_per_1k_tokens=round(cpu_seconds / (self.tokens / 1000), 4) if self.tokens else None,
            delivered_concurrency=round(self.area / window, 4) if window > 0 else None,
            send_lag_ms=self.lag_summary(), unsent=pattern.unsent() if pattern else 0,
            abandoned=self.abandoned, incomplete=self.incomplete, backoffs=self.backoffs,
        )

    def itl_summary(self):
        gaps = self.gaps
        count = len(gaps)
        if not count:
            return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None}
        ordered = sorted(gaps if count <= GAPS_SORTED_MAX else gaps[:: count // GAPS_SORTED_MAX + 1])
        summary = {"count": count, "mean": ms(sum(gaps) / count)}
        for p in (50, 90, 95, 99):
            summary["p%d" % p] = ms(percentile(ordered, p))
        summary["max"] = ms(max(gaps))
        return summary

    def lag_summary(self):
        ordered = sorted(self.lags)
        if not ordered:
            return {"p50": None, "p99": None, "max": None}
        return {"p50": round(percentile(ordered, 50), 4), "p99": round(percentile(ordered, 99), 4),
                "max": ordered[-1]}


def read_config(argv, stdin):
    """The run's config: one JSON argument when given (``python3 - CONFIG``), else the JSON
    that follows the script on stdin (the plugin's way, ``measure/benchmark.py``: a dataset
    of megabytes is no argument, which Linux caps at 128 KiB)."""
    text = argv[1] if len(argv) > 1 else stdin.read()
    if not text.strip():
        raise ValueError("no config: give it as one JSON argument or after the script on stdin")
    config = json.loads(text)
    if not isinstance(config, dict):
        raise ValueError("the config is not a JSON object")
    return config


def main(argv):
    try:
        config = read_config(argv, sys.stdin.buffer)
    except ValueError as exc:
        sys.stderr.write("loadgen: %s\n" % exc)
        return 2
    path = config.get("checkpoint_path")
    if path and not os.path.isabs(path):
        # Relative to the login home, whatever directory the SSH server started in.
        config["checkpoint_path"] = os.path.join(os.path.expanduser("~"), path)
    output = Output()
    run = LoadGenerator(config, output)

    def interrupt(signum, frame):
        run.interrupted = run.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    # A lost SSH connection must not kill the run: the checkpoint still fills.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    Wakeup(run.selector)
    try:
        run.run()
    except Exception as exc:
        traceback.print_exc()
        run.abandon()
        run.checkpoint.write("failed", None)
        output.emit("finish", status="failed", duration_seconds=0.0, message="%s: %s" % (type(exc).__name__, exc))
        output.close()
        return 1
    output.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
