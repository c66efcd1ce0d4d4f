"""Synthetic prompts: token lengths drawn from a distribution, text made to that length.

``prompts: {synthetic: {input_tokens: DIST, output_tokens: DIST, count: N, seed: S}}``
as GuideLLM (``prompt_tokens``, ``prompt_tokens_stdev/min/max``, ``output_tokens``,
``samples``) and AIPerf (``--synthetic-input-tokens-mean/stddev``,
``--output-tokens-mean/stddev``, ``--random-seed``) describe theirs. A DIST is

* a whole number: every prompt has that length;
* ``{uniform: [lo, hi]}``: whole numbers from ``lo`` to ``hi``, both included, equally likely;
* ``{normal: {mean, stdev, min?, max?}}``: a Gaussian draw rounded to a whole
  number and clamped to ``[min, max]`` (``min`` defaults to 1), as GuideLLM clamps
  its ``*_stdev`` draws to ``*_min``/``*_max``.

Token counts here need no tokenizer: a prompt of ``T`` tokens is ``round(T / 1.3)``
words, by the rule the sandbox's Ollama stand-in counts with (English prose
averages about 1.3 tokens per word; ``sandbox/ollama_common.py``). Under that rule
the count is exact to within one token; a real tokenizer counts the same text
within roughly 20% of it (vocabularies differ), and the server's own prompt token
count is recorded beside every request. The same seed gives the same prompts,
lengths and order on every machine (Python's ``random.Random`` is seeded from the
spec, not the process).

``shared_prefix: SHARE`` (0 to below 1, or ``'50%'``) makes one system prompt common to
every request, ``SHARE`` of the mean input length, sent as the system message (or
Ollama's ``system``); each prompt's unique part is the rest of its drawn length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOKENS_PER_WORD = 1.3
"""Tokens per word of English text: the rule the sandbox stand-in counts prompts with."""

MAX_LENGTH = 131072
"""The longest length a distribution may give (``max_tokens``'s own bound)."""

MAX_COUNT = 100_000
"""The most synthetic prompts one workload may ask for."""

_VOCABULARY = (
    "the a of and to in is that it for as with on are this by be from at or an which can "
    "model data light system value each more energy time first these other when because "
    "between through process different example result number also water surface will "
    "would important called known use used over into most than only such their they "
    "some many while where however therefore measurement wavelength atmosphere particle "
    "memory layer network weights inference throughput latency batch cache question "
    "answer simple approach method common practice small large fast slow structure "
    "pattern reason effect change increase reduce depends typically often usually several "
    "step next finally way part form level order case point field range source signal "
    "temperature pressure speed distance direction history river mountain city market "
    "language theory experiment observation computer algorithm sequence analysis"
).split()


def count_tokens(text: str) -> int:
    """A text's length in tokens by the tokenizer-free rule: about 1.3 per word, at least 1."""
    return max(1, round(len(text.split()) * TOKENS_PER_WORD))


def words_for(tokens: int) -> int:
    """How many words make a text of about ``tokens`` tokens (within one, by :func:`count_tokens`)."""
    return max(1, round(tokens / TOKENS_PER_WORD))


def text_of_length(tokens: int, rng: random.Random) -> str:
    """Prose-like filler of about ``tokens`` tokens, drawn from ``rng`` (so a seed fixes it)."""
    return " ".join(rng.choice(_VOCABULARY) for _ in range(words_for(tokens)))


# ----------------------------------------------------------------- distributions


@dataclass(frozen=True)
class Distribution:
    """A length distribution: ``fixed`` (``low``), ``uniform`` (``low``..``high``) or ``normal``."""

    kind: str
    low: int
    high: int
    mean: float = 0.0
    stdev: float = 0.0

    def draw(self, rng: random.Random) -> int:
        """One whole length from this distribution."""
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        return min(self.high, max(self.low, round(rng.gauss(self.mean, self.stdev))))

    def describe(self) -> str:
        """Short and stable: ``128``, ``uniform[64,256]``, ``normal(200,50)[1,400]``."""
        if self.kind == "fixed":
            return str(self.low)
        if self.kind == "uniform":
            return f"uniform[{self.low},{self.high}]"
        return f"normal({self.mean:g},{self.stdev:g})[{self.low},{self.high}]"


_DIST_ALLOWED = ("a whole number, {uniform: [lo, hi]} or {normal: {mean: M, stdev: S, min: LO, max: HI}} "
                 "(min and max optional)")


def _length(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LENGTH:
        raise ValueError(f"{what} must be a whole number from 1 to {MAX_LENGTH}; got {value!r}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValueError(f"{what} must be a number of at least 0; got {value!r}")
    return float(value)


def distribution(value: Any, name: str) -> Distribution:
    """A DIST as written (see the module docstring) -> :class:`Distribution`; ValueError says why not."""
    if isinstance(value, int) and not isinstance(value, bool):
        length = _length(value, f"`{name}`")
        return Distribution("fixed", length, length)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(f"`{name}` must be {_DIST_ALLOWED}; got {value!r}")
    (kind, spec), = value.items()
    if kind == "uniform":
        if not isinstance(spec, (list, tuple)) or len(spec) != 2:
            raise ValueError(f"`{name}.uniform` must be [lo, hi]; got {spec!r}")
        low, high = (_length(v, f"`{name}.uniform`'s bounds") for v in spec)
        if low > high:
            raise ValueError(f"`{name}.uniform` must be [lo, hi] with lo <= hi; got [{low}, {high}]")
        return Distribution("uniform", low, high, mean=(low + high) / 2)
    if kind == "normal":
        if not isinstance(spec, Mapping):
            raise ValueError(f"`{name}.normal` must be a mapping {{mean, stdev, min?, max?}}; got {spec!r}")
        unknown = [k for k in spec if k not in ("mean", "stdev", "min", "max")]
        if unknown or "mean" not in spec or "stdev" not in spec:
            raise ValueError(f"`{name}.normal` takes mean and stdev, and optionally min and max; "
                             f"got keys {', '.join(map(str, spec)) or 'none'}")
        mean, stdev = _number(spec["mean"], f"`{name}.normal.mean`"), _number(spec["stdev"], f"`{name}.normal.stdev`")
        low = _length(spec.get("min", 1), f"`{name}.normal.min`")
        high = _length(spec.get("max", MAX_LENGTH), f"`{name}.normal.max`")
        if low > high:
            raise ValueError(f"`{name}.normal` needs min <= max; got min {low}, max {high}")
        return Distribution("normal", low, high, mean=mean, stdev=stdev)
    raise ValueError(f"`{name}` must be {_DIST_ALLOWED}; got the key {kind!r}")


# ------------------------------------------------------------------------- shared prefixes


def prefix_share(value: Any, what: str) -> float:
    """A prefix share: a number from 0 to below 1, or a percentage such as ``'50%'``."""
    number: Any = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1]) / 100
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) \
            or not 0 <= number < 1:
        raise ValueError(f"`{what}` must be the shared share of each prompt's tokens: a number from 0 to "
                         f"below 1, or a percentage such as '50%' (0%: nothing shared); got {value!r}")
    return float(number)


def mean_length(dist: Distribution) -> float:
    """The mean a distribution draws (a clamped normal's mean is taken as written, clamped)."""
    if dist.kind == "fixed":
        return float(dist.low)
    return min(float(dist.high), max(float(dist.low), dist.mean))


def shared_system(tokens: int, seed: int) -> str:
    """The shared system prompt of ``tokens`` tokens for ``seed``: the same on every machine,
    and drawn from its own generator, so it shares no words by design with the unique parts."""
    return text_of_length(tokens, random.Random(f"gpubench-shared-prefix-{seed}"))


# ------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class SyntheticPrompt:
    """One generated prompt: its text, the length it was made for, its output length (or None)."""

    text: str
    input_tokens: int
    max_tokens: int | None
    system: str | None = None  # the shared system prompt (``shared_prefix``), part of ``input_tokens``


@dataclass(frozen=True)
class SyntheticSpec:
    """``prompts: {synthetic: ...}`` validated: the distributions, how many prompts, the seed."""

    input_tokens: Distribution
    output_tokens: Distribution | None
    count: int
    seed: int
    shared_prefix: float = 0.0

    def describe(self) -> str:
        """The spec in one stable line, for reports and the workload fingerprint."""
        output = self.output_tokens.describe() if self.output_tokens else "workload"
        prefix = f" shared_prefix {self.shared_prefix:g}" if self.shared_prefix else ""
        return (f"synthetic input {self.input_tokens.describe()} output {output} count {self.count} "
                f"seed {self.seed}{prefix}")

    @property
    def system_tokens(self) -> int:
        """Tokens of the shared system prompt: ``shared_prefix`` of the mean input length (0: none)."""
        return round(self.shared_prefix * mean_length(self.input_tokens)) if self.shared_prefix else 0

    def prompts(self) -> list[SyntheticPrompt]:
        """The prompts, the same for the same spec on any machine.

        Input lengths, output lengths and texts come from three generators derived from
        the seed, so adding ``output_tokens`` leaves the input lengths and texts as they were.
        With ``shared_prefix``, each prompt is the shared system prompt (:attr:`system_tokens`)
        and a unique part of the rest of its drawn length (at least one token).
        """
        shared = self.system_tokens
        system = shared_system(shared, self.seed) if shared else None
        lengths = random.Random(f"gpubench-synthetic-input-{self.seed}")
        outputs = random.Random(f"gpubench-synthetic-output-{self.seed}")
        words = random.Random(f"gpubench-synthetic-text-{self.seed}")
        out = []
        for _ in range(self.count):
            tokens = self.input_tokens.draw(lengths)
            max_tokens = self.output_tokens.draw(outputs) if self.output_tokens else None
            out.append(SyntheticPrompt(text_of_length(max(1, tokens - shared), words), tokens, max_tokens, system))
        return out


_SYNTHETIC_KEYS = ("input_tokens", "output_tokens", "count", "seed", "shared_prefix")


def synthetic_spec(value: Any) -> SyntheticSpec:
    """``synthetic:``'s mapping -> :class:`SyntheticSpec`; ValueError says what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"`synthetic` must be a mapping with {', '.join(_SYNTHETIC_KEYS)}; got {value!r}")
    unknown = [str(k) for k in value if k not in _SYNTHETIC_KEYS]
    if unknown:
        raise ValueError(f"`synthetic` has an unknown key {unknown[0]!r}; allowed: {', '.join(_SYNTHETIC_KEYS)}")
    if "input_tokens" not in value:
        raise ValueError("`synthetic.input_tokens` is required: " + _DIST_ALLOWED)
    count = value.get("count", 100)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"`synthetic.count` must be a whole number from 1 to {MAX_COUNT}; got {count!r}")
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"`synthetic.seed` must be a whole number; got {seed!r}")
    output = value.get("output_tokens")
    return SyntheticSpec(
        input_tokens=distribution(value["input_tokens"], "synthetic.input_tokens"),
        output_tokens=None if output is None else distribution(output, "synthetic.output_tokens"),
        count=count,
        seed=seed,
        shared_prefix=prefix_share(value.get("shared_prefix", 0), "synthetic.shared_prefix"),
    )
