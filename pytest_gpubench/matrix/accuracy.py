"""Accuracy beside speed: problems with exact answers, asked after a cell's load (issue 23 item 5).

``workload.accuracy`` (off by default) names the problems:

* ``builtin``: :data:`BUILTIN_COUNT` arithmetic word problems made here from a fixed
  seed (no download; the same text and answers on every machine), or ``{builtin: N}``
  for the first N of them;
* ``{dataset: FILE}``: JSONL (or a JSON list) of ``{"prompt": TEXT, "answer": N}``
  records, the path relative to the matrix file, ``N`` a whole number (a JSON integer
  or a string of one). A record that cannot be used is an error naming the file, the
  line and the field, as ``datasets.py``'s are.

Every built-in problem ends with :data:`INSTRUCTION`: the reply's last line is
``Answer: N``. The score is exact: the reply's final answer (the number after its last
``Answer:``, ``answer is`` or ``####`` marker, else its last number:
``remote/loadgen.py`` ``final_answer``) equals the problem's answer, or it does not.
The problems go to the same endpoint after the measured runs, each once, and their
requests are no measured request (``run/cell_benchmark.py``); docs/workloads.md,
"Accuracy", is the users' reference, docs/metrics.md defines ``accuracy``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationInfo
from pydantic_core import core_schema

from .datasets import _records, _shown, read_data_file
from .fields import did_you_mean, invalid
from .yaml_errors import describe

#: How many problems ``accuracy: builtin`` asks; ``{builtin: N}`` takes the first N.
BUILTIN_COUNT = 50
#: The most problems one workload may ask (built-in or from a file).
MAX_PROBLEMS = 1000
#: What every built-in problem asks of the reply's form.
INSTRUCTION = "End your reply with a last line of the form `Answer: N`, N a whole number."

_SEED = "gpubench-accuracy-0"
_NAMES = ("Sam", "Maria", "Ken", "Aisha", "Lena", "Omar", "Priya", "Tom", "Yuki", "Ana")
_ITEMS = ("pens", "notebooks", "apples", "tickets", "candles", "stamps", "cups", "books")


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt's text and its exact whole-number answer."""

    text: str
    answer: int

    def payload(self) -> dict[str, Any]:
        """The load generator's form: ``{"prompt": text, "answer": "N"}`` (exact scoring)."""
        return {"prompt": self.text, "answer": str(self.answer)}


def _problem(kind: int, rng: random.Random) -> Problem:
    """One problem of template ``kind`` (0-4) with numbers drawn from ``rng``.

    The sandbox's stand-in reads these five shapes (``sandbox/ollama_common.py``
    ``solve_builtin``); a test keeps the two in step."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if kind == 0:
        price, count = rng.randint(2, 19), rng.randint(3, 40)
        text = (f"A shop sells {item} at {price} dollars each. {name} buys {count} {item}. "
                f"How many dollars does {name} pay?")
        return Problem(text, price * count)
    if kind == 1:
        have, bought = rng.randint(5, 90), rng.randint(2, 60)
        given = rng.randint(1, have + bought - 1)
        text = (f"{name} has {have} {item}. {name} buys {bought} more and then gives away {given}. "
                f"How many {item} does {name} have now?")
        return Problem(text, have + bought - given)
    if kind == 2:
        speed, hours = rng.randint(30, 120), rng.randint(2, 9)
        text = (f"A train travels {speed} kilometres each hour. "
                f"How many kilometres does it travel in {hours} hours?")
        return Problem(text, speed * hours)
    if kind == 3:
        teams, size = rng.randint(2, 12), rng.randint(3, 15)
        text = (f"{teams * size} students are split into {teams} teams of equal size. "
                "How many students are in each team?")
        return Problem(text, size)
    tank = rng.randint(200, 900)
    monday = rng.randint(10, tank // 3)
    tuesday = rng.randint(10, tank // 3)
    text = (f"A tank holds {tank} litres of water. {monday} litres are used on Monday and "
            f"{tuesday} litres on Tuesday. How many litres are left?")
    return Problem(text, tank - monday - tuesday)


def builtin_problems(count: int = BUILTIN_COUNT) -> tuple[Problem, ...]:
    """The first ``count`` built-in problems: the same on every machine and every call
    (``random.Random`` seeded from a fixed string), the five shapes in turn."""
    rng = random.Random(_SEED)
    return tuple(Problem(f"{p.text} {INSTRUCTION}", p.answer)
                 for p in (_problem(i % 5, rng) for i in range(count)))


def load_problems(raw_path: Any, base_dir: Path) -> tuple[tuple[Problem, ...], str]:
    """``accuracy: {dataset: FILE}``'s problems and the file's SHA-256 (16 hex digits).

    A problem is a ValueError naming the file, the line and the field."""
    if not isinstance(raw_path, str) or not raw_path.strip():
        raise ValueError(f"`accuracy.dataset` must be a file path (relative to the matrix file); "
                         f"got {describe(raw_path)}")
    path, text, digest = read_data_file(raw_path, base_dir, "accuracy dataset")
    try:
        records = _records(text, path)
    except ValueError as exc:
        raise ValueError(f"accuracy {exc}") from None
    problems = [_record_problem(record, f"accuracy dataset {path} line {line}") for line, record in records]
    if not problems:
        raise ValueError(f"accuracy dataset {path}: no problems in it")
    if len(problems) > MAX_PROBLEMS:
        raise ValueError(f"accuracy dataset {path}: {len(problems)} problems; at most {MAX_PROBLEMS} "
                         "are asked after a cell's load")
    return tuple(problems), digest


def _record_problem(record: Any, where: str) -> Problem:
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a record must be a JSON object {{\"prompt\": ..., \"answer\": ...}}; "
                         f"got {type(record).__name__}")
    for key in ("prompt", "answer"):
        if key not in record:
            raise ValueError(f"{where}: field `{key}` is missing (a record is {{\"prompt\": TEXT, \"answer\": N}})")
    prompt, answer = record["prompt"], record["answer"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: field `prompt` must be non-empty text; got {_shown(prompt)}")
    number = answer.strip() if isinstance(answer, str) else answer
    if isinstance(number, str) and re.fullmatch(r"-?[0-9]+", number):
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValueError(f"{where}: field `answer` must be a whole number (such as 42 or \"42\"); "
                         f"got {_shown(answer)}")
    return Problem(prompt, number)


class AccuracySpec:
    """``workload.accuracy`` validated: the problems and where they came from.

    ``source`` is ``builtin`` or ``dataset NAME (sha256:...)``. A Python dump gives the
    spec itself back (so a hook's workload validates again: a plain class, which pydantic
    hands back as it is where it would turn a dataclass into a dict), a JSON dump its
    source and size."""

    __slots__ = ("source", "problems")

    def __init__(self, source: str, problems: tuple[Problem, ...]) -> None:
        self.source, self.problems = source, tuple(problems)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AccuracySpec):
            return NotImplemented
        return (self.source, self.problems) == (other.source, other.problems)

    def __hash__(self) -> int:
        return hash((self.source, self.problems))

    def __repr__(self) -> str:
        return f"AccuracySpec({self.source!r}, {len(self.problems)} problems)"

    def payload(self) -> list[dict[str, Any]]:
        """The problems as the load generator takes them (exact answers)."""
        return [p.payload() for p in self.problems]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validated_accuracy,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda spec, info: spec if info.mode == "python" else {"source": spec.source,
                                                                       "problems": len(spec.problems)},
                info_arg=True),
            json_schema_input_schema=core_schema.union_schema([
                core_schema.literal_schema(["builtin"]),
                core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()),
            ]),
        )


_ALLOWED = "must be `builtin`, {builtin: N} (the first N built-in problems) or {dataset: FILE}"


def _validated_accuracy(value: Any, info: ValidationInfo) -> AccuracySpec:
    context = info.context if isinstance(info.context, Mapping) else {}
    return accuracy_spec(value, Path(context.get("base_dir") or "."))


def accuracy_spec(value: Any, base_dir: Path = Path(".")) -> AccuracySpec:
    """``workload.accuracy`` as written -> :class:`AccuracySpec`; a pydantic error says why not."""
    if isinstance(value, AccuracySpec):
        return value
    if isinstance(value, str):
        if value.strip().lower() == "builtin":
            return AccuracySpec("builtin", builtin_problems())
        raise invalid(f"{_ALLOWED}; got {describe(value)}{did_you_mean(value.strip().lower(), ('builtin',))}")
    if not isinstance(value, Mapping) or len(value) != 1:
        raise invalid(f"{_ALLOWED}; got {describe(value)}")
    (key, spec), = value.items()
    if key == "builtin":
        if isinstance(spec, bool) or not isinstance(spec, int) or not 1 <= spec <= MAX_PROBLEMS:
            raise invalid(f"`builtin` takes how many built-in problems to ask, a whole number from 1 to "
                          f"{MAX_PROBLEMS}; got {describe(spec)}")
        return AccuracySpec("builtin" if spec == BUILTIN_COUNT else f"builtin ({spec} problems)",
                            builtin_problems(spec))
    if key == "dataset":
        try:
            problems, digest = load_problems(spec, base_dir)
        except ValueError as exc:
            raise invalid(str(exc)) from None
        return AccuracySpec(f"dataset {Path(spec).name} (sha256:{digest})", problems)
    raise invalid(f"{_ALLOWED}; got the key {str(key)!r}{did_you_mean(str(key), ('builtin', 'dataset'))}")


def score(spec: AccuracySpec, records: Iterable[Any]) -> dict[str, Any]:
    """The accuracy pass's figures from its request records (``prompt_index``, ``matched``,
    ``error``, ``incomplete``): ``details["accuracy"]`` less the pass's settings.

    ``matched`` of an exact problem is True (correct), False (another number) or None
    (no number: unanswered). A failed or cut request, and a problem with no record (never
    sent), is ``failed``. ``accuracy`` is correct / problems: nothing is left out of the
    denominator, so failures cannot raise it."""
    outcome: dict[int, str] = {}
    for record in records:
        index = record.prompt_index
        if index is None or not 0 <= index < len(spec.problems) or index in outcome:
            continue  # each problem is asked once; anything else is not a problem's answer
        if record.error is not None or record.incomplete:
            outcome[index] = "failed"
        else:
            outcome[index] = {True: "correct", False: "wrong"}.get(record.matched, "unanswered")
    counts = {kind: sum(1 for v in outcome.values() if v == kind)
              for kind in ("correct", "wrong", "unanswered", "failed")}
    counts["failed"] += len(spec.problems) - len(outcome)
    return {"source": spec.source, "problems": len(spec.problems), **counts,
            "accuracy": round(counts["correct"] / len(spec.problems), 6)}
