"""What the stand-in's parts share: the real Ollama's small conventions and the model's text.

Address parsing, durations and the human-readable sizes and times its CLI prints.
Each mirrors what Ollama documents or visibly does; none of its code is copied.

**What the emulated model says** (:func:`plan_output`, which every stand-in server shares):
deterministic filler text and token counts. The words mean nothing; what matters is that they look like a model's output, that
the same prompt always gets the same answer (so sandbox runs are repeatable), and
that lengths behave like a real model's: a cap (``num_predict``) is respected and
reached now and then (``done_reason: "length"``), otherwise the answer stops on its
own (``"stop"``).

A thinking-capable model (``thinking: true`` in the catalog: deepseek-r1, qwen3)
that thinks on this request reasons first, as Ollama streams it since 0.12.4: the
plan's first ``thinking`` tokens are :class:`Thought` strings (the handlers stream
them in ``thinking`` / ``message.thinking`` / ``delta.reasoning`` with an empty
answer), then one empty token for the closing ``</think>`` tag (Ollama's thinking
parser swallows the tag's text but still sends the chunk, and ``eval_count``
counts it), then the answer. ``num_predict`` caps all of them together, so a long
reasoning can use up the cap before any answer token.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import random
import re
from dataclasses import dataclass
from datetime import datetime, timezone

DEFAULT_PORT = 11434
DEFAULT_KEEP_ALIVE_S = 300.0
# Ollama answers a negative keep_alive with "keep loaded forever".
FOREVER = math.inf
#: The stand-ins' listen backlog, as the real servers': Go's ``net.Listen`` (Ollama) takes the kernel's
#: ``somaxconn`` (4096), uvicorn (vLLM, SGLang) 2048. aiohttp's default of 128 left the connects of 256
#: clients starting at once waiting a second for the kernel to retry their SYN.
LISTEN_BACKLOG = 2048


@dataclass(frozen=True)
class OllamaHost:
    """Where the server listens and the client connects."""

    scheme: str
    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = self.host or "127.0.0.1"
        if ":" in host:  # an IPv6 literal needs brackets in a URL
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"


def parse_ollama_host(value: str | None) -> OllamaHost:
    """Parse ``OLLAMA_HOST`` the way Ollama does.

    Accepted: empty (127.0.0.1:11434), ``host``, ``host:port``, ``:port``,
    ``scheme://host[:port][/path]``, IPv6 in brackets. A bare host keeps the default
    port 11434; with an explicit ``http://`` or ``https://`` scheme the default port
    is 80 or 443. Surrounding quotes and spaces are ignored, and an invalid port
    falls back to the default.
    """
    text = (value or "").strip().strip("\"'").strip()
    default_port = DEFAULT_PORT
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    elif scheme == "http":
        default_port = 80
    elif scheme == "https":
        default_port = 443
    hostport = rest.split("/", 1)[0]
    host, port_text = _split_host_port(hostport)
    if host is None:
        host, port_text = "127.0.0.1", str(default_port)
        bare = hostport.strip("[]")
        if bare:
            host = bare
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        port = default_port
    return OllamaHost(scheme=scheme, host=host, port=port)


def _split_host_port(hostport: str) -> tuple[str | None, str]:
    """Go's net.SplitHostPort, in the cases Ollama's parsing relies on."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or not hostport[end + 1 :].startswith(":"):
            return None, ""
        return hostport[1:end], hostport[end + 2 :]
    if hostport.count(":") != 1:
        return None, ""
    host, port = hostport.split(":")
    return host, port


def bind_host(host: OllamaHost) -> str:
    """The address to listen on: an empty host means every interface, as in Go."""
    if not host.host:
        return "0.0.0.0"
    try:
        return str(ipaddress.ip_address(host.host))
    except ValueError:
        return host.host


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string such as ``5m``, ``1h30m`` or ``-1s``."""
    text = text.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if not match:
            raise ValueError(f'time: invalid duration "{text}"')
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not body:
        raise ValueError(f'time: invalid duration "{text}"')
    return sign * total


def parse_keep_alive(value: object, default: float = DEFAULT_KEEP_ALIVE_S) -> float:
    """A request's ``keep_alive`` in seconds; negative means forever.

    Ollama takes a number of seconds or a Go duration string; an absent value means
    the server default (``OLLAMA_KEEP_ALIVE``, else 5 minutes).
    """
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number or a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            seconds = parse_go_duration(value)
    else:
        raise ValueError("keep_alive must be a number or a duration")
    return FOREVER if seconds < 0 else seconds


def rfc3339(moment: datetime | None = None) -> str:
    """A timestamp like Ollama's ``created_at``: UTC, microseconds, ``Z``."""
    moment = moment or datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def human_bytes(size: int) -> str:
    """Decimal sizes as ``ollama list`` prints them: ``4.4 GB``, ``274 MB``."""
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= factor:
            value = size / factor
            if value >= 10 or value == int(value):
                return f"{int(value)} {unit}"
            return f"{value:.1f} {unit}"
    return f"{size} B"


def human_bytes_binary(size: int) -> str:
    """Binary sizes as Ollama's memory errors print them: ``5.8 GiB``."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def human_time(moment: datetime, now: datetime | None = None) -> str:
    """``2 minutes ago`` / ``4 minutes from now`` / ``Forever``, as the CLI shows."""
    now = now or datetime.now(timezone.utc)
    delta = (moment - now).total_seconds()
    if abs(delta) > 50 * 365 * 86400:
        return "Forever"
    suffix = "from now" if delta > 0 else "ago"
    seconds = abs(delta)
    if seconds < 1:
        return "Less than a second " + suffix if delta <= 0 else "Less than a second from now"
    for limit, unit, size in (
        (60, "second", 1),
        (3600, "minute", 60),
        (86400, "hour", 3600),
        (7 * 86400, "day", 86400),
        (30 * 86400, "week", 7 * 86400),
        (365 * 86400, "month", 30 * 86400),
    ):
        if seconds < limit:
            count = int(seconds // size)
            if count == 1:
                article = "About an" if unit == "hour" else "About a"
                return f"{article} {unit} {suffix}"
            return f"{count} {unit}s {suffix}"
    years = int(seconds // (365 * 86400))
    return f"{years} years {suffix}" if years != 1 else f"About a year {suffix}"


def go_duration(seconds: float) -> str:
    """A duration the way Go's ``time.Duration`` prints: ``1.234s``, ``12.5ms``."""
    if seconds == 0:
        return "0s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3f}".rstrip("0").rstrip(".") + "µs"
    if seconds < 1:
        return f"{seconds * 1e3:.6f}".rstrip("0").rstrip(".") + "ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.9f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


# ------------------------------------------------------------ what the emulated model says

# Real Ollama's default num_predict is -1: the model talks until it stops. The
# stand-in's "natural" answer is 60-100% of this many tokens, which keeps sandbox
# runs short and matches the 128 that older Ollama releases used as the default.
NATURAL_TOKENS = 128
HAIKU_TOKENS = 24
# A reasoning model's natural reasoning length, in tokens: deepseek-r1 distills
# think for a few hundred tokens before a short answer, so with the benchmark's
# default 256-token cap some requests end while still thinking.
THINKING_TOKENS = (96, 320)
# Words per token of English text, roughly, for both prompts and answers.
TOKENS_PER_WORD = 1.3

_WORDS = (
    "the a of and to in is that it for as with on are this by be from at or an "
    "which can model data light system value each more energy time first these "
    "other when because between through process different example result number "
    "also water surface will would important called known use used over into most "
    "than only such their they some many while where however therefore scattering "
    "wavelength atmosphere particles shorter longer blue red sun sky air molecules "
    "memory layer network weights tokens inference throughput latency batch cache "
    "question answer simple approach method common practice small large fast slow "
    "structure pattern reason effect change increase reduce depends typically often "
    "usually several important step next finally way part form level order case "
    "point field range source signal temperature pressure speed distance direction"
).split()
_HAIKU_WORDS = (
    "autumn moon silent river falling leaves cold wind morning dew mountain mist "
    "quiet pond frog jumps cherry blossom evening snow distant bell old path"
).split()


class Thought(str):
    """A token of reasoning ("thinking") rather than of the answer."""

    __slots__ = ()


@dataclass(frozen=True)
class OutputPlan:
    """The tokens a request will receive and why they end.

    ``thinking`` counts the leading :class:`Thought` tokens; when the answer
    follows them, one empty token (the closing tag) separates the two.
    """

    tokens: tuple[str, ...]
    done_reason: str  # "stop" or "length"
    thinking: int = 0

    @property
    def answer_tokens(self) -> int:
        """Tokens of the answer itself (neither reasoning nor the closing tag)."""
        return len(self.tokens) - self.thinking - (1 if self.thinking and len(self.tokens) > self.thinking else 0)


def count_prompt_tokens(text: str) -> int:
    """Emulated prompt length in tokens: about 1.3 per word, at least 1."""
    words = len(text.split())
    return max(1, round(words * TOKENS_PER_WORD))


def _seed(prompt: str, salt: str) -> int:
    digest = hashlib.sha256(f"{salt}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def plan_output(prompt: str, num_predict: int | None, *, model: str = "", think: bool = False,
                accuracy: float = 1.0) -> OutputPlan:
    """Decide the answer to ``prompt``: same prompt, cap and ``think``, same answer.

    Without a positive ``num_predict`` the answer has its natural length. With one,
    it is 60-100% of the cap, and about one prompt in five runs into the cap. A
    prompt asking for a haiku gets a short answer either way. With ``think`` the
    answer (at its natural length) comes after a reasoning of ``THINKING_TOKENS``
    and the cap counts both. A built-in accuracy problem's answer ends with
    ``Answer: N``, right for the share ``accuracy`` of problems (:func:`answer_line`).
    """
    if think:
        return _thinking_plan(prompt, num_predict, model, accuracy)
    rng = random.Random(_seed(prompt, model))
    haiku = "haiku" in prompt.lower()
    capped = num_predict is not None and num_predict >= 0
    budget = num_predict if capped and num_predict > 0 else NATURAL_TOKENS
    if num_predict == 0:
        return OutputPlan(tokens=(), done_reason="length")
    if haiku:
        length = rng.randint(HAIKU_TOKENS - 6, HAIKU_TOKENS + 6)
    else:
        # Draws above 1.0 are clipped to the cap: those requests end with "length".
        fraction = min(1.0, 0.6 + 0.5 * rng.random()) if capped else 0.6 + 0.4 * rng.random()
        length = max(1, round(budget * fraction))
    if capped:
        length = min(length, budget)
    reason = "length" if capped and length >= budget else "stop"
    words = _haiku_tokens(rng, length) if haiku else _prose_tokens(rng, length)
    return OutputPlan(tokens=tuple(answer_line(prompt, model, accuracy, words)), done_reason=reason)


def _thinking_plan(prompt: str, num_predict: int | None, model: str, accuracy: float) -> OutputPlan:
    rng = random.Random(_seed(prompt, model + "\x00think"))
    reasoning = [Thought(t) for t in _prose_tokens(rng, rng.randint(*THINKING_TOKENS))]
    answer = plan_output(prompt, None, model=model, accuracy=accuracy).tokens
    tokens = (*reasoning, "", *answer)  # "": the closing tag, streamed as an empty chunk
    if num_predict is not None and 0 <= num_predict < len(tokens):
        return OutputPlan(tokens=tokens[:num_predict], done_reason="length",
                          thinking=min(num_predict, len(reasoning)))
    return OutputPlan(tokens=tokens, done_reason="stop", thinking=len(reasoning))


def _prose_tokens(rng: random.Random, count: int) -> list[str]:
    tokens: list[str] = []
    sentence_left = 0
    while len(tokens) < count:
        if sentence_left == 0:
            if tokens:
                tokens.append(".")
                if len(tokens) >= count:
                    break
            sentence_left = rng.randint(7, 16)
            word = rng.choice(_WORDS).capitalize()
        else:
            word = rng.choice(_WORDS)
            if sentence_left > 3 and rng.random() < 0.08:
                tokens.append(",")
                if len(tokens) >= count:
                    break
        tokens.append(word if not tokens else " " + word)
        sentence_left -= 1
    return tokens[:count]


def _haiku_tokens(rng: random.Random, count: int) -> list[str]:
    tokens: list[str] = []
    line_lengths = (3, 4, 3)
    line = 0
    while len(tokens) < count:
        for _ in range(line_lengths[line % 3]):
            word = rng.choice(_HAIKU_WORDS)
            tokens.append(word.capitalize() if not tokens or tokens[-1] == "\n" else " " + word)
        tokens.append("\n")
        line += 1
    return tokens[:count]


# ------------------------------------------------ the built-in accuracy problems
#
# ``workload.accuracy: builtin`` asks arithmetic word problems of five shapes
# (``matrix/accuracy.py``); the emulated model reads them as a model would, works the
# answer out, and gets it right for a known share of problems: a draw from the prompt
# and the model's name (uniform in [0, 1)) below the model's ``accuracy`` (the
# catalog's ``models[].accuracy``, default 1). A wrong answer is off by 1 to 9. The
# answer replaces the reply's last tokens, so its length (and timing) stays as it was.

_SHAPES = (
    (re.compile(r"at (\d+) dollars each\. \w+ buys (\d+) \w+\. How many dollars"), lambda a, b: a * b),
    (re.compile(r"has (\d+) \w+\. \w+ buys (\d+) more and then gives away (\d+)\."), lambda a, b, c: a + b - c),
    (re.compile(r"travels (\d+) kilometres each hour\. How many kilometres does it travel in (\d+) hours"),
     lambda a, b: a * b),
    (re.compile(r"(\d+) students are split into (\d+) teams of equal size"), lambda a, b: a // b),
    (re.compile(r"holds (\d+) litres of water\. (\d+) litres are used on Monday and (\d+) litres on Tuesday"),
     lambda a, b, c: a - b - c),
)


def solve_builtin(prompt: str) -> int | None:
    """The answer to a built-in accuracy problem, worked out from its text; None for any other prompt."""
    for shape, work in _SHAPES:
        found = shape.search(prompt)
        if found:
            return work(*(int(n) for n in found.groups()))
    return None


def answers_right(prompt: str, model: str, accuracy: float) -> bool:
    """Whether the emulated ``model`` answers this problem right: the same for the same
    prompt and model on every machine, and true for about ``accuracy`` of problems."""
    return _seed(prompt, model + "\x00accuracy") / 2 ** 64 < accuracy


def answer_line(prompt: str, model: str, accuracy: float, tokens: list[str]) -> list[str]:
    """``tokens`` with their last four replaced by ``\\nAnswer: N`` for a built-in problem
    (fewer tokens: the line's end); any other prompt's tokens as they are."""
    solved = solve_builtin(prompt)
    if solved is None or not tokens:
        return tokens
    value = solved if answers_right(prompt, model, accuracy) else solved + 1 + _seed(prompt, model) % 9
    line = ["\n", "Answer", ":", f" {value}"]
    kept = max(0, len(tokens) - len(line))
    return tokens[:kept] + line[len(line) - (len(tokens) - kept):]
