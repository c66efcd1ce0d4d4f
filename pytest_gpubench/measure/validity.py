"""Is a result a valid GPU measurement, and is it fit to be kept? The checks, as plain functions.

A benchmark can complete and still not measure the GPU: a model that spills to
CPU memory (why 24 GB cards collapse to a few tokens/s on 32B models in the GPU
Shopper report), prompts silently cut to the context window, or a client that
counts tokens differently from the server. Each check says so, and why
(:func:`judge`); such a result is kept, flagged.

Sanity checks (:func:`result_problems`): figures that cannot be right fail the cell.
A result that does not validate, or whose figures cannot be right (nothing
succeeded, no token came out, a NaN or a negative time), must not become a row
others compare against (``--gpubench-compare`` takes baselines from the
manifest). It is kept raw instead, as a JSON file for inspection (:func:`keep_raw`), and the cell
fails at stage ``results`` with what was wrong.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..remote.readings import RequestRecord
from .results import BenchmarkResult

#: Ollama's default context window when the request sets no num_ctx.
DEFAULT_NUM_CTX = 2048
#: Rough characters per token of English text: enough to notice a prompt cut
#: to a fraction of itself, not to count tokens.
CHARS_PER_TOKEN = 4.0


class Validity(BaseModel):
    """Whether the figures describe the GPU, and what would make them not."""

    model_config = ConfigDict(frozen=True)

    valid: bool
    reasons: tuple[str, ...] = ()
    fully_in_gpu: bool | None = None
    size_bytes: int | None = None
    size_vram_bytes: int | None = None
    context_truncated: bool | None = None
    token_count_mismatch: bool | None = None


def context_truncated(records: Sequence[RequestRecord], prompts: Sequence[str],
                      num_ctx: int = DEFAULT_NUM_CTX) -> bool | None:
    """True when the server counted far fewer prompt tokens than were sent, or hit num_ctx.

    None when the server reported no prompt counts at all.
    """
    counted = [r for r in records if r.ok and r.prompt_tokens is not None and r.prompt_index < len(prompts)]
    if not counted:
        return None
    for record in counted:
        sent_estimate = len(prompts[record.prompt_index]) / CHARS_PER_TOKEN
        if record.prompt_tokens >= num_ctx or record.prompt_tokens < 0.5 * sent_estimate:
            return True
    return False


def token_count_mismatch(records: Sequence[RequestRecord]) -> bool | None:
    """True when client-counted and server-counted output tokens disagree noticeably."""
    pairs = [(r.output_tokens, r.eval_count) for r in records if r.ok and r.eval_count is not None]
    if not pairs:
        return None
    return any(abs(client - server) > max(2, 0.05 * server) for client, server in pairs)


def judge(records: Sequence[RequestRecord], prompts: Sequence[str],
          residency: dict[str, Any] | None) -> Validity:
    """All checks together; ``residency`` is what ``/api/ps`` said of the model."""
    reasons = []
    fully = residency.get("fully_in_gpu") if residency else None
    if fully is False:
        share = residency["size_vram"] / residency["size"] if residency.get("size") else 0.0
        reasons.append(f"model only {share:.0%} in GPU memory (size_vram < size): CPU offload")
    truncated = context_truncated(records, prompts)
    if truncated:
        reasons.append("prompts were truncated to the context window")
    mismatch = token_count_mismatch(records)
    if mismatch:
        reasons.append("client and server disagree on output token counts")
    return Validity(
        valid=not reasons,
        reasons=tuple(reasons),
        fully_in_gpu=fully,
        size_bytes=residency.get("size") if residency else None,
        size_vram_bytes=residency.get("size_vram") if residency else None,
        context_truncated=truncated,
        token_count_mismatch=mismatch,
    )


# ---------------------------------------- sanity: is a result fit to be kept?

#: Sections whose numbers are counts, rates, times or readings: never negative.
NON_NEGATIVE_SECTIONS = ("results", "gpu_stats")


def result_problems(result: BenchmarkResult) -> list[str]:
    """What makes ``result`` obviously invalid; empty when nothing does."""
    problems = []
    figures = result.results
    successful = figures.total_requests - figures.total_errors
    if successful <= 0:
        problems.append(f"no successful request ({figures.total_requests} measured, {figures.total_errors} failed)")
    elif figures.total_tokens <= 0:
        problems.append(f"no output tokens in {successful} successful requests")
    data = result.model_dump(mode="python")
    for name, value in _numbers(data):
        if not math.isfinite(value):
            problems.append(f"{name} is {value}")
        elif value < 0 and name.split(".", 1)[0] in NON_NEGATIVE_SECTIONS:
            problems.append(f"{name} is negative ({value:g})")
    return problems


def commonest_error(records: Iterable[RequestRecord]) -> str | None:
    """``the requests failed with: ERROR (n of m)``, the most frequent error of the measured requests
    (what a cell with no successful request failed of); None when none failed."""
    errors = Counter(r.error for r in records if not r.warmup and r.error)
    if not errors:
        return None
    error, count = errors.most_common(1)[0]
    return f"the requests failed with: {error} ({count} of {sum(errors.values())})"


def _numbers(data: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _numbers(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from _numbers(value, f"{prefix}[{index}]")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield prefix, float(data)


def keep_raw(path: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (the invalid result and what it was built from) as JSON; returns ``path``.

    NaN and infinities are written as JSON's common extension (``NaN``), so the
    file shows exactly what was wrong.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return path
