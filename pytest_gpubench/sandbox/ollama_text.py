"""What the emulated model says: deterministic filler text and token counts.

The words mean nothing; what matters is that they look like a model's output, that
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
import random
from dataclasses import dataclass

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


def plan_output(prompt: str, num_predict: int | None, *, model: str = "", think: bool = False) -> OutputPlan:
    """Decide the answer to ``prompt``: same prompt, cap and ``think``, same answer.

    Without a positive ``num_predict`` the answer has its natural length. With one,
    it is 60-100% of the cap, and about one prompt in five runs into the cap. A
    prompt asking for a haiku gets a short answer either way. With ``think`` the
    answer (at its natural length) comes after a reasoning of ``THINKING_TOKENS``
    and the cap counts both.
    """
    if think:
        return _thinking_plan(prompt, num_predict, model)
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
    return OutputPlan(tokens=tuple(words), done_reason=reason)


def _thinking_plan(prompt: str, num_predict: int | None, model: str) -> OutputPlan:
    rng = random.Random(_seed(prompt, model + "\x00think"))
    reasoning = [Thought(t) for t in _prose_tokens(rng, rng.randint(*THINKING_TOKENS))]
    answer = plan_output(prompt, None, model=model).tokens
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
