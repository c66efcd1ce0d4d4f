"""A matrix's ``workload:``: what each cell's benchmark does, and its prompts.

:class:`Workload` is the file's workload (and, narrowed to one load point, a
cell's); :class:`WorkloadOverride` a row's. ``concurrency`` and ``rate`` are load
axes: each value becomes its own cell, and a rate cell has no concurrency axis.

A prompt is its text, optionally with the answers that count as correct
(``expect``: any one substring, case-insensitive, as the GPU Shopper benchmark
script checks them) and its own output length (``max_tokens``). ``prompts`` is a
list of plain strings and ``{prompt, expect, max_tokens}`` mappings, the name of a
built-in set: ``seed`` (seed 000's mix, the default) or ``quality`` (prompts with
known answers, for the match rate), a dataset file (``{dataset: PATH, ...}``,
``datasets.py``) or synthetic prompts (``{synthetic: {...}}``, ``synthetic.py``).
``rate: sweep`` and ``concurrency: sweep`` and their ``sweep:`` settings (:class:`SweepSpec`)
come first: the workload's fields name them. docs/workloads.md is the users' reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo, field_validator, model_validator
from pydantic_core import core_schema

from .fields import (
    MAX_CONCURRENCY,
    MAX_RATE,
    CheckpointEvery,
    Concurrency,
    MaxTokens,
    Rate,
    Runs,
    RunsField,
    Seconds,
    StrictModel,
    Warmup,
    _axis,
    axis_text,
    did_you_mean,
    fraction,
    invalid,
    number_text,
    whole,
)
from .conversations import Conversation, conversation_spec
from .accuracy import AccuracySpec
from .datasets import PromptSource, load_dataset
from .synthetic import MAX_LENGTH, synthetic_spec
from .trace import Trace
from .yaml_errors import describe


# --------------------------------------------------------------------------------------------------
# ``rate: sweep`` and its ``sweep:`` settings: the saturation sweep of one cell.
#
# A sweep cell looks for the highest request rate whose goodput (docs/metrics.md,
# ``goodput_share``) still meets a goal under the cell's ``slo:``. How it searches
# is ``measure/saturation.py``; here is only what a matrix may write
# (docs/workloads.md, "Saturation sweep"):
#
# .. code-block:: yaml
#
#     workload:
#       rate: sweep
#       sweep: {min_rate: 0.5, max_rate: 8, steps: 8, precision: 5%, goal: goodput_share >= 0.95, duration: 60s}
#     slo: {ttft_ms: 500, tpot_ms: 50}


#: ``rate: sweep`` / ``concurrency: sweep``: the value of the load axis that asks for a sweep on one session.
SWEEP = "sweep"
DEFAULT_GOAL = 0.95
DEFAULT_PRECISION = 0.05
DEFAULT_STEPS = 8
DEFAULT_PROBE_CONCURRENCY = 32
#: Without ``min_rate``, the search starts this many times below the top rate.
DEFAULT_SPAN = 10.0
#: ``concurrency: sweep``: the doubling stops at this concurrency unless ``max_concurrency`` says otherwise.
#: Also the server's default batch limit then, so not higher: Ollama reserves a KV cache per parallel
#: slot at load (a 7B model's 256 slots need about 56 GiB beside its weights), and 64 is where
#: single-GPU frontiers (InferenceX's usual range) end; vLLM or SGLang on a large GPU may go higher.
DEFAULT_MAX_CONCURRENCY = 64
#: ``concurrency: sweep``: saturated once doubling the concurrency raises output throughput by less than this.
DEFAULT_MIN_GROWTH = 0.05
#: The ``sweep:`` keys each kind of sweep reads (``goal`` and ``duration`` are both's).
RATE_SWEEP_KEYS = ("min_rate", "max_rate", "steps", "precision", "probe_concurrency")
CONCURRENCY_SWEEP_KEYS = ("concurrency", "max_concurrency", "min_growth")

_GOAL_RE = re.compile(r"\s*goodput_share\s*>=\s*(?P<value>\S+)\s*")


def _rate_bound(value: Any) -> float | None:
    if value is None:
        return None
    allowed = f"must be a number of requests per second, more than 0 and at most {MAX_RATE:g} (or null)"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_RATE
    if not ok:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def _goal(value: Any) -> float:
    allowed = ("must be the goodput_share a rate must reach: a fraction above 0 and at most 1, a percentage "
               "such as '95%', or 'goodput_share >= 0.95'")
    if isinstance(value, str):
        found = _GOAL_RE.fullmatch(value)
        if found:
            text = found["value"]
            try:
                value = text if text.endswith("%") else float(text)
            except ValueError:
                raise invalid(f"{allowed}; got {describe(value)}") from None
    return fraction(value, allowed, above_zero=True)


def _precision(value: Any) -> float:
    number = fraction(value, "must be the relative precision of the answer: a fraction above 0 and below 1, "
                             "or a percentage such as '5%'", above_zero=True)
    if number >= 1:
        raise invalid(f"must be below 1 (100%): the search stops once its bracket is that close; got "
                      f"{describe(value)}")
    return number


def _min_growth(value: Any) -> float:
    number = fraction(value, "must be the output-throughput growth below which a doubling counts as saturated: "
                             "a fraction from 0 to below 1, or a percentage such as '5%'")
    if number >= 1:
        raise invalid(f"must be below 1 (100%): doubling the concurrency rarely doubles throughput; got "
                      f"{describe(value)}")
    return number


def _levels(value: Any) -> tuple[int, ...] | None:
    """``sweep.concurrency``: the levels of a ``concurrency: sweep`` given as a list, run lowest first."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < 2:
        raise invalid(f"must be a list of at least two concurrency levels, such as [1, 4, 16, 64], each a whole "
                      f"number from 1 to {MAX_CONCURRENCY} (one level is a plain `concurrency: N` cell); "
                      f"got {describe(value)}")
    allowed = f"must be a list of concurrency levels such as [1, 4, 16, 64], each from 1 to {MAX_CONCURRENCY}"
    return tuple(sorted(_axis(value, allowed, _level)))


def _level(item: Any) -> int | None:
    return item if isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= MAX_CONCURRENCY else None


RateBound = Annotated[float | None, BeforeValidator(_rate_bound)]
Goal = Annotated[float, BeforeValidator(_goal)]
Precision = Annotated[float, BeforeValidator(_precision)]
MinGrowth = Annotated[float, BeforeValidator(_min_growth)]
Levels = Annotated[tuple[int, ...] | None, BeforeValidator(_levels)]


class SweepSpec(StrictModel):
    """``workload.sweep``: the bounds, stopping rules and goal of a ``rate: sweep`` or a
    ``concurrency: sweep`` cell.

    Rate sweep: ``max_rate`` None: a throughput probe (``probe_concurrency`` requests in
    flight) bounds the rate from above; ``min_rate`` None: ``max_rate / 10``. The search
    stops after ``steps`` rate steps or once the passing and failing rates are within
    ``precision`` of each other.

    Concurrency sweep: the concurrency doubles from 1 until a doubling raises output
    throughput by less than ``min_growth`` (saturated), goodput_share under the ``slo:``
    falls below ``goal``, or ``max_concurrency`` (None: 64) has run; ``concurrency``
    (a list of levels) runs exactly those levels instead. Keys of the other kind of sweep
    are refused (:func:`sweep_problem`). ``duration`` None: each step runs the workload's
    ``duration``.
    """

    min_rate: RateBound = None
    max_rate: RateBound = None
    steps: Annotated[int, whole(1, 50)] = DEFAULT_STEPS
    precision: Precision = DEFAULT_PRECISION
    goal: Goal = DEFAULT_GOAL
    duration: Seconds | None = None
    probe_concurrency: Annotated[int, whole(1, MAX_CONCURRENCY)] = DEFAULT_PROBE_CONCURRENCY
    #: ``concurrency: sweep``'s own keys (CONCURRENCY_SWEEP_KEYS).
    concurrency: Levels = None
    max_concurrency: Annotated[int, whole(2, MAX_CONCURRENCY)] | None = None
    min_growth: MinGrowth = DEFAULT_MIN_GROWTH

    @model_validator(mode="after")
    def _ordered(self) -> SweepSpec:
        if self.min_rate is not None and self.max_rate is not None and self.min_rate >= self.max_rate:
            raise invalid(f"min_rate ({number_text(self.min_rate)}/s) must be below max_rate "
                          f"({number_text(self.max_rate)}/s): the sweep searches between them")
        if self.concurrency is not None:
            extra = [key for key in ("max_concurrency", "min_growth") if key in self.model_fields_set]
            if extra:
                raise invalid(f"`{extra[0]}` applies to the doubling sweep; with a list of levels "
                              f"(`concurrency: {axis_text(self.concurrency)}`) every level runs: drop one of them")
        return self

    @property
    def top_concurrency(self) -> int:
        """The highest concurrency a ``concurrency: sweep`` may reach: its last level, or its cap."""
        if self.concurrency is not None:
            return self.concurrency[-1]
        return self.max_concurrency or DEFAULT_MAX_CONCURRENCY

    @property
    def max_concurrency_steps(self) -> int:
        """The most steps a ``concurrency: sweep`` may take: its levels, or 1, 2, 4 ... up to the cap."""
        if self.concurrency is not None:
            return len(self.concurrency)
        return len(doubling_levels(self.top_concurrency))

    @property
    def goal_text(self) -> str:
        """``goodput_share >= 0.95``: the goal as the docs and reports write it."""
        return f"goodput_share >= {self.goal:g}"


def doubling_levels(top: int) -> tuple[int, ...]:
    """1, 2, 4 ... below ``top``, then ``top`` itself: a doubling ``concurrency: sweep``'s levels."""
    levels, level = [], 1
    while level < top:
        levels.append(level)
        level *= 2
    return (*levels, top)


def sweep_problem(rate: Any, sweep: SweepSpec | None, slo_set: bool, repeated: bool = False,
                  concurrency: Any = None) -> str | None:
    """Why a (merged) workload's ``rate``, ``concurrency`` and ``sweep`` cannot run with this SLO
    (and ``runs:`` other than one when ``repeated``), or None."""
    if rate == SWEEP and not slo_set:
        return ("`rate: sweep` needs an `slo:` (ttft_ms, tpot_ms or e2e_ms): the sweep finds the highest "
                "rate whose goodput_share under that SLO meets its goal")
    kind = "rate" if rate == SWEEP else "concurrency" if concurrency == SWEEP else None
    if kind is not None and repeated:
        return (f"`runs:` does not apply to `{kind}: sweep`: each step of the sweep is one run; "
                "drop `runs:`" + (" or use `sweep.steps`" if kind == "rate" else ""))
    if sweep is not None and kind is None:
        return ("`sweep:` settings apply only with `rate: sweep` or `concurrency: sweep`; set one of them "
                "or drop `sweep:`")
    if sweep is not None:
        foreign, own = ((CONCURRENCY_SWEEP_KEYS, RATE_SWEEP_KEYS) if kind == "rate"
                        else (RATE_SWEEP_KEYS, CONCURRENCY_SWEEP_KEYS))
        given = [key for key in foreign if key in sweep.model_fields_set]
        if given:
            return (f"`sweep.{given[0]}` does not apply to `{kind}: sweep`; its keys are "
                    f"{', '.join((*own, 'goal', 'duration'))}")
        if kind == "concurrency" and "goal" in sweep.model_fields_set and not slo_set:
            return ("`sweep.goal` needs an `slo:` (ttft_ms, tpot_ms or e2e_ms): a concurrency sweep stops "
                    "when goodput_share under that SLO falls below the goal")
    return None


class Prompt(str):
    """A prompt: it *is* its text (a ``str``), and carries ``expect``, the answers that count,
    and ``max_tokens``, its own output length (None: the workload's).

    Being a string keeps code that sends ``list(workload.prompts)`` as JSON working
    (it sends the texts); :meth:`payload` is what tells the load generator the
    expectations too. Immutable; a plain string equals the Prompt with the same
    text and no ``expect``.
    """

    expect: tuple[str, ...]
    max_tokens: int | None

    def __new__(cls, text: str, expect: Iterable[str] = (), max_tokens: int | None = None) -> Prompt:
        self = super().__new__(cls, text)
        self.__dict__["expect"] = tuple(expect)
        self.__dict__["max_tokens"] = max_tokens
        return self

    @property
    def text(self) -> str:
        return str.__str__(self)

    def payload(self) -> str | dict[str, Any]:
        """The load generator's form: the text, or ``{"prompt": text, "expect": [...], "max_tokens": N}``
        (each key only when set)."""
        if not self.expect and self.max_tokens is None:
            return self.text
        entry: dict[str, Any] = {"prompt": self.text}
        if self.expect:
            entry["expect"] = list(self.expect)
        if self.max_tokens is not None:
            entry["max_tokens"] = self.max_tokens
        return entry

    def matches(self, answer: str) -> bool | None:
        """Whether ``answer`` contains any expected substring (case-insensitive); None without ``expect``."""
        if not self.expect:
            return None
        folded = answer.casefold()
        return any(e.casefold() in folded for e in self.expect)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Prompt is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a Prompt is immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Prompt):
            return str.__eq__(self, other) and self.expect == other.expect and self.max_tokens == other.max_tokens
        if isinstance(other, str):
            return not self.expect and self.max_tokens is None and str.__eq__(self, other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __repr__(self) -> str:
        extra = (f", expect={self.expect!r}" if self.expect else "") + \
            (f", max_tokens={self.max_tokens}" if self.max_tokens is not None else "")
        return f"Prompt({self.text!r}{extra})"

    def __reduce__(self) -> tuple[Any, ...]:
        return Prompt, (self.text, self.expect, self.max_tokens)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        as_written = core_schema.union_schema([
            core_schema.str_schema(),
            core_schema.typed_dict_schema({
                "prompt": core_schema.typed_dict_field(core_schema.str_schema()),
                "expect": core_schema.typed_dict_field(
                    core_schema.list_schema(core_schema.str_schema()), required=False),
                "max_tokens": core_schema.typed_dict_field(core_schema.int_schema(), required=False),
            }),
        ])
        return core_schema.no_info_plain_validator_function(
            prompt_entry,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda p: p.payload()),
            json_schema_input_schema=as_written,
        )


class ChatPrompt(Prompt):
    """A prompt with a ``system`` prompt sent before it (a shared prefix) and/or the ``turns`` of
    a conversation that follow it (``matrix/conversations.py``): text, cap and think time of
    each later user turn. The load generator sends turn *k* with the whole history.

    Its payload adds ``"system"`` and ``"turns": [{"prompt", "max_tokens"?, "think_s"}, ...]``.
    """

    system: str | None
    turns: tuple[tuple[str, int | None, float], ...]

    def __new__(cls, text: str, max_tokens: int | None = None, system: str | None = None,
                turns: Iterable[tuple[str, int | None, float]] = ()) -> ChatPrompt:
        self = super().__new__(cls, text, (), max_tokens)
        self.__dict__["system"] = system
        self.__dict__["turns"] = tuple(turns)
        return self

    @classmethod
    def of(cls, conversation: Conversation) -> ChatPrompt:
        """The prompt of a whole conversation: its first turn, the rest in ``turns``."""
        first, *rest = conversation.turns
        return cls(first.text, first.max_tokens, conversation.system,
                   tuple((t.text, t.max_tokens, t.think_s) for t in rest))

    def payload(self) -> str | dict[str, Any]:
        entry = super().payload()
        entry = {"prompt": entry} if isinstance(entry, str) else entry
        if self.system is not None:
            entry["system"] = self.system
        if self.turns:
            entry["turns"] = [{"prompt": text, "think_s": think, **({"max_tokens": cap} if cap is not None else {})}
                              for text, cap, think in self.turns]
        return entry

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ChatPrompt):
            return self.payload() == other.payload()
        return False if isinstance(other, str) else NotImplemented

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __repr__(self) -> str:
        return f"ChatPrompt({self.text!r}, system={self.system!r}, turns={len(self.turns)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return ChatPrompt, (self.text, self.max_tokens, self.system, self.turns)


SEED_PROMPTS: tuple[str, ...] = (
    "Write a Python function to implement binary search on a sorted list.",
    "Explain quantum computing in simple terms for a 10-year-old.",
    "What are the key differences between REST and GraphQL APIs?",
    "Write a haiku about programming.",
    "Debug this code: for i in range(10): print(i",
    "Explain the CAP theorem and its implications for distributed systems.",
    "Write a regex pattern to match valid email addresses.",
    "What is the time complexity of quicksort and why?",
    "Describe three design patterns used in object-oriented programming.",
    "How does garbage collection work in modern programming languages?",
)
"""Seed 000's prompt mix, in its order: the default ``workload.prompts`` (``prompts: seed``)."""

QUALITY_PROMPTS: tuple[Prompt, ...] = (
    Prompt("What is 15 + 27? Answer with just the number.", expect=("42",)),
    Prompt("Write a Python function that returns the square of a number.", expect=("def", "return")),
    Prompt("What is the capital of France? Answer in one word.", expect=("Paris",)),
    Prompt("Write a haiku about programming."),
    Prompt("List 3 primary colors, separated by commas.", expect=("red", "blue")),
)
"""``prompts: quality``: the GPU Shopper benchmark script's quality prompts and expectations
(``scripts/gpu-benchmark.sh``: arithmetic, code, a capital city, a haiku, an instruction)."""

PROMPT_SETS: Mapping[str, tuple[Prompt, ...]] = {
    "seed": tuple(Prompt(p) for p in SEED_PROMPTS),
    "quality": QUALITY_PROMPTS,
}
"""The built-in prompt sets a workload may name."""

_ALLOWED = (
    "must be a non-empty list of non-empty strings or {prompt: ..., expect: [...], max_tokens: N} mappings, "
    f"the name of a built-in set ({', '.join(PROMPT_SETS)}), {{dataset: PATH}}, {{synthetic: {{...}}}} "
    "or {conversations: {...}}"
)


class PromptList(tuple):
    """A workload's prompts (a tuple of :class:`Prompt`) and ``source``: where a dataset's or a
    synthetic spec's prompts came from (None for written ones and the built-in sets).

    The source travels with the prompts through ``model_copy``; a dump has only the
    payloads (so :func:`~pytest_gpubench.matrix.adjust.with_workload` hands a hook's
    workload its prompts as they are).
    """

    source: PromptSource | None

    def __new__(cls, items: Iterable[Prompt] = (), source: PromptSource | None = None) -> PromptList:
        self = super().__new__(cls, items)
        self.source = source
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return PromptList, (tuple(self), self.source)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validated_prompts,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value, info: tuple(p.payload() for p in value) if info.mode == "python"
                else [p.payload() for p in value], info_arg=True),
            json_schema_input_schema=core_schema.union_schema([
                core_schema.str_schema(),
                core_schema.list_schema(handler.generate_schema(Prompt)),
                core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()),
            ]),
        )


def _validated_prompts(value: Any, info: ValidationInfo) -> PromptList:
    # The matrix passes its folder as context: a dataset's path is relative to the matrix file.
    context = info.context if isinstance(info.context, Mapping) else {}
    return prompts(value, base_dir=Path(context.get("base_dir") or "."))


def prompt_set_name(prompts: tuple[Prompt, ...]) -> str | None:
    """``"seed"`` or ``"quality"`` if ``prompts`` is that built-in set, else None."""
    return next((name for name, known in PROMPT_SETS.items() if prompts == known), None)


def prompts(value: Any, base_dir: Path = Path(".")) -> PromptList:
    """``workload.prompts`` as written -> a :class:`PromptList` (a tuple of :class:`Prompt`)."""
    if isinstance(value, PromptList):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in PROMPT_SETS:
            return PromptList(PROMPT_SETS[name])
        raise invalid(
            f"unknown prompt set {value!r}{did_you_mean(name, PROMPT_SETS)}; built-in sets: "
            f"{', '.join(PROMPT_SETS)}; a single prompt is still a list: [\"...\"]"
        )
    if isinstance(value, Mapping):
        return generated_prompts(value, base_dir)
    if not isinstance(value, (list, tuple)) or not value:
        raise invalid(f"{_ALLOWED}; got {describe(value)}")
    out = []
    for i, entry in enumerate(value):
        try:
            out.append(prompt_entry(entry))
        except ValueError as exc:
            raise invalid(f"{_ALLOWED}; item {i}: {exc}") from None
    return PromptList(out)


def generated_prompts(value: Mapping[str, Any], base_dir: Path) -> PromptList:
    """``{dataset: PATH, ...}``, ``{synthetic: {...}}`` or ``{conversations: {...}}`` -> the prompts,
    with their source."""
    try:
        if "dataset" in value:
            found, source = load_dataset(value, base_dir)
            return PromptList((Prompt(p.text, max_tokens=p.max_tokens) if p.conversation is None
                               else ChatPrompt.of(p.conversation) for p in found), source)
        if "conversations" in value:
            if len(value) != 1:
                extra = next(str(k) for k in value if k != "conversations")
                raise ValueError(f"`conversations` goes alone; {extra!r} belongs inside it "
                                 "(turns, input_tokens, output_tokens, think_time, count, seed)")
            conversations = conversation_spec(value["conversations"])
            label = (f"conversations ({conversations.count}, turns {conversations.turns.describe()}, "
                     f"input {conversations.input_tokens.describe()} tokens per turn)")
            return PromptList((ChatPrompt.of(c) for c in conversations.conversations()),
                              PromptSource(label, conversations.describe()))
        if "synthetic" in value:
            if len(value) != 1:
                extra = next(str(k) for k in value if k != "synthetic")
                raise ValueError(f"`synthetic` goes alone; {extra!r} belongs inside it "
                                 "(input_tokens, output_tokens, count, seed)")
            spec = synthetic_spec(value["synthetic"])
            made = spec.prompts()
            shared = f", shared prefix {spec.shared_prefix:.0%}" if spec.shared_prefix else ""
            label = f"synthetic ({spec.count} prompts, input {spec.input_tokens.describe()} tokens{shared})"
            return PromptList((Prompt(p.text, max_tokens=p.max_tokens) if p.system is None
                               else ChatPrompt(p.text, p.max_tokens, p.system) for p in made),
                              PromptSource(label, spec.describe()))
    except ValueError as exc:
        raise invalid(str(exc)) from None
    keys = ", ".join(map(str, value)) or "none"
    raise invalid(f"a prompts mapping needs `dataset: PATH`, `synthetic: {{...}}` or `conversations: {{...}}`; "
                  f"got keys {keys}"
                  f"{did_you_mean(next(iter(map(str, value)), ''), ('dataset', 'synthetic', 'conversations'))}")


_ENTRY_KEYS = ("prompt", "expect", "max_tokens")


def prompt_entry(entry: Any) -> Prompt:
    """One list item: a string, or ``{prompt: TEXT, expect: [SUBSTRING, ...], max_tokens: N}``."""
    if isinstance(entry, Prompt):
        return entry
    if isinstance(entry, str):
        if not entry.strip():
            raise ValueError(f"is {describe(entry)}")
        return Prompt(entry)
    if not isinstance(entry, Mapping):
        raise ValueError(f"is {describe(entry)}")
    unknown = [str(k) for k in entry if k not in _ENTRY_KEYS]
    if unknown:
        hint = did_you_mean(unknown[0], _ENTRY_KEYS)
        raise ValueError(f"unknown key {unknown[0]!r}{hint}; allowed keys: {', '.join(_ENTRY_KEYS)}")
    text = entry.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"`prompt` must be a non-empty string; got {describe(text)}")
    expect = entry.get("expect", [])
    expect = [expect] if isinstance(expect, str) else expect
    allowed = "`expect` must be a non-empty string or a non-empty list of them, such as ['4', 'four']"
    if not isinstance(expect, (list, tuple)) or ("expect" in entry and not expect):
        raise ValueError(f"{allowed}; got {describe(entry.get('expect'))}")
    for answer in expect:
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{allowed}; got {describe(answer)} in it")
    max_tokens = entry.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or not 1 <= max_tokens <= MAX_LENGTH):
        raise ValueError(f"`max_tokens` must be a whole number from 1 to {MAX_LENGTH}; got {describe(max_tokens)}")
    return Prompt(text, expect, max_tokens)


Prompts = PromptList


def think_value(value: Any) -> bool | None:
    """``workload.think``: exactly ``true`` or ``false`` (``null``: the runtime's default)."""
    if value is None or isinstance(value, bool):
        return value
    raise invalid(f"must be true or false (leave it out for the runtime's default: a thinking model "
                  f"such as deepseek-r1 or qwen3 then thinks); got {describe(value)}")


Think = Annotated[bool | None, BeforeValidator(think_value)]


def ignore_eos_value(value: Any) -> bool:
    """``workload.ignore_eos``: exactly ``true`` or ``false``."""
    if isinstance(value, bool):
        return value
    raise invalid("must be true or false (true: every answer runs to its max_tokens, as the peers' "
                  f"--ignore-eos does, on runtimes that support it); got {describe(value)}")


IgnoreEos = Annotated[bool, BeforeValidator(ignore_eos_value)]


# -------------------------------------------------------------------------- workload


class Workload(StrictModel):
    """What one cell's benchmark does; the defaults are seed 000's.

    In the file, ``concurrency`` and ``rate`` are axes (each value its own cell);
    a cell's workload holds just its own value, which is also ``cell.concurrency``
    and ``cell.rate``.
    """

    duration: Seconds = 300.0
    max_tokens: MaxTokens = 256
    warmup_requests: Warmup = 1
    progress_interval: Seconds = 60.0
    checkpoint_every: CheckpointEvery = 10
    prompts: Prompts = PromptList(PROMPT_SETS["seed"])
    concurrency: Concurrency = (1,)
    rate: Rate = None
    #: ``rate: sweep``'s and ``concurrency: sweep``'s settings (above); None with a sweep: the defaults.
    sweep: SweepSpec | None = None
    runs: RunsField = Runs()
    telemetry_interval: Seconds = 5.0
    #: Seconds without a token before a request is aborted as stalled (an error).
    stall_timeout: Seconds = 120.0
    #: Ollama's ``think``: None sends nothing, so the runtime's default applies.
    think: Think = None
    #: Ask the server to ignore end-of-sequence, so each answer runs to its ``max_tokens``.
    ignore_eos: IgnoreEos = False
    #: Trace replay (``matrix/trace.py``): the trace's requests at its own times; None: no trace.
    trace: Trace | None = None
    #: Problems with exact answers asked after the load (``accuracy.py``); None: no accuracy pass.
    accuracy: AccuracySpec | None = None

    @model_validator(mode="after")
    def _one_load_axis(self) -> Workload:
        conflict = load_conflict(self.concurrency, self.rate) or trace_conflict(self.trace, self.concurrency, self.rate)
        if self.trace is not None and "prompts" in self.model_fields_set:
            conflict = "`prompts:` and `trace:` cannot be combined: a trace's records are its prompts"
        if conflict:
            raise invalid(conflict)
        if self.rate is not None and any(getattr(p, "turns", ()) for p in self.prompts):
            raise invalid("`rate:` does not apply to conversations: they run as a closed loop, `concurrency` "
                          "conversations in flight, each turn due `think_time` after the answer; "
                          "use `concurrency:` instead")
        return self

    @property
    def sweep_spec(self) -> SweepSpec | None:
        """The sweep this workload asks for (``rate: sweep`` or ``concurrency: sweep``), or None."""
        return (self.sweep or SweepSpec()) if self.sweep_kind is not None else None

    @property
    def sweep_kind(self) -> str | None:
        """``"rate"`` for ``rate: sweep``, ``"concurrency"`` for ``concurrency: sweep``, else None."""
        return "rate" if self.rate == SWEEP else "concurrency" if self.concurrency == SWEEP else None

    @property
    def duration_minutes(self) -> float:
        """The duration as BenchmarkResult's ``test_config.duration_minutes``."""
        return self.duration / 60

    @property
    def prompt_set(self) -> str | None:
        """``"seed"`` or ``"quality"`` when the prompts are that built-in set, else None (a trace sends its own)."""
        return None if self.trace is not None else prompt_set_name(self.prompts)

    @property
    def prompt_source(self) -> PromptSource | None:
        """Where a dataset's, synthetic spec's or trace's prompts came from; None for written and built-in ones."""
        if self.trace is not None:
            return self.trace.source
        return getattr(self.prompts, "source", None)

    @property
    def prompts_label(self) -> str:
        """The prompts as reports name them: ``seed``, ``quality``, ``custom``, or the dataset's, spec's or trace's label."""
        source = self.prompt_source
        return self.prompt_set or (source.label if source else "custom")

    @property
    def has_expectations(self) -> bool:
        """True if any prompt has ``expect`` answers (so a match rate can be measured); a trace's have none."""
        return self.trace is None and any(p.expect for p in self.prompts)

    def prompt_payload(self) -> list[str | dict[str, Any]]:
        """The prompts as the load generator takes them: strings, and ``{"prompt", "expect",
        "max_tokens", "ignore_eos"}`` mappings with only the keys that are set; a trace's requests in
        its order (``{"prompt", "max_tokens", "messages"}``), request *i* sent at its schedule's *i*-th time."""
        if self.trace is not None:
            return [r.payload(self.ignore_eos) for r in self.trace.requests]
        if not self.ignore_eos:
            return [p.payload() for p in self.prompts]
        entries = [p.payload() for p in self.prompts]
        return [{"prompt": e, "ignore_eos": True} if isinstance(e, str) else {**e, "ignore_eos": True}
                for e in entries]


class WorkloadOverride(StrictModel):
    """A row's ``workload:``: only the keys it sets replace the file's."""

    duration: Seconds | None = None
    max_tokens: MaxTokens | None = None
    warmup_requests: Warmup | None = None
    progress_interval: Seconds | None = None
    checkpoint_every: CheckpointEvery | None = None
    prompts: Prompts | None = None
    concurrency: Concurrency | None = None
    rate: Rate = None
    sweep: SweepSpec | None = None
    runs: RunsField | None = None
    telemetry_interval: Seconds | None = None
    stall_timeout: Seconds | None = None
    think: Think = None
    ignore_eos: IgnoreEos | None = None
    trace: Trace | None = None
    accuracy: AccuracySpec | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: Any, info: ValidationInfo) -> Any:
        # `rate: null` drops the file's rate, `sweep: null` its sweep settings, `think: null` its
        # think (the runtime's default again), `trace: null` its trace, `accuracy: null` its accuracy pass.
        if value is None and info.field_name not in ("rate", "sweep", "think", "trace", "accuracy"):
            raise invalid("must not be null; leave the key out to use the file's value")
        return value

    @model_validator(mode="after")
    def _one_load_axis(self) -> WorkloadOverride:
        conflict = (self.concurrency and load_conflict(self.concurrency, self.rate)) or \
            trace_conflict(self.trace, self.concurrency or (1,), self.rate)
        if conflict:
            raise invalid(conflict)
        return self


def load_conflict(concurrency: tuple[int, ...] | str, rate: tuple[float, ...] | str | None) -> str | None:
    """Why these load axes cannot go together, or None: a rate cell has no concurrency axis."""
    if rate is None or concurrency == (1,):
        return None
    return (f"`concurrency: {axis_text(concurrency)}` and `rate: {axis_text(rate)}` cannot be "
            "combined: a rate cell sends requests as Poisson arrivals at that rate, however many "
            "are in flight; give one of them (only `concurrency: 1` may go with a rate)")


def trace_conflict(trace: Trace | None, concurrency: tuple[int, ...], rate: Any) -> str | None:
    """Why a trace cannot go with these load axes, or None: a trace's times are its load."""
    if trace is None or (rate is None and concurrency == (1,)):
        return None
    axis = f"concurrency: {axis_text(concurrency)}" if rate is None else f"rate: {axis_text(rate)}"
    return (f"`trace:` and `{axis}` cannot be combined: a trace replays its requests at its own times "
            "(open loop), which is its load; drop the load axis, or use the trace's `speedup:`")
