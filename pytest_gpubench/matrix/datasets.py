"""Prompts from a dataset file: JSONL with a prompt field, or ShareGPT conversations.

``prompts: {dataset: PATH, ...}``, the path relative to the matrix file. A record is

* a JSON object with the prompt in ``field`` (default ``prompt``), one per line
  (JSONL) or as the items of one JSON list; or
* a ShareGPT conversation, ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}`` (``user``/``assistant`` too): its first
  human turn is the prompt, and the gpt turn after it is the answer whose length
  ``output_tokens: dataset`` gives the request (as vLLM's ``bench serve`` does).

Options: ``field``; ``output_tokens`` (``dataset``: each record's answer length,
ShareGPT's gpt turn or the JSONL ``output_field``, a whole number of tokens or a
text whose tokens are counted; or a distribution as in ``synthetic:``);
``shuffle`` and ``seed`` (a seed alone shuffles too); ``limit`` (the first N after
shuffling); ``multi_turn: true`` (ShareGPT only: each conversation whole, its human
turns replayed in order with the model's own answers, ``think_time`` seconds between
them; ``conversations.py``). ShareGPT conversations with no human turn (or, with ``output_tokens:
dataset``, no answer) are skipped, as vLLM skips them; every other problem is an
error naming the file, the line and the field. The workload's identity holds the
file's SHA-256, not its name: renaming a file compares equal, editing it does not.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conversations import Conversation, ThinkTime, Turn, think_time
from .synthetic import MAX_LENGTH, Distribution, count_tokens, distribution

_KEYS = ("dataset", "field", "output_field", "output_tokens", "limit", "shuffle", "seed", "multi_turn",
         "think_time")
_HUMAN, _GPT = ("human", "user"), ("gpt", "assistant", "chatgpt", "bard")


@dataclass(frozen=True)
class PromptSource:
    """Where a workload's prompts came from: ``label`` for people, ``identity`` for the fingerprint."""

    label: str
    identity: str


@dataclass(frozen=True)
class DatasetPrompt:
    """One record's prompt and, when the workload asks for it, its output length."""

    text: str
    max_tokens: int | None
    #: ``multi_turn: true``: the whole conversation (its first turn is ``text``).
    conversation: Conversation | None = None


def load_dataset(spec: Mapping[str, Any], base_dir: Path) -> tuple[list[DatasetPrompt], PromptSource]:
    """``prompts: {dataset: ...}`` -> its prompts and where they came from.

    A dataset that cannot be used is a ValueError whose message names the file, the
    line and the field (the workload's validator makes it the matrix's error)."""
    unknown = [str(k) for k in spec if k not in _KEYS]
    if unknown:
        raise ValueError(f"`dataset` has an unknown option {unknown[0]!r}; allowed: {', '.join(_KEYS)}")
    raw_path = spec.get("dataset")
    if not isinstance(raw_path, str) or not raw_path.strip():
        raise ValueError(f"`dataset` must be a file path (relative to the matrix file); got {raw_path!r}")
    field = _name(spec, "field", "prompt")
    output_field = _name(spec, "output_field", None)
    output = spec.get("output_tokens")
    drawn: Distribution | None = None
    if output is not None and output != "dataset":
        try:
            drawn = distribution(output, "output_tokens")
        except ValueError as exc:
            raise ValueError(f"{exc}, or `dataset` (each record's answer length)") from None
    limit = spec.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`limit` must be a whole number of at least 1; got {limit!r}")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"`seed` must be a whole number; got {seed!r}")
    shuffle = spec.get("shuffle", "seed" in spec)
    if not isinstance(shuffle, bool):
        raise ValueError(f"`shuffle` must be true or false; got {shuffle!r}")
    multi_turn = spec.get("multi_turn", False)
    if not isinstance(multi_turn, bool):
        raise ValueError(f"`multi_turn` must be true or false; got {multi_turn!r}")
    if "think_time" in spec and not multi_turn:
        raise ValueError("`think_time` applies only with `multi_turn: true` (the wait between turns)")
    think = think_time(spec.get("think_time", 0)) if multi_turn else None

    path, text, digest = read_data_file(raw_path, base_dir, "dataset")

    prompts: list[DatasetPrompt] = []
    skipped = 0
    for line, record in _records(text, path):
        if think is not None:
            found = _conversation_of(record, path, line, think, from_data=output == "dataset",
                                     rng=random.Random(f"gpubench-dataset-think-{seed}-{line}"))
        else:
            found = _prompt_of(record, path, line, field, output_field, from_data=output == "dataset")
        if found is None:
            skipped += 1
        else:
            prompts.append(found)
    if not prompts:
        why = f" ({skipped} conversation{'s' if skipped != 1 else ''} had no usable turns)" if skipped else ""
        raise ValueError(f"dataset {path}: no prompts in it{why}")
    total = len(prompts)
    if shuffle:
        random.Random(f"gpubench-dataset-{seed}").shuffle(prompts)
    prompts = prompts[:limit] if limit else prompts
    if drawn is not None:
        rng = random.Random(f"gpubench-dataset-output-{seed}")
        prompts = [DatasetPrompt(p.text, drawn.draw(rng)) if p.conversation is None
                   else _redrawn(p.conversation, drawn, rng) for p in prompts]

    order = f"shuffled seed {seed}" if shuffle else "in file order"
    outputs = ("output dataset" if output == "dataset" else f"output {drawn.describe()}" if drawn else "")
    what = "conversations" if multi_turn else "prompts"
    label = f"dataset {path.name} ({len(prompts)} of {total} {what}, {order})"
    identity = " ".join(part for part in (
        f"multi_turn think {think.describe()}" if think is not None else "",
        f"dataset sha256:{digest}", f"field {field}", f"output_field {output_field}" if output_field else "",
        f"limit {limit}" if limit else "", order, outputs) if part)
    return prompts, PromptSource(label, identity)


def _name(spec: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = spec.get(key, default)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"`{key}` must be a field name; got {value!r}")
    return value


def read_data_file(raw_path: str, base_dir: Path, what: str) -> tuple[Path, str, str]:
    """A data file a matrix names (a dataset, a trace, an accuracy set): its path (relative
    to the matrix file's folder unless absolute), its UTF-8 text and the SHA-256 of its bytes
    (16 hex digits, for the workload's identity). ValueError names ``what`` and the path."""
    path = Path(raw_path).expanduser()
    path = path if path.is_absolute() else base_dir / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path}: not UTF-8 text (byte {exc.start} is invalid)") from None
    return path, text, hashlib.sha256(data).hexdigest()[:16]


def _records(text: str, path: Path) -> list[tuple[int, Any]]:
    """``(line, record)`` for each record: the items of a JSON list, or one per non-blank JSONL line."""
    if text.lstrip().startswith("["):
        return _list_items(text, path)
    out = []
    # JSONL lines end at "\n" alone: str.splitlines() also breaks at U+2028 and the like,
    # which a JSON string may hold as they are, cutting a valid record in two.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"dataset {path} line {number}: invalid JSON: {exc.msg} "
                               f"(column {exc.colno})") from None
        except RecursionError:
            raise ValueError(f"dataset {path} line {number}: invalid JSON: nested too deep") from None
    return out


def _list_items(text: str, path: Path) -> list[tuple[int, Any]]:
    """A JSON list's items with the line each starts on (``raw_decode`` item by item)."""
    decoder = json.JSONDecoder()
    out: list[tuple[int, Any]] = []
    position = text.index("[") + 1

    def skip(at: int) -> int:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return at

    def fail(at: int, message: str) -> ValueError:
        return ValueError(f"dataset {path} line {text.count(chr(10), 0, at) + 1}: invalid JSON: {message}")

    position = skip(position)
    if position < len(text) and text[position] == "]":
        return out
    while True:
        line = text.count("\n", 0, position) + 1
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise ValueError(f"dataset {path} line {exc.lineno}: invalid JSON: {exc.msg} "
                               f"(column {exc.colno})") from None
        except RecursionError:
            raise fail(position, "nested too deep") from None
        out.append((line, item))
        position = skip(position)
        if position >= len(text):
            raise fail(position, "the list is not closed with ]")
        if text[position] == "]":
            if text[skip(position + 1):].strip():
                raise fail(position + 1, "text after the list's closing ]")
            return out
        if text[position] != ",":
            raise fail(position, "expected , or ] between the list's items")
        position = skip(position + 1)


def _prompt_of(record: Any, path: Path, line: int, field: str, output_field: str | None, *,
               from_data: bool) -> DatasetPrompt | None:
    where = f"dataset {path} line {line}"
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a record must be a JSON object; got {type(record).__name__}")
    if "conversations" in record and field == "prompt" and "prompt" not in record:
        return _sharegpt(record["conversations"], where, from_data=from_data)
    if field not in record:
        keys = ", ".join(k if k.isprintable() and len(k) <= 40 else _shown(k) for k in list(record)[:8]) or "none"
        raise ValueError(f"{where}: field `{field}` is missing (the record's keys: {keys}); "
                           "name the prompt's field with `field:`")
    text = record[field]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: field `{field}` must be non-empty text; got {_shown(text)}")
    if not from_data:
        return DatasetPrompt(text, None)
    if output_field is None:
        raise ValueError(f"{path}: `output_tokens: dataset` on JSONL records needs `output_field:` "
                           "(the field holding the answer, or its length in tokens)")
    if output_field not in record:
        raise ValueError(f"{where}: field `{output_field}` (output_field) is missing")
    return DatasetPrompt(text, _output_length(record[output_field], f"{where}: field `{output_field}`"))


def _sharegpt(turns: Any, where: str, *, from_data: bool) -> DatasetPrompt | None:
    if not isinstance(turns, list):
        raise ValueError(f"{where}: field `conversations` must be a list of turns; got {_shown(turns)}")
    for index, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
            raise ValueError(f"{where}: field `conversations[{index}]` must be "
                               f"{{\"from\": ..., \"value\": ...}}; got {_shown(turn)}")
    human = next((i for i, t in enumerate(turns)
                  if t["from"] in _HUMAN and isinstance(t["value"], str) and t["value"].strip()), None)
    if human is None:
        return None
    if not from_data:
        return DatasetPrompt(turns[human]["value"], None)
    answer = next((t["value"] for t in turns[human + 1:] if t["from"] in _GPT and isinstance(t["value"], str)
                   and t["value"].strip()), None)
    return None if answer is None else DatasetPrompt(turns[human]["value"], min(count_tokens(answer), MAX_LENGTH))


def _conversation_of(record: Any, path: Path, line: int, think: ThinkTime, *, from_data: bool,
                     rng: random.Random) -> DatasetPrompt | None:
    """A ShareGPT record as a whole conversation (``multi_turn: true``): every non-empty human
    turn is a user turn, in order; with ``output_tokens: dataset`` each one's cap is the length
    of the recorded answer after it (a turn without one is dropped, as vLLM drops them). The
    recorded answers are never sent: the model's own answers make the history."""
    where = f"dataset {path} line {line}"
    if not isinstance(record, Mapping) or "conversations" not in record:
        raise ValueError(f"{where}: `multi_turn: true` reads ShareGPT records, "
                         "{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]}; "
                         f"got {_shown(record)}")
    turns = record["conversations"]
    if _sharegpt(turns, where, from_data=False) is None:  # validates the shape, finds a human turn
        return None
    made: list[Turn] = []
    for index, turn in enumerate(turns):
        text = turn["value"]
        if turn["from"] not in _HUMAN or not isinstance(text, str) or not text.strip():
            continue
        cap = None
        if from_data:
            answer = next((t["value"] for t in turns[index + 1:index + 2] if t["from"] in _GPT
                           and isinstance(t["value"], str) and t["value"].strip()), None)
            if answer is None:
                continue
            cap = min(count_tokens(answer), MAX_LENGTH)
        made.append(Turn(text, cap, think.draw(rng) if made else 0.0))
    if not made:
        return None
    return DatasetPrompt(made[0].text, made[0].max_tokens, Conversation(tuple(made)))


def _redrawn(conversation: Conversation, drawn: Distribution, rng: random.Random) -> DatasetPrompt:
    turns = tuple(Turn(t.text, drawn.draw(rng), t.think_s) for t in conversation.turns)
    return DatasetPrompt(turns[0].text, turns[0].max_tokens, Conversation(turns))


def _output_length(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LENGTH:
        return value
    if isinstance(value, str) and value.strip():
        return min(count_tokens(value), MAX_LENGTH)
    raise ValueError(f"{where} must be a whole number of tokens from 1 to {MAX_LENGTH} "
                       f"or the answer's text; got {_shown(value)}")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
