"""Trace replay: a JSONL trace of request arrivals, replayed at its own times or sped up.

``workload.trace: {file: PATH, speedup: S, limit: N, duration: SECONDS, time_unit: ms | s}``,
the path relative to the matrix file. One JSON object per line (blank lines skipped), each
one request, in arrival order:

* ``{"timestamp": 0, "input_length": 655, "output_length": 52}``: the Mooncake trace format
  (kvcache-ai/Mooncake's FAST'25 traces, which AIPerf's ``mooncake_trace`` and NVIDIA Dynamo's
  tools read; ``hash_ids`` and other keys are ignored). The prompt is synthetic text of
  ``input_length`` tokens (``synthetic.py``'s text maker and token rule), the output cap
  ``output_length``. The Azure LLM inference traces' columns (``ContextTokens``,
  ``GeneratedTokens``) and the spellings ``input_tokens``/``output_tokens`` are read too.
* ``{"timestamp": 0, "messages": [{"role": "user", "content": "..."}], "output_length": 64}``:
  a conversation sent as recorded (``output_length`` optional: the workload's ``max_tokens``).

``timestamp`` (or ``time``, ``arrival_time``) is the request's arrival, in milliseconds by
default as Mooncake's are (``time_unit: s`` for seconds); the first record's time is the run's
start, and times must not go backwards. Request *i* is sent at ``(t_i - t_0) / speedup``
seconds into the run, open loop. The run lasts the trace's span / speedup, or ``duration``
when that is shorter (records after it are left out). ``limit`` keeps the first N records.
Every problem is a ValueError naming the file, the line and the field, as ``datasets.py``'s.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import core_schema

from .datasets import PromptSource, _shown, read_data_file
from .fields import invalid
from .synthetic import MAX_LENGTH, text_of_length

_KEYS = ("file", "speedup", "limit", "duration", "time_unit")
_TIME = ("timestamp", "time", "arrival_time")
_INPUT = ("input_length", "input_tokens", "ContextTokens")
_OUTPUT = ("output_length", "output_tokens", "GeneratedTokens")
_UNITS = {"ms": 0.001, "s": 1.0}
MAX_SPEEDUP = 1000.0
MAX_RECORDS = 100_000


@dataclass(frozen=True)
class TraceRequest:
    """One replayed request: when it is sent (seconds into the run, after the speedup), its prompt
    text, its conversation (None: the text alone is sent), its input length in tokens (None for a
    conversation) and its output cap (None: the workload's ``max_tokens``)."""

    offset: float
    text: str
    messages: tuple[dict[str, Any], ...] | None
    input_tokens: int | None
    max_tokens: int | None

    def payload(self, ignore_eos: bool = False) -> dict[str, Any]:
        """The load generator's prompt entry: ``{"prompt", "max_tokens"?, "messages"?, "ignore_eos"?}``."""
        entry: dict[str, Any] = {"prompt": self.text}
        if self.max_tokens is not None:
            entry["max_tokens"] = self.max_tokens
        if self.messages is not None:
            entry["messages"] = [dict(m) for m in self.messages]
        if ignore_eos:
            entry["ignore_eos"] = True
        return entry


@dataclass(frozen=True)
class Trace:
    """A validated ``workload.trace``: its requests (offsets already divided by the speedup),
    the speedup, the run's length and where it came from."""

    requests: tuple[TraceRequest, ...]
    speedup: float
    window: float
    source: PromptSource

    @property
    def offsets(self) -> list[float]:
        """When each request is sent, seconds into the run (the load generator's ``schedule``)."""
        return [r.offset for r in self.requests]

    def describe(self) -> dict[str, Any]:
        """What the result's ``details.load.trace`` keeps."""
        return {"label": self.source.label, "requests": len(self.requests), "speedup": self.speedup,
                "window_s": round(self.window, 6)}

    def __hash__(self) -> int:
        return hash(self.source.identity)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        # The matrix passes its folder as context: the trace's path is relative to the matrix file.
        # A Python dump keeps the Trace itself (a hook's workload validates again as it was).
        return core_schema.with_info_plain_validator_function(
            _validated,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value, info: value if info.mode == "python" else value.describe(), info_arg=True),
            json_schema_input_schema=core_schema.union_schema([
                core_schema.str_schema(), core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())]),
        )


def _validated(value: Any, info: Any) -> Trace:
    context = info.context if isinstance(info.context, Mapping) else {}
    try:
        return load_trace(value, Path(context.get("base_dir") or "."))
    except ValueError as exc:
        raise invalid(str(exc)) from None


def load_trace(spec: Any, base_dir: Path) -> Trace:
    """``workload.trace`` as written -> :class:`Trace`; a ValueError names the file, line and field."""
    if isinstance(spec, Trace):
        return spec
    if isinstance(spec, str):
        spec = {"file": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"must be a mapping {{file: PATH, speedup: S, limit: N, duration: SECONDS, time_unit: ms|s}} "
                         f"or a file path; got {_shown(spec)}")
    unknown = [str(k) for k in spec if k not in _KEYS]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; allowed: {', '.join(_KEYS)}")
    raw_path = spec.get("file")
    if not isinstance(raw_path, str) or not raw_path.strip():
        raise ValueError(f"`file` must be a trace file path (relative to the matrix file); got {_shown(raw_path)}")
    speedup = spec.get("speedup", 1)
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not 0 < speedup <= MAX_SPEEDUP \
            or not math.isfinite(speedup):
        raise ValueError(f"`speedup` must be a number above 0 and at most {MAX_SPEEDUP:g} (2 halves every gap); "
                         f"got {_shown(speedup)}")
    limit = spec.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`limit` must be a whole number of at least 1; got {_shown(limit)}")
    duration = spec.get("duration")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not 0 < duration < math.inf):
        raise ValueError(f"`duration` must be a number of seconds above 0; got {_shown(duration)}")
    unit = spec.get("time_unit", "ms")
    if unit not in _UNITS:
        raise ValueError(f"`time_unit` must be ms (Mooncake's) or s; got {_shown(unit)}")

    path, text, digest = read_data_file(raw_path, base_dir, "trace")

    words = random.Random("gpubench-trace-text")
    requests: list[TraceRequest] = []
    first = previous = None
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if limit is not None and len(requests) >= limit:
            break
        if len(requests) >= MAX_RECORDS:
            raise ValueError(f"trace {path}: more than {MAX_RECORDS} records; keep the first ones with `limit:`")
        where = f"trace {path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise ValueError(f"{where}: invalid JSON: nested too deep") from None
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: a record must be a JSON object; got {type(record).__name__}")
        at = _time(record, where) * _UNITS[unit]
        if previous is not None and at < previous:
            raise ValueError(f"{where}: field `timestamp` goes backwards ({_shown(record[_key(record, _TIME)])} "
                             f"after {previous / _UNITS[unit]:g}): a trace lists requests in arrival order")
        first = at if first is None else first
        previous = at
        offset = (at - first) / speedup
        if duration is not None and offset > duration:
            break
        requests.append(_request(record, where, offset, words))
    if not requests:
        raise ValueError(f"trace {path}: no records in it")
    window = requests[-1].offset
    label = f"trace {path.name} ({len(requests)} requests, speedup {speedup:g})"
    identity = " ".join(part for part in (f"trace sha256:{digest}", f"speedup {speedup:g}", f"unit {unit}",
                                          f"limit {limit}" if limit else "",
                                          f"duration {duration:g}" if duration is not None else "") if part)
    return Trace(tuple(requests), float(speedup), window, PromptSource(label, identity))


def _key(record: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in record), None)


def _time(record: Mapping[str, Any], where: str) -> float:
    key = _key(record, _TIME)
    if key is None:
        keys = ", ".join(str(k)[:40] for k in list(record)[:8]) or "none"
        raise ValueError(f"{where}: field `timestamp` is missing (the record's keys: {keys}); "
                         f"a record needs its arrival time as one of {', '.join(_TIME)}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: field `{key}` must be a number of at least 0 (the arrival time); "
                         f"got {_shown(value)}")
    return float(value)


def _length(record: Mapping[str, Any], names: tuple[str, ...], where: str) -> int | None:
    key = _key(record, names)
    if key is None:
        return None
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LENGTH:
        raise ValueError(f"{where}: field `{key}` must be a whole number of tokens from 1 to {MAX_LENGTH}; "
                         f"got {_shown(value)}")
    return value


def _request(record: Mapping[str, Any], where: str, offset: float, words: random.Random) -> TraceRequest:
    output = _length(record, _OUTPUT, where)
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{where}: field `messages` must be a non-empty list of "
                             f"{{\"role\": ..., \"content\": ...}}; got {_shown(messages)}")
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise ValueError(f"{where}: field `messages[{index}]` must be {{\"role\": TEXT, \"content\": TEXT}}; "
                                 f"got {_shown(message)}")
        cleaned = tuple({"role": m["role"], "content": m["content"]} for m in messages)
        text = "\n\n".join(m["content"] for m in cleaned)
        if not text.strip():
            raise ValueError(f"{where}: field `messages` has no text in any `content`")
        return TraceRequest(offset, text, cleaned, None, output)
    tokens = _length(record, _INPUT, where)
    if tokens is None:
        raise ValueError(f"{where}: field `input_length` is missing: a record needs `input_length` "
                         f"(or {', '.join(_INPUT[1:])}) or `messages`")
    return TraceRequest(offset, text_of_length(tokens, words), None, tokens, output)

