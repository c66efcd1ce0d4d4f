"""Request bodies of the emulated API, decoded the way the Go server decodes them.

The server binds JSON with gin (``encoding/json`` + go-playground validator) and
rewrites validator errors into ``"reservation_hours must be at most 12"``-style
messages joined by ``"; "``. Clients show those messages to people, so the sandbox
words them the same way: :func:`bind` reproduces the decoder's type errors and the
validator's ``required``/``min``/``max`` rules, field by field in struct order.

Posted benchmarks decode into the plugin's own ``BenchmarkResult`` (the same Go
struct): unknown keys are ignored and missing ones are zero, as Go's decoder does.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ..measure.results import BenchmarkResult

# (json name, Go type, validator rules) in the order of the Go struct.
CREATE_SESSION_FIELDS: list[tuple[str, str, str]] = [
    ("consumer_id", "string", "required"),
    ("offer_id", "string", "required"),
    ("workload_type", "string", "required"),
    ("reservation_hours", "int", "required,min=1,max=12"),
    ("idle_threshold_minutes", "int", ""),
    ("storage_policy", "string", ""),
    ("launch_mode", "string", ""),
    ("docker_image", "string", ""),
    ("model_id", "string", ""),
    ("exposed_ports", "[]int", ""),
    ("quantization", "string", ""),
    ("template_hash_id", "string", ""),
    ("disk_gb", "int", ""),
    ("auto_retry", "bool", ""),
    ("max_retries", "int", ""),
    ("retry_scope", "string", ""),
    ("on_start_cmd", "string", ""),
    ("ssh_timeout_minutes", "int", ""),
]
EXTEND_SESSION_FIELDS: list[tuple[str, str, str]] = [
    ("additional_hours", "int", "required,min=1,max=12"),
]
WORKLOAD_TYPES = ("llm", "llm_vllm", "llm_tgi", "training", "batch", "interactive", "inference", "ssh", "benchmark")
RETRY_SCOPES = ("same_gpu", "same_vram", "any")

_ZERO = {"string": "", "int": 0, "bool": False, "[]int": None}


class BindError(ValueError):
    """A body the server would answer 400 to; ``str()`` is the server's message."""


def bind(body: bytes, struct: str, fields: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Decode ``body`` into the named Go struct's fields, then validate them."""
    if not body.strip():
        raise BindError("EOF")
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as exc:
        raise BindError(f"invalid character in JSON body at offset {exc.pos}: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise BindError(f"json: cannot unmarshal {_json_kind(raw)} into Go value of type api.{struct}")
    values: dict[str, Any] = {}
    for name, go_type, _rules in fields:
        value = raw.get(name)
        if value is None:
            values[name] = _ZERO[go_type]
        elif _fits(value, go_type):
            values[name] = value
        else:
            raise BindError(
                f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                f"{struct}.{name} of type {go_type}"
            )
    problems = [p for name, go_type, rules in fields if (p := _check(name, values[name], rules))]
    if problems:
        raise BindError("; ".join(problems))
    return values


def _fits(value: Any, go_type: str) -> bool:
    if go_type == "string":
        return isinstance(value, str)
    if go_type == "bool":
        return isinstance(value, bool)
    if go_type == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if go_type == "[]int":
        return isinstance(value, list) and all(_fits(v, "int") for v in value)
    return False


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check(name: str, value: Any, rules: str) -> str | None:
    for rule in filter(None, rules.split(",")):
        if rule == "required" and value in ("", 0, False, None):
            return f"{name} is required"
        if rule.startswith("min=") and value < int(rule[4:]):
            return f"{name} must be at least {rule[4:]}"
        if rule.startswith("max=") and value > int(rule[4:]):
            return f"{name} must be at most {rule[4:]}"
    return None


# -- benchmarks -------------------------------------------------------------------


def benchmark_json(result: BenchmarkResult) -> dict[str, Any]:
    """A stored result as the server answers it (``omitempty`` quality fields dropped when zero)."""
    body = result.model_dump(mode="json")
    for key in ("match_rate", "prompts_with_expected", "prompts_matching"):
        if not body["results"].get(key):
            body["results"].pop(key, None)
    return body


def parse_benchmark(body: bytes) -> BenchmarkResult:
    """Decode a posted benchmark; raises :class:`BindError` worded like the server."""
    try:
        # strict: a string where Go wants a number is refused, as Go refuses it
        return BenchmarkResult.model_validate_json(body or b"null", strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BindError(f"invalid benchmark data: {where}: {first['msg']}") from None


def cost_analysis(result: BenchmarkResult) -> dict[str, float]:
    """The server's ``CalculateCostAnalysis`` (all zero without price or rate)."""
    tps, price = result.results.avg_tokens_per_second, result.price_per_hour
    if price <= 0 or tps <= 0:
        return {"tokens_per_dollar": 0.0, "cost_per_million_tokens": 0.0, "cost_per_hour": 0.0,
                "estimated_monthly_24x7": 0.0}
    tokens_per_dollar = tps * 3600 / price
    return {
        "tokens_per_dollar": tokens_per_dollar,
        "cost_per_million_tokens": 1_000_000 / tokens_per_dollar,
        "cost_per_hour": price,
        "estimated_monthly_24x7": price * 24 * 30,
    }
