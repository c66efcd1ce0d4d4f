"""Checking a benchmark against its thresholds.

:func:`check_thresholds` compares measured figures with a cell's
:class:`~pytest_gpubench.matrix.thresholds.Thresholds` (the matrix's ``thresholds:``,
``matrix/thresholds.py``) and returns a :class:`Violation` per bound missed, each of
which reads as one sentence (``min_tps: measured 38.2 tok/s, below the threshold
of 40 tok/s``). No pytest here: the plugin turns violations into failures. The
default ``max_error_rate`` missed marks the cell ``partial`` (``Violation.default``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..matrix.fields import number_text
from ..matrix.thresholds import Thresholds

# ---------------------------------------------------------------------------- checking


_UNITS = {"min_tps": " tok/s", "max_ttft_ms": " ms", "max_error_rate": "%", "min_match_rate": "%"}
_DIGITS = {"min_tps": 1, "max_ttft_ms": 0, "max_error_rate": 2, "min_match_rate": 1}
_UNMEASURED = {
    "min_tps": "no request produced tokens",
    "max_ttft_ms": "no request reported its first token",
    "max_error_rate": "no request was made",
    "min_match_rate": "no answer to a prompt with `expect` answers was recorded; "
                      "use `prompts: quality` or give prompts `expect`",
}


class Violation(BaseModel):
    """One threshold a benchmark missed; ``measured`` is None when it could not be measured."""

    model_config = ConfigDict(frozen=True)

    metric: Literal["min_tps", "max_ttft_ms", "max_error_rate", "min_match_rate"]
    threshold: float
    measured: float | None
    percentile: int | None = None
    #: The default ``max_error_rate``, which the matrix did not set: the cell is ``partial``, not failed.
    default: bool = False

    @property
    def label(self) -> str:
        """``min_tps``, or ``max_ttft_ms (p95)``."""
        return f"{self.metric} (p{self.percentile})" if self.percentile is not None else self.metric

    def __str__(self) -> str:
        unit = _UNITS[self.metric]
        scale = 100 if unit == "%" else 1
        threshold = _shown(self.threshold * scale, 6)
        if self.measured is None:
            return (f"{self.label}: could not be measured ({_UNMEASURED[self.metric]}); "
                    f"the threshold is {threshold}{unit}")
        measured = self.measured * scale
        digits = _DIGITS[self.metric]
        shown = _shown(measured, digits)
        while shown == threshold and digits < 6:  # 39.96 must not read as 40 against 40
            digits += 1
            shown = _shown(measured, digits)
        side = "below" if self.metric.startswith("min_") else "above"
        if self.default:
            return (f"{self.label}: {shown}{unit} of the measured requests failed, above the default error budget "
                    f"of {threshold}{unit}: the run is mostly errors, not a measurement (thresholds.max_error_rate "
                    f"sets another budget, null none)")
        return f"{self.label}: measured {shown}{unit}, {side} the threshold of {threshold}{unit}"


def _shown(value: float, digits: int) -> str:
    return number_text(round(value, digits))


def check_thresholds(
    thresholds: Thresholds,
    *,
    tps: float | None,
    ttft_ms_by_percentile: Mapping[int, float | None],
    error_rate: float | None,
    match_rate: float | None,
) -> list[Violation]:
    """Every bound of ``thresholds`` the measured figures miss, in a fixed order.

    A bound equal to the measurement is met. A figure that is None (or NaN) for a
    bound that is set is a violation with ``measured=None``: it could not be
    measured (a match rate without prompts that have ``expect``, for one).
    """
    ttft = ttft_ms_by_percentile.get(thresholds.ttft_percentile)
    checks: Sequence[tuple[str, float | None, float | None, int | None]] = (
        ("min_tps", thresholds.min_tps, tps, None),
        ("max_ttft_ms", thresholds.max_ttft_ms, ttft, thresholds.ttft_percentile),
        ("max_error_rate", thresholds.max_error_rate, error_rate, None),
        ("min_match_rate", thresholds.min_match_rate, match_rate, None),
    )
    violations = []
    for metric, bound, value, percentile in checks:
        if bound is None:
            continue
        if value is not None and math.isnan(value):
            value = None
        default = metric == "max_error_rate" and not thresholds.error_rate_set
        if default and value is None:
            continue  # the default budget judges errors among requests made, not their absence
        missed = value is None or (value < bound if metric.startswith("min_") else value > bound)
        if missed:
            violations.append(Violation(metric=metric, threshold=bound, measured=value, percentile=percentile,
                                        default=default))
    return violations


def describe_violations(violations: Sequence[Violation]) -> str:
    """All violations on one line, the first first; empty when there are none."""
    return "; ".join(str(v) for v in violations)
