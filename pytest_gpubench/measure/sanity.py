"""Is a result fit to be kept? Sanity checks: figures that cannot be right fail the cell.

A result that does not validate, or whose figures cannot be right (nothing
succeeded, no token came out, a NaN or a negative time), must not become a row
others compare against (``--gpubench-compare`` takes baselines from the
manifest). It is kept raw instead, as a JSON file for inspection, and the cell
fails at stage ``results`` with what was wrong.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .results import BenchmarkResult
from ..remote.readings import RequestRecord

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
