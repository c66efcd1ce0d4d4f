"""Multi-turn conversations and shared system prompts: the workloads that exercise a prefix cache.

``prompts: {conversations: {...}}`` makes conversations to distributions (``synthetic.py``'s
DISTs): each has ``turns`` user messages of ``input_tokens`` each, answers capped at
``output_tokens``, and ``think_time`` seconds between an answer and the next turn.
The load generator sends turn *k* with the whole history (turns 1..k-1 with the
model's own answers, as it streamed them), so the server can reuse the cached
prefix of the previous turn. ``prompts: {dataset: FILE, multi_turn: true}`` takes
the human turns of ShareGPT conversations instead (``datasets.py``).

``synthetic: {shared_prefix: 0.5, ...}`` puts one system prompt, common to every
request, in front of each prompt: that share of each prompt's tokens (of the mean
``input_tokens``) is the shared part, the rest unique, so 0%, 50% and 90% measure
what prefix caching buys on a runtime (docs/workloads.md, "Shared prefixes").

Everything here is plain data; :mod:`.workload` turns it into prompts (``ChatPrompt``).
Lengths are counted by the tokenizer-free rule of ``synthetic.py`` (1.3 tokens per word).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..options import parse_duration
from .synthetic import MAX_COUNT, Distribution, distribution, text_of_length

#: The most turns one conversation may have.
MAX_TURNS = 1000
#: The longest think time, seconds.
MAX_THINK = 3600.0


# ------------------------------------------------------------------ think time


@dataclass(frozen=True)
class ThinkTime:
    """Seconds between an answer and the next turn: fixed (``low``) or uniform in [low, high]."""

    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else round(rng.uniform(self.low, self.high), 4)

    def describe(self) -> str:
        return f"{self.low:g}s" if self.low == self.high else f"uniform[{self.low:g},{self.high:g}]s"


def _seconds(value: Any, what: str) -> float:
    try:
        seconds = parse_duration(value) if isinstance(value, str) else value
    except ValueError:
        seconds = None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 0 <= seconds <= MAX_THINK:
        raise ValueError(f"`{what}` must be seconds from 0 to {MAX_THINK:g} (a number or a string such as "
                         f"'2s'); got {value!r}")
    return float(seconds)


def think_time(value: Any, what: str = "think_time") -> ThinkTime:
    """``think_time`` as written: seconds (``2``, ``'1.5s'``) or ``{uniform: [lo, hi]}``."""
    if isinstance(value, Mapping):
        if set(value) != {"uniform"} or not isinstance(value["uniform"], (list, tuple)) \
                or len(value["uniform"]) != 2:
            raise ValueError(f"`{what}` must be seconds or {{uniform: [lo, hi]}}; got {value!r}")
        low, high = (_seconds(v, f"{what}.uniform") for v in value["uniform"])
        if low > high:
            raise ValueError(f"`{what}.uniform` must be [lo, hi] with lo <= hi; got [{low:g}, {high:g}]")
        return ThinkTime(low, high)
    seconds = _seconds(value, what)
    return ThinkTime(seconds, seconds)


# ------------------------------------------------------------------ conversations


@dataclass(frozen=True)
class Turn:
    """One user turn: its text, its answer's cap (None: the workload's), the think time before it."""

    text: str
    max_tokens: int | None = None
    think_s: float = 0.0


@dataclass(frozen=True)
class Conversation:
    """A conversation to replay: an optional system prompt and its user turns, in order."""

    turns: tuple[Turn, ...]
    system: str | None = None


_KEYS = ("turns", "input_tokens", "output_tokens", "think_time", "count", "seed")


@dataclass(frozen=True)
class ConversationSpec:
    """``prompts: {conversations: ...}`` validated."""

    turns: Distribution
    input_tokens: Distribution
    output_tokens: Distribution | None
    think: ThinkTime
    count: int
    seed: int

    def describe(self) -> str:
        """The spec in one stable line, for reports and the workload fingerprint."""
        output = self.output_tokens.describe() if self.output_tokens else "workload"
        return (f"conversations turns {self.turns.describe()} input {self.input_tokens.describe()} output {output} "
                f"think {self.think.describe()} count {self.count} seed {self.seed}")

    def conversations(self) -> list[Conversation]:
        """The conversations, the same for the same spec on any machine (one generator per quantity)."""
        turns = random.Random(f"gpubench-conversation-turns-{self.seed}")
        lengths = random.Random(f"gpubench-conversation-input-{self.seed}")
        outputs = random.Random(f"gpubench-conversation-output-{self.seed}")
        thinks = random.Random(f"gpubench-conversation-think-{self.seed}")
        words = random.Random(f"gpubench-conversation-text-{self.seed}")
        out = []
        for _ in range(self.count):
            made = []
            for k in range(self.turns.draw(turns)):
                made.append(Turn(text_of_length(self.input_tokens.draw(lengths), words),
                                 self.output_tokens.draw(outputs) if self.output_tokens else None,
                                 self.think.draw(thinks) if k else 0.0))
            out.append(Conversation(tuple(made)))
        return out


def conversation_spec(value: Any) -> ConversationSpec:
    """``conversations:``'s mapping -> :class:`ConversationSpec`; ValueError says what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"`conversations` must be a mapping with {', '.join(_KEYS)}; got {value!r}")
    unknown = [str(k) for k in value if k not in _KEYS]
    if unknown:
        raise ValueError(f"`conversations` has an unknown key {unknown[0]!r}; allowed: {', '.join(_KEYS)}")
    for key in ("turns", "input_tokens"):
        if key not in value:
            raise ValueError(f"`conversations.{key}` is required: a whole number or {{uniform: [lo, hi]}}")
    turns = distribution(value["turns"], "conversations.turns")
    if turns.high > MAX_TURNS:
        raise ValueError(f"`conversations.turns` must be at most {MAX_TURNS}; got {turns.describe()}")
    count = value.get("count", 50)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"`conversations.count` must be a whole number from 1 to {MAX_COUNT}; got {count!r}")
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"`conversations.seed` must be a whole number; got {seed!r}")
    output = value.get("output_tokens")
    return ConversationSpec(
        turns=turns,
        input_tokens=distribution(value["input_tokens"], "conversations.input_tokens"),
        output_tokens=None if output is None else distribution(output, "conversations.output_tokens"),
        think=think_time(value.get("think_time", 0), "conversations.think_time"),
        count=count, seed=seed)
