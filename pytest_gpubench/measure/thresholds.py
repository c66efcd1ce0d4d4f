"""SLOs and thresholds: what a cell's benchmark must meet, and checking it.

A matrix sets ``slo:`` (the per-request bounds a request must meet to count
towards goodput) and ``thresholds:`` (the bounds the whole benchmark must meet for
its test to pass) in the file and in rows; a row's keys replace the file's one by
one. :func:`check_thresholds` compares measured figures with a cell's
:class:`Thresholds` and returns a :class:`Violation` per bound missed, each of
which reads as one sentence (``min_tps: measured 38.2 tok/s, below the threshold
of 40 tok/s``). No pytest here: the plugin turns violations into failures.

``max_error_rate`` has a default, :data:`DEFAULT_MAX_ERROR_RATE`: a run in which most
requests failed is no measurement, whatever its throughput says (one cell logged
68,658 errors and read as a success at 34.8 tok/s). Missing that default bound marks
the cell ``partial`` (seed 001's status for a run with errors: what was measured is
kept); a bound the matrix sets fails the cell like any threshold; ``null`` removes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator

from ..matrix.fields import StrictModel, fraction, invalid, number_text, positive
from ..matrix.yaml_errors import describe

#: ``thresholds.max_error_rate`` when the matrix sets none: more than half the measured requests
#: failed, and the run is no measurement (the cell ends ``partial``).
DEFAULT_MAX_ERROR_RATE = 0.5

TTFT_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
"""The TTFT percentiles ``thresholds.ttft_percentile`` may name."""

Milliseconds = Annotated[float | None, positive("a number of milliseconds")]
TokensPerSecond = Annotated[float | None, positive("a number of tokens per second")]


def _rate(value: Any) -> float | None:
    if value is None:
        return None
    return fraction(value, "must be a fraction from 0 to 1 or a percentage such as '1%' "
                           "(or null for none)")


Rate = Annotated[float | None, BeforeValidator(_rate)]


class Slo(StrictModel):
    """``slo:``: a request meets the SLO (and counts towards goodput) within every bound set."""

    ttft_ms: Milliseconds = None
    tpot_ms: Milliseconds = None
    e2e_ms: Milliseconds = None

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


class Thresholds(StrictModel):
    """``thresholds:``: the bounds a cell's benchmark must meet for its test to pass."""

    min_tps: TokensPerSecond = None
    max_ttft_ms: Milliseconds = None
    ttft_percentile: int = 95
    max_error_rate: Rate = DEFAULT_MAX_ERROR_RATE
    min_match_rate: Rate = None

    @field_validator("ttft_percentile", mode="before")
    @classmethod
    def _percentile(cls, value: Any) -> int:
        if isinstance(value, bool) or value not in TTFT_PERCENTILES:
            shown = ", ".join(map(str, TTFT_PERCENTILES))
            raise invalid(f"must be one of {shown} (the TTFT percentile max_ttft_ms bounds); "
                          f"got {describe(value)}")
        return int(value)

    @property
    def is_set(self) -> bool:
        """Whether the matrix set a bound (the default ``max_error_rate`` is not one it set)."""
        return any(v is not None for v in (self.min_tps, self.max_ttft_ms, self.min_match_rate)) or (
            self.error_rate_set and self.max_error_rate is not None)

    @property
    def error_rate_set(self) -> bool:
        """Whether ``max_error_rate`` came from the matrix (a value or null), not the default."""
        return "max_error_rate" in self.model_fields_set


def merged(base: StrictModel, row: StrictModel | None) -> Any:
    """``base`` with the keys ``row`` sets (null included) replacing its own."""
    if row is None:
        return base
    return base.model_copy(update={key: getattr(row, key) for key in row.model_fields_set})


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
