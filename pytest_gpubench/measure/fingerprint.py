"""Which results may be compared: a fingerprint of what changes a cell's figures.

``--gpubench-compare`` holds a cell's figures against the same cell of a baseline
run. That only means something when both measured the same thing: 64 output
tokens per request against 128, other prompts, thinking on against off, or
another Ollama release all move tokens/s and TTFT with no change in the GPU.
Every result therefore stores a :class:`Fingerprint` (in ``details_json`` under
``fingerprint``, its hash in the ``benchmarks.workload_fingerprint`` column), and
a baseline whose fingerprint differs, or that has none, is not compared:
:func:`incomparable` says why.

What is in it, and why (see docs/metrics.md, "Comparable baselines"):

* ``prompts``: a hash of the prompt texts, their expectations and their own
  output lengths (``max_tokens``, ``ignore_eos``), in order;
* ``prompt_source``: for prompts from a dataset, its content hash and the options
  that chose them; for synthetic prompts, the spec (``matrix/datasets.py``,
  ``matrix/synthetic.py``). Only present for those, so fingerprints of written
  and built-in prompts keep the hash they always had;
* ``max_tokens``: the output cap, which sets answer lengths and the share of
  requests cut by it;
* ``load``: ``concurrency N`` or ``rate R/s`` (the cell id has it too: kept so
  the fingerprint stands alone);
* ``think``: the matrix's ``think`` as sent (None: the runtime's default);
* ``warmup``: whether the measured window starts on a warmed-up model;
* ``runtime``: the runtime's name and version (an Ollama upgrade changes
  scheduling, batching and thinking defaults);
* ``model_digest``: the weights behind the tag (a re-pushed tag is another model);
* ``launch``: the runtime's launch arguments and fixed port (``runtime.args``,
  ``runtime.port``): other arguments are another server configuration. Only
  present when set, so fingerprints without them keep their hash;
* ``gpus``: the GPUs the server spans when more than one (the cell id has it too,
  ``-x2``: kept so the fingerprint stands alone); the tensor-parallel size follows
  from it. Absent for one GPU, so one-GPU fingerprints keep their hash.

Left out on purpose: ``duration`` and ``runs`` (they set how precise the figures
are, not what they measure: a short CI run is compared with a long nightly one),
the progress, checkpoint and telemetry intervals, ``stall_timeout``, and the SLO
and thresholds (they judge figures, they do not make them). GPU, provider and
model are the cell itself: a baseline is always the same cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["FIELDS", "Fingerprint", "fingerprint", "incomparable", "stored_fingerprint"]

#: The fields, in the order a difference is told.
FIELDS = ("prompts", "prompt_source", "max_tokens", "load", "think", "warmup", "runtime", "model_digest", "launch",
          "gpus")


class Fingerprint(BaseModel):
    """The figure-changing facts of one result, and their stable hash."""

    model_config = ConfigDict(frozen=True)

    hash: str
    fields: dict[str, Any]


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(*, prompts: list[Any], max_tokens: int, concurrency: int, rate: float | None,
                think: bool | None, warmup_requests: int, runtime: str, runtime_version: str,
                model_digest: str = "", prompt_source: str | None = None,
                launch_args: Sequence[str] = (), port: int | None = None, sweep: str | None = None,
                gpus: int = 1) -> Fingerprint:
    """The fingerprint of a cell's workload on a runtime (see the module docstring); ``sweep``
    describes a saturation sweep's goal, SLO and bounds, which stand for its load."""
    fields = {
        "prompts": _digest(prompts)[:16],
        "max_tokens": max_tokens,
        "load": sweep or (f"rate {rate:g}/s" if rate is not None else f"concurrency {concurrency}"),
        "think": think,
        "warmup": warmup_requests > 0,
        "runtime": f"{runtime} {runtime_version}".strip(),
        "model_digest": model_digest or None,
    }
    if prompt_source:
        fields["prompt_source"] = prompt_source
    if launch_args or port is not None:  # only when set: fingerprints from before launch options stay equal
        fields["launch"] = {"args": list(launch_args), "port": port}
    if gpus > 1:
        fields["gpus"] = gpus
    return Fingerprint(hash=_digest(fields)[:16], fields=fields)


def stored_fingerprint(baseline: Mapping[str, Any]) -> Fingerprint | None:
    """The fingerprint a baseline (:meth:`Baseline.figures <pytest_gpubench.store.records.Baseline.figures>`,
    or a manifest row with its ``benchmark``) was stored with, if any."""
    benchmark = baseline.get("benchmark")
    if not isinstance(benchmark, Mapping):
        return None
    try:
        details = benchmark.get("details")  # a store's record: parsed already
        if not isinstance(details, Mapping):
            details = json.loads(benchmark.get("details_json") or "{}")
        found = details.get("fingerprint") if isinstance(details, Mapping) else None
        return Fingerprint.model_validate(found) if isinstance(found, dict) else None
    except ValueError:
        return None


def _shown(field: str, value: Any) -> str:
    if field == "think":
        return "default" if value is None else str(value).lower()
    if field == "warmup":
        return "warm-up" if value else "no warm-up"
    if field == "launch":
        return "default launch" if value is None else " ".join(
            [*value.get("args", []), *([f"port {value['port']}"] if value.get("port") else [])]) or "default launch"
    if value is None:
        return "written or built-in prompts" if field == "prompt_source" else "unknown"
    return str(value)


def incomparable(current: Fingerprint, baseline: Mapping[str, Any]) -> str | None:
    """Why ``baseline`` cannot be compared with a result of fingerprint ``current``; None if it can.

    The answer names what differs, baseline value first:
    ``max_tokens 64 -> 128, prompts differ``.
    """
    run = baseline.get("run_id") or "?"
    stored = stored_fingerprint(baseline)
    if stored is None:
        origin = "it was imported" if baseline.get("imported_from") else "it predates them"
        return f"run {run} stored no workload fingerprint ({origin}), so its workload is unknown"
    if stored.hash == current.hash:
        return None
    differences = []
    for field in FIELDS:
        old, new = stored.fields.get(field), current.fields.get(field)
        if old == new:
            continue
        if field in ("prompts", "model_digest") and old is not None and new is not None:
            differences.append("prompts differ" if field == "prompts" else "model digest differs")
        else:
            differences.append(f"{field} {_shown(field, old)} -> {_shown(field, new)}")
    # A hash that differs with equal fields: a fingerprint of another version.
    return f"run {run} differs: " + (", ".join(differences) or "its fingerprint has other fields")
