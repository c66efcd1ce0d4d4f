"""Speculative decoding acceptance, from a runtime's Prometheus counters scraped around the run.

vLLM's ``/metrics`` (the V1 engine, vLLM 0.8 and later) counts, over the server's life:

* ``vllm:spec_decode_num_drafts_total``: draft steps (one per sequence per step that proposed);
* ``vllm:spec_decode_num_draft_tokens_total``: tokens the drafter proposed;
* ``vllm:spec_decode_num_accepted_tokens_total``: proposed tokens the target model accepted

(labelled by ``engine`` and ``model_name``: every labelled series is summed; the
``_created`` timestamps prometheus_client adds are not counters and are skipped). The V0
engine (before 0.8) exposed the draft and accepted token counters under the same names but
no draft count, so there the acceptance rate is known and the mean acceptance length is not.

Over the measured run (after minus before):

* ``spec_decode_acceptance_rate = accepted / draft_tokens`` (vLLM's "draft acceptance rate");
* ``spec_decode_mean_acceptance_length = 1 + accepted / drafts``: tokens each verification
  step emits on average, the bonus token included (vLLM's "mean acceptance length").

A runtime without speculative decoding (no such counters, or none that moved) gives None
with the reason: never a 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_NAMES = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")
SOURCE = "vllm /metrics"


def parse_counters(text: str) -> dict[str, float] | None:
    """The spec-decode counters of a Prometheus text exposition (each summed over its labels),
    by name without ``_total``; None when it has neither draft nor accepted tokens."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        name = match["name"]
        name = name[:-len("_total")] if name.endswith("_total") else name
        if name not in _NAMES:
            continue  # ``..._created`` and ``..._per_pos`` and every other series
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            found[name] = found.get(name, 0.0) + value
    return found if DRAFT_TOKENS in found and ACCEPTED in found else None


def acceptance(before: str | None, after: str | None, *, runtime: str = "") -> dict[str, Any]:
    """One run's acceptance from the ``/metrics`` texts scraped before and after it (None: not scraped)."""
    if before is None or after is None:
        return absent(f"{runtime or 'the runtime'} exposes no Prometheus /metrics to read speculative decoding from")
    start, end = parse_counters(before), parse_counters(after)
    if start is None or end is None:
        return absent(f"{runtime or 'the runtime'}'s /metrics has no speculative-decoding counters "
                      "(not started with a speculative config)")
    delta = {name: end.get(name, 0.0) - start.get(name, 0.0) for name in _NAMES if name in end}
    if any(value < 0 for value in delta.values()):
        return absent("the speculative-decoding counters went backwards (the server restarted during the run)")
    return summary(delta.get(DRAFTS) if DRAFTS in start else None, delta[DRAFT_TOKENS], delta[ACCEPTED])


def summary(drafts: float | None, draft_tokens: float, accepted: float) -> dict[str, Any]:
    """The stored figures of these counts (``details["spec_decode"]``)."""
    if draft_tokens <= 0:
        return absent("no tokens were drafted during the run")
    return {
        "acceptance_rate": round(accepted / draft_tokens, 6),
        "mean_acceptance_length": round(1 + accepted / drafts, 6) if drafts else None,
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "source": SOURCE, "reason": None,
    }


def absent(reason: str) -> dict[str, Any]:
    """No acceptance figures, and why."""
    return {"acceptance_rate": None, "mean_acceptance_length": None, "reason": reason}


def combined(runs: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """Repeated runs together: their counts summed; None when no run was scraped; absent with the
    first run's reason when none measured any."""
    seen = [run for run in runs if run is not None]
    if not seen:
        return None
    measured = [run for run in seen if run.get("acceptance_rate") is not None]
    if not measured:
        return dict(seen[0])
    drafts = [run.get("drafts") for run in measured]
    return summary(None if None in drafts else sum(drafts),  # type: ignore[arg-type]
                   sum(run["draft_tokens"] for run in measured), sum(run["accepted_tokens"] for run in measured))
