"""Result files made outside this plugin's runs, read into :class:`BenchmarkResult` objects.

``gpubench import`` (:mod:`.importer`) accepts three shapes, told apart by their
content, never by a file's name (:func:`parse_document`):

* **seed-000 result**: the flat JSON the seed-000 benchmark script writes to
  ``/tmp/benchmark_results.json`` (``model``, ``duration_seconds``, ``total_requests``,
  ``total_tokens``, ``total_errors``, ``avg/p50/p95_tokens_per_second``, ``gpu_info``
  as nvidia-smi CSV, ``timestamp``). That script counts only successful requests in
  ``total_requests``; here, as in the Go ``PerformanceResults``, it counts every
  measured request, so the errors are added in.
* **seed-001 checkpoint**: what the benchmark rewrites every N requests (``status``,
  ``model``, ``timestamp``, ``results``: one object per request, ``summary``).
  Its requests are either seed 001's (``{"tokens": n}`` or ``{"error": "..."}``) or
  this plugin's load generator's (:class:`RequestRecord`, with ``pid`` and a
  ``summary`` of running totals). A checkpoint whose status is not ``completed``
  is a ``partial`` result: what the benchmark had measured when it was written.
* **GPU Shopper BenchmarkResult**: the Go server's shape (``internal/benchmark/
  models.go``): one object, a list of them (``gpubench export --format json``), the
  server's list answer ``{"benchmarks": [...], "count": n}``, its POST answer
  ``{"benchmark": {...}}``, or ``scripts/gpu-benchmark.sh``'s result file (whose
  extra ``session_id`` and ``quality_results`` are ignored). ``null`` counts as
  absent, as it does for Go's decoder.

A list may mix the shapes; each item is read on its own. Every problem is an
:class:`ImportProblem` naming the field (``benchmarks[2].results.total_tokens``) and
what is allowed there.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..gpuinfo import parse_gpu_query_csv
from ..measure.results import BenchmarkResult, ModelInfo, PerformanceResults, TestConfig, summarize
from ..remote.readings import HardwareInfo, RequestRecord
from ..matrix.selection import split_tag
from ..matrix.yaml_errors import describe
from ..errors import ImportProblem, dotted

__all__ = [
    "BENCHMARK_RESULT",
    "CHECKPOINT",
    "FORMATS",
    "SEED_RESULT",
    "Parsed",
    "parse_document",
]

SEED_RESULT = "seed-000 result"
CHECKPOINT = "seed-001 checkpoint"
BENCHMARK_RESULT = "GPU Shopper BenchmarkResult"
FORMATS = (SEED_RESULT, CHECKPOINT, BENCHMARK_RESULT)

#: The nvidia-smi query behind seed 000's ``gpu_info``, in its order.
SEED_GPU_FIELDS = ("name", "memory.total", "memory.used", "temperature.gpu", "power.draw")
CHECKPOINT_STATUSES = ("started", "running", "completed", "interrupted", "failed")
_EXPECTED = (
    "expected a GPU Shopper BenchmarkResult (hardware/model/results objects) or a list of them, "
    "a seed-000 result (model, total_tokens, avg_tokens_per_second, ...) or a seed-001 checkpoint "
    "(status, model, results list)"
)
# Ids of results whose file gives none: a UUID derived from their content, so the
# same result imported twice gets the same id.
_CONTENT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "pytest-gpubench/import")


@dataclass(frozen=True)
class Parsed:
    """One result read from a file, before the importer fills in what the file lacks.

    ``key`` is the result's identity: its ``id`` when the file gives one, else a UUID
    of its normalized content (:func:`content_id`). ``where`` is its place in the file
    (``[2]``, ``benchmarks[0]``; empty for a file holding one object); ``detail``
    what is worth saying about it (a checkpoint's status).
    """

    format: str
    result: BenchmarkResult
    key: str
    status: Literal["success", "partial"] = "success"
    records: tuple[RequestRecord, ...] = ()
    where: str = ""
    detail: str = ""


# ---------------------------------------------------------------------- the shapes


class _Input(BaseModel):
    """Base of the file shapes: tolerant of fields a script adds, strict about the ones we read."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class SeedResult(_Input):
    """Seed 000's ``/tmp/benchmark_results.json``."""

    model: str = Field(min_length=1)
    duration_seconds: float = Field(ge=0)
    total_requests: int = Field(ge=0)  # successful requests only, in that script
    total_tokens: int = Field(ge=0)
    total_errors: int = Field(default=0, ge=0)
    avg_tokens_per_second: float = Field(default=0.0, ge=0)
    p50_tokens_per_second: float = Field(default=0.0, ge=0)
    p95_tokens_per_second: float = Field(default=0.0, ge=0)
    gpu_info: str = ""
    timestamp: datetime


class SeedRequest(_Input):
    """One request in a seed-001 checkpoint: tokens when it worked, an error when not."""

    tokens: int | None = Field(default=None, ge=0)
    error: str | None = None


class SeedSummary(_Input):
    """Seed 001's ``_compute_summary``: ``total_requests`` counts errors too."""

    total_requests: int | None = Field(default=None, ge=0)
    successful_requests: int | None = Field(default=None, ge=0)
    error_count: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    duration_seconds: float | None = Field(default=None, ge=0)
    tokens_per_second: float | None = Field(default=None, ge=0)


class LoadgenTotals(_Input):
    """The load generator's running totals (``remote/loadgen.py`` ``totals``)."""

    requests: int = Field(ge=0)  # successful
    tokens: int = Field(ge=0)
    errors: int = Field(default=0, ge=0)
    elapsed: float = Field(ge=0)


class Checkpoint(_Input):
    """A seed-001 checkpoint file; ``results`` are read by :func:`_checkpoint` per their shape."""

    status: Literal["started", "running", "completed", "interrupted", "failed"]
    model: str = Field(min_length=1)
    timestamp: datetime
    results: list[dict[str, Any]]
    summary: dict[str, Any] | None = None


# ------------------------------------------------------------------------- reading


def parse_document(data: Any) -> list[Parsed]:
    """Every result in one file's JSON value; an :class:`ImportProblem` for the first bad one.

    A file is taken whole or not at all: one bad item fails it, so a file is never
    half imported.
    """
    if isinstance(data, Mapping) and isinstance(data.get("benchmarks"), list):
        items, prefix = list(enumerate(data["benchmarks"])), ("benchmarks",)
    elif isinstance(data, Mapping) and isinstance(data.get("benchmark"), Mapping) and "results" not in data:
        items, prefix = [(None, data["benchmark"])], ("benchmark",)
    elif isinstance(data, list):
        items, prefix = list(enumerate(data)), ()
    else:
        items, prefix = [(None, data)], ()
    if not items:
        raise ImportProblem(prefix, "an empty list: there is no result in it")
    parsed = []
    for index, item in items:
        loc = prefix + ((index,) if index is not None else ())
        parsed.append(_parse_item(item, loc))
    return parsed


def detect(item: Any) -> str | None:
    """Which of :data:`FORMATS` an object is, from its keys; ``None`` when it is none of them."""
    if not isinstance(item, Mapping):
        return None
    if isinstance(item.get("results"), list):
        return CHECKPOINT
    if any(isinstance(item.get(key), Mapping) for key in ("results", "hardware", "model")):
        return BENCHMARK_RESULT
    if any(key in item for key in ("avg_tokens_per_second", "gpu_info", "total_tokens")):
        return SEED_RESULT
    return None


def _parse_item(item: Any, loc: tuple[Any, ...]) -> Parsed:
    kind = detect(item)
    if kind is None:
        if isinstance(item, Mapping):
            keys = ", ".join(sorted(str(k) for k in item)[:8]) or "none"
            found = f"an object with keys {keys}"
        else:
            found = describe(item)
        raise ImportProblem(loc, f"not a result of a known format: {_EXPECTED}; found {found}")
    reader = {SEED_RESULT: _seed_result, CHECKPOINT: _checkpoint, BENCHMARK_RESULT: _benchmark_result}[kind]
    try:
        parsed = reader(item)
    except ValidationError as exc:
        raise _translate(exc, loc, kind) from None
    except ImportProblem as exc:  # the readers' paths are relative to the item
        raise ImportProblem(loc + exc.loc, exc.message) from None
    return replace(parsed, where=dotted(loc))


def _translate(exc: ValidationError, loc: tuple[Any, ...], kind: str) -> ImportProblem:
    """pydantic's errors -> one problem: the first error's field, what is allowed, how many more."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = loc + tuple(first["loc"])
    error_type = first["type"]
    if error_type == "missing":
        message = f"required in a {kind}, but missing"
    elif error_type in ("model_type", "model_attributes_type", "dict_type"):
        message = f"must be an object; got {describe(first['input'])}"
    elif error_type == "list_type":
        message = f"must be a list; got {describe(first['input'])}"
    else:
        message = f"{first['msg']}; got {describe(first['input'])}"
    more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' * (more > 1)})"
    return ImportProblem(where, message)


# ------------------------------------------------------------------ the converters


def _model_info(name: str) -> ModelInfo:
    """Family and parameter count from an Ollama name, as the Go benchmark loader does."""
    family, tag = split_tag(name)
    return ModelInfo(name=name, family=family, parameter_count=(tag or "").upper(), runtime="ollama")


def _figures(
    ok: int, errors: int, tokens: int, duration: float, avg_tps: float, **extra: float
) -> PerformanceResults:
    """The Go figures of a run known only by its totals; ``total_requests`` includes errors."""
    total = ok + errors
    return PerformanceResults(
        total_requests=total,
        total_tokens=tokens,
        total_errors=errors,
        duration_seconds=duration,
        avg_tokens_per_second=avg_tps,
        requests_per_minute=ok / duration * 60 if duration > 0 else 0.0,
        avg_tokens_per_request=tokens / ok if ok else 0.0,
        error_rate=errors / total if total else 0.0,
        **extra,
    )


def _seed_result(item: Mapping[str, Any]) -> Parsed:
    seed = SeedResult.model_validate(item)
    gpus = parse_gpu_query_csv(seed.gpu_info, SEED_GPU_FIELDS) if seed.gpu_info.strip() else []
    first = gpus[0] if gpus else {}
    # The script writes "unknown,0,0,0,0" when nvidia-smi failed.
    name = str(first.get("name") or "")
    name = "" if name.lower() == "unknown" else name
    memory = first.get("memory.total")
    result = BenchmarkResult(
        timestamp=seed.timestamp,
        hardware=HardwareInfo(
            gpu_name=name,
            gpu_memory_mib=int(memory) if isinstance(memory, (int, float)) else 0,
            gpu_count=len(gpus) if name else 0,
        ),
        model=_model_info(seed.model),
        # The seed script sends one request at a time.
        test_config=TestConfig(duration_minutes=int(seed.duration_seconds // 60), concurrent_reqs=1),
        results=_figures(
            seed.total_requests, seed.total_errors, seed.total_tokens, seed.duration_seconds,
            seed.avg_tokens_per_second, p50_tokens_per_second=seed.p50_tokens_per_second,
            p95_tokens_per_second=seed.p95_tokens_per_second,
        ),
    )
    return Parsed(SEED_RESULT, result, content_id(result, stated_time=True))


def _checkpoint(item: Mapping[str, Any]) -> Parsed:
    checkpoint = Checkpoint.model_validate(item)
    raw = checkpoint.results
    ours = any("output_tokens" in record for record in raw)
    records: tuple[RequestRecord, ...] = ()
    if ours:
        try:
            records = tuple(TypeAdapter(list[RequestRecord]).validate_python(raw))
        except ValidationError as exc:
            raise _translate(exc, ("results",), CHECKPOINT) from None
        results, warmups = _loadgen_figures(records, checkpoint.summary)
    else:
        results, warmups = _seed_figures(raw, checkpoint.summary), 0
    if results.total_requests == 0:
        raise ImportProblem(("results",), f"the checkpoint (status {checkpoint.status!r}) holds no measured "
                                       "request yet: nothing to import")
    result = BenchmarkResult(
        timestamp=checkpoint.timestamp,
        model=_model_info(checkpoint.model),
        test_config=TestConfig(duration_minutes=int(results.duration_seconds // 60),
                               concurrent_reqs=0 if ours else 1, warmup_requests=warmups),
        results=results,
    )
    status: Literal["success", "partial"] = "success" if checkpoint.status == "completed" else "partial"
    detail = f"status {checkpoint.status}, {results.total_requests} requests"
    return Parsed(CHECKPOINT, result, content_id(result, stated_time=True), status, records, detail=detail)


def _seed_figures(raw: list[dict[str, Any]], summary: Mapping[str, Any] | None) -> PerformanceResults:
    try:
        requests = TypeAdapter(list[SeedRequest]).validate_python(raw)
    except ValidationError as exc:
        raise _translate(exc, ("results",), CHECKPOINT) from None
    try:
        totals = SeedSummary.model_validate(summary or {})
    except ValidationError as exc:
        raise _translate(exc, ("summary",), CHECKPOINT) from None
    # Seed 001's own rule: a request with tokens worked, one with an error did not.
    ok = sum(1 for r in requests if r.tokens is not None)
    errors = sum(1 for r in requests if r.error is not None)
    tokens = sum(r.tokens or 0 for r in requests)
    if not requests:  # only a summary: take its word
        ok = totals.successful_requests or 0
        errors = totals.error_count or 0
        tokens = totals.total_tokens or 0
    duration = totals.duration_seconds or 0.0
    if totals.tokens_per_second is not None:
        avg_tps = totals.tokens_per_second
    else:
        avg_tps = tokens / duration if duration > 0 else 0.0
    return _figures(ok, errors, tokens, duration, avg_tps)


def _loadgen_figures(
    records: tuple[RequestRecord, ...], summary: Mapping[str, Any] | None
) -> tuple[PerformanceResults, int]:
    measured = [r for r in records if not r.warmup]
    if summary is not None:
        try:
            duration = LoadgenTotals.model_validate(summary).elapsed
        except ValidationError as exc:
            raise _translate(exc, ("summary",), CHECKPOINT) from None
    else:
        # No totals yet: the span from the first send to the last answer.
        ends = [r.started_at + r.latency_ms / 1000 for r in measured]
        duration = max(ends) - min(r.started_at for r in measured) if measured else 0.0
    return summarize(records, max(duration, 0.0)), len(records) - len(measured)


def _without_nulls(value: Any) -> Any:
    """JSON ``null`` as absent, recursively: Go decodes it to the zero value, so may we."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _benchmark_result(item: Mapping[str, Any]) -> Parsed:
    data = _without_nulls(item)
    result = BenchmarkResult.model_validate(data)
    if not result.model.name.strip():
        raise ImportProblem(("model", "name"), "required: the model the result measured (e.g. \"qwen2:7b\"), "
                                          "but missing or empty")
    key = result.id or content_id(result, stated_time="timestamp" in data)
    return Parsed(BENCHMARK_RESULT, result, key)


def content_id(result: BenchmarkResult, *, stated_time: bool) -> str:
    """A UUID of the result's normalized content, for results without an id of their own.

    Normalized: parsed through the models first, so key order, spacing, ``1`` versus
    ``1.0`` and ``null`` versus absent do not matter. A timestamp the file did not
    state (``stated_time`` false) is left out, since the model fills in "now".
    """
    content = result.model_dump(mode="json", exclude={"id"})
    if not stated_time:
        content.pop("timestamp", None)
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return str(uuid.uuid5(_CONTENT_NAMESPACE, hashlib.sha256(text.encode()).hexdigest()))
