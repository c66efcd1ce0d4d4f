"""SLOs and thresholds as a matrix writes them: ``slo:`` and ``thresholds:``.

A matrix sets ``slo:`` (the per-request bounds a request must meet to count
towards goodput) and ``thresholds:`` (the bounds the whole benchmark must meet for
its test to pass) in the file and in rows; a row's keys replace the file's one by
one (:func:`merged`). Checking measured figures against them is
:mod:`pytest_gpubench.measure.thresholds`.

``max_error_rate`` has a default, :data:`DEFAULT_MAX_ERROR_RATE`: a run in which most
requests failed is no measurement, whatever its throughput says (one cell logged
68,658 errors and read as a success at 34.8 tok/s). Missing that default bound marks
the cell ``partial`` (seed 001's status for a run with errors: what was measured is
kept); a bound the matrix sets fails the cell like any threshold; ``null`` removes it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, field_validator

from .fields import StrictModel, fraction, invalid, positive
from .yaml_errors import describe

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
