"""``rate: sweep`` and its ``sweep:`` settings: the saturation sweep of one cell.

A sweep cell looks for the highest request rate whose goodput (docs/metrics.md,
``goodput_share``) still meets a goal under the cell's ``slo:``. How it searches
is ``measure/saturation.py``; here is only what a matrix may write
(docs/workloads.md, "Saturation sweep"):

.. code-block:: yaml

    workload:
      rate: sweep
      sweep: {min_rate: 0.5, max_rate: 8, steps: 8, precision: 5%, goal: goodput_share >= 0.95, duration: 60s}
    slo: {ttft_ms: 500, tpot_ms: 50}
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, model_validator

from .fields import MAX_CONCURRENCY, MAX_RATE, Seconds, StrictModel, fraction, invalid, number_text, whole
from .yaml_errors import describe

#: ``rate: sweep``: the value of ``workload.rate`` that asks for a saturation sweep.
SWEEP = "sweep"
DEFAULT_GOAL = 0.95
DEFAULT_PRECISION = 0.05
DEFAULT_STEPS = 8
DEFAULT_PROBE_CONCURRENCY = 32
#: Without ``min_rate``, the search starts this many times below the top rate.
DEFAULT_SPAN = 10.0

_GOAL_RE = re.compile(r"\s*goodput_share\s*>=\s*(?P<value>\S+)\s*")


def _rate_bound(value: Any) -> float | None:
    if value is None:
        return None
    allowed = f"must be a number of requests per second, more than 0 and at most {MAX_RATE:g} (or null)"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_RATE
    if not ok:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def _goal(value: Any) -> float:
    allowed = ("must be the goodput_share a rate must reach: a fraction above 0 and at most 1, a percentage "
               "such as '95%', or 'goodput_share >= 0.95'")
    if isinstance(value, str):
        found = _GOAL_RE.fullmatch(value)
        if found:
            text = found["value"]
            try:
                value = text if text.endswith("%") else float(text)
            except ValueError:
                raise invalid(f"{allowed}; got {describe(value)}") from None
    return fraction(value, allowed, above_zero=True)


def _precision(value: Any) -> float:
    number = fraction(value, "must be the relative precision of the answer: a fraction above 0 and below 1, "
                             "or a percentage such as '5%'", above_zero=True)
    if number >= 1:
        raise invalid(f"must be below 1 (100%): the search stops once its bracket is that close; got "
                      f"{describe(value)}")
    return number


RateBound = Annotated[float | None, BeforeValidator(_rate_bound)]
Goal = Annotated[float, BeforeValidator(_goal)]
Precision = Annotated[float, BeforeValidator(_precision)]


class SweepSpec(StrictModel):
    """``workload.sweep``: the bounds, stopping rules and goal of a ``rate: sweep`` cell.

    ``max_rate`` None: a throughput probe (``probe_concurrency`` requests in flight)
    bounds the rate from above; ``min_rate`` None: ``max_rate / 10``. The search
    stops after ``steps`` rate steps or once the passing and failing rates are within
    ``precision`` of each other. ``duration`` None: each step runs the workload's
    ``duration``.
    """

    min_rate: RateBound = None
    max_rate: RateBound = None
    steps: Annotated[int, whole(1, 50)] = DEFAULT_STEPS
    precision: Precision = DEFAULT_PRECISION
    goal: Goal = DEFAULT_GOAL
    duration: Seconds | None = None
    probe_concurrency: Annotated[int, whole(1, MAX_CONCURRENCY)] = DEFAULT_PROBE_CONCURRENCY

    @model_validator(mode="after")
    def _ordered(self) -> SweepSpec:
        if self.min_rate is not None and self.max_rate is not None and self.min_rate >= self.max_rate:
            raise invalid(f"min_rate ({number_text(self.min_rate)}/s) must be below max_rate "
                          f"({number_text(self.max_rate)}/s): the sweep searches between them")
        return self

    @property
    def goal_text(self) -> str:
        """``goodput_share >= 0.95``: the goal as the docs and reports write it."""
        return f"goodput_share >= {self.goal:g}"


def sweep_problem(rate: Any, sweep: SweepSpec | None, slo_set: bool, repeated: bool = False) -> str | None:
    """Why a (merged) workload's ``rate`` and ``sweep`` cannot run with this SLO (and ``runs:``
    other than one when ``repeated``), or None."""
    if rate == SWEEP and not slo_set:
        return ("`rate: sweep` needs an `slo:` (ttft_ms, tpot_ms or e2e_ms): the sweep finds the highest "
                "rate whose goodput_share under that SLO meets its goal")
    if rate == SWEEP and repeated:
        return ("`runs:` does not apply to `rate: sweep`: each step of the sweep is one run; "
                "drop `runs:` or use `sweep.steps`")
    if sweep is not None and rate != SWEEP:
        return "`sweep:` settings apply only with `rate: sweep`; set `rate: sweep` or drop `sweep:`"
    return None
