"""The saturation sweep (``rate: sweep``): the highest request rate whose goodput meets the goal.

One cell, one session, one model load. A throughput probe (``probe_concurrency``
requests always in flight, GuideLLM's "throughput" strategy) bounds the rate from
above unless ``max_rate`` is given: no rate above what the server completes
flat out can be sustained. Then :class:`RateSearch` picks the rates:

1. the top rate: if its ``goodput_share`` meets the goal, that is the answer
   (met at the top; nothing higher was offered);
2. the bottom rate: if it misses, the goal is never met and the sweep stops
   early;
3. otherwise bisection in log space between the highest passing and the lowest
   failing rate, until they are within ``precision`` of each other or ``steps``
   rate steps have run.

Each step is a normal open-loop (Poisson) run at its rate, with its own records
(kept: a step's requests go to the store as a run's do). :func:`step_figures` is
what a step shows, with the figures' registered names (docs/metrics.md), and
:class:`SweepOutcome` the cell's answer: ``max_rate_meeting_slo`` and the step
measured there, whose output throughput and $/M tokens are the cell's headline.
No I/O here: ``run/cell_benchmark.py`` (``SweepRun``) runs the steps.

``concurrency: sweep`` is the closed-loop sweep of one cell: :class:`ConcurrencySearch`
doubles the requests in flight from 1 until the runtime saturates (a doubling raises
output throughput by less than ``min_growth``), goodput under the ``slo:`` falls below
the goal, or ``max_concurrency`` has run; a list of levels runs every level. Each step
is a frontier point (``measure/frontier.py``); ``ConcurrencySweepRun`` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..matrix.workload import DEFAULT_MAX_CONCURRENCY, DEFAULT_SPAN, SweepSpec, doubling_levels
from .metrics import detailed_metrics
from ..figures import cost_per_million_tokens
from ..remote.readings import RequestRecord
from ..matrix.thresholds import Slo

__all__ = ["ConcurrencySearch", "RateSearch", "SweepOutcome", "SweepStep", "step_figures", "sweep_identity"]


class RateSearch:
    """Chooses the next rate to try from the goodput of the rates tried so far.

    ``next_rate()`` is None when the search is over; ``record(rate, goodput_share)``
    reports a step. Noise cannot make it inconsistent: every new rate lies between
    the highest passing and the lowest failing rate seen, so the answer
    (:attr:`answer`, the highest passing rate) only rises.
    """

    def __init__(self, low: float, high: float, *, goal: float, precision: float, steps: int) -> None:
        if not 0 < low < high:
            raise ValueError(f"the search needs 0 < low < high; got {low} and {high}")
        self.low, self.high, self.goal, self.precision, self.steps = low, high, goal, precision, steps
        self.tried: list[tuple[float, float, bool]] = []  # (rate, goodput_share, met)
        self.passing: float | None = None  # highest rate that met the goal
        self.failing: float | None = None  # lowest rate that missed it

    @classmethod
    def of(cls, spec: SweepSpec, top: float) -> RateSearch:
        """The search a ``sweep:`` asks for, below ``top`` (``max_rate`` or the probe's rate)."""
        low = spec.min_rate if spec.min_rate is not None and spec.min_rate < top else top / DEFAULT_SPAN
        return cls(low, top, goal=spec.goal, precision=spec.precision, steps=spec.steps)

    def met(self, goodput_share: float | None) -> bool:
        return goodput_share is not None and goodput_share >= self.goal

    def record(self, rate: float, goodput_share: float | None) -> bool:
        """Note a step's goodput; returns whether it met the goal."""
        met = self.met(goodput_share)
        self.tried.append((rate, goodput_share if goodput_share is not None else 0.0, met))
        if met:
            self.passing = max(rate, self.passing or rate)
        else:
            self.failing = min(rate, self.failing or rate)
        return met

    @property
    def answer(self) -> float | None:
        """The highest rate that met the goal; None when none did."""
        return self.passing

    @property
    def stop_reason(self) -> str:
        """Why the search ended (or "" while it goes on)."""
        if not self.tried:
            return ""
        if self.passing is not None and self.passing >= self.high:
            return "met at the top rate"
        if self.failing is not None and self.failing <= self.low:
            return "missed at the lowest rate"
        if self.passing is not None and self.failing is not None \
                and self.failing <= self.passing * (1 + self.precision):
            return "within precision"
        if len(self.tried) >= self.steps:
            return "out of steps"
        return ""

    def next_rate(self) -> float | None:
        """The rate of the next step, or None when the search is over."""
        if self.stop_reason:
            return None
        if not self.tried:
            return self.high
        if self.passing is None:
            return self.low
        upper = self.failing if self.failing is not None else self.high
        return math.sqrt(self.passing * upper)


class ConcurrencySearch:
    """Chooses the next concurrency of a ``concurrency: sweep`` from the steps run so far.

    Doubling (no ``levels``): 1, 2, 4 ... up to ``max_concurrency`` (itself the last level
    when it is no power of two). After each step, the sweep stops when

    * output throughput grew by less than ``min_growth`` over the step before: the runtime
      is saturated, and :attr:`saturated_at` is the step before's concurrency, past which
      doubling the load buys (almost) nothing (a step with no output counts as 0 tokens/s);
    * ``slo_set`` and the step's goodput_share is below ``goal`` (no goodput: below it);
    * the last level has run (``max_concurrency`` reached).

    With ``levels`` every level runs, in order: the points the user asked for. Every step
    is a point of the frontier either way; ``next_concurrency()`` is None when it is over.
    """

    SATURATED = "saturated"
    SLO_MISSED = "slo missed"
    CAPPED = "max concurrency reached"
    LEVELS_DONE = "every level ran"

    def __init__(self, levels: Sequence[int] | None = None, *, max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
                 min_growth: float = 0.05, goal: float = 0.95, slo_set: bool = False) -> None:
        self.listed = levels is not None
        self.levels = tuple(sorted(levels)) if levels is not None else doubling_levels(max_concurrency)
        if not self.levels or self.levels[0] < 1:
            raise ValueError(f"a concurrency sweep needs levels of 1 or more; got {self.levels}")
        self.min_growth, self.goal, self.slo_set = min_growth, goal, slo_set
        self.tried: list[tuple[int, float, float | None]] = []  # (concurrency, output tok/s, goodput_share)
        self.stop_reason = ""
        self.saturated_at: int | None = None

    @classmethod
    def of(cls, spec: SweepSpec, slo_set: bool) -> ConcurrencySearch:
        """The search a ``sweep:`` asks for."""
        return cls(spec.concurrency, max_concurrency=spec.top_concurrency, min_growth=spec.min_growth,
                   goal=spec.goal, slo_set=slo_set)

    def met(self, goodput_share: float | None) -> bool | None:
        """Whether a step met the goal; None without an SLO (nothing to meet)."""
        if not self.slo_set:
            return None
        return goodput_share is not None and goodput_share >= self.goal

    def record(self, concurrency: int, output_tokens_per_second: float | None,
               goodput_share: float | None) -> bool | None:
        """Note a step; returns whether it met the goal (None without an SLO)."""
        output = output_tokens_per_second or 0.0
        met = self.met(goodput_share)
        previous = self.tried[-1] if self.tried else None
        self.tried.append((concurrency, output, goodput_share))
        if self.listed:
            if len(self.tried) >= len(self.levels):
                self.stop_reason = self.LEVELS_DONE
        elif met is False:
            self.stop_reason = self.SLO_MISSED
        elif previous is not None and not self.grew(previous[1], output):
            self.stop_reason, self.saturated_at = self.SATURATED, previous[0]
        elif len(self.tried) >= len(self.levels):
            self.stop_reason = self.CAPPED
        return met

    def grew(self, before: float, after: float) -> bool:
        """Whether output throughput grew by ``min_growth`` or more (from nothing: by anything)."""
        return after > 0 if before <= 0 else after >= before * (1 + self.min_growth)

    def next_concurrency(self) -> int | None:
        """The concurrency of the next step, or None when the sweep is over."""
        if self.stop_reason or len(self.tried) >= len(self.levels):
            return None
        return self.levels[len(self.tried)]


class SweepStep(BaseModel):
    """One step of a sweep as results and reports show it: the probe or a rate step.

    Figure names are the registry's (docs/metrics.md): ``rate`` is the offered
    request rate, ``request_throughput_rps`` the achieved one.
    """

    model_config = ConfigDict(frozen=True)

    step: int
    kind: Literal["probe", "rate"]
    rate: float | None = None
    concurrency: int | None = None
    run_index: int
    requests: int = 0
    duration_seconds: float = 0.0
    request_throughput_rps: float | None = None
    goodput_share: float | None = None
    output_tokens_per_second: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    #: The step's GPU energy (:func:`~pytest_gpubench.measure.metrics.energy_of`): None where no power
    #: reading fell in the step.
    joules_per_output_token: float | None = None
    output_tokens_per_second_per_watt: float | None = None
    #: Whether goodput_share met the goal (None for the probe, which is not judged).
    met: bool | None = None


def step_figures(records: Sequence[RequestRecord], duration_seconds: float, slo: Slo) -> dict[str, Any]:
    """A step's figures from its records, as :class:`SweepStep` fields."""
    metrics = detailed_metrics(records, duration_seconds, slo=slo if slo.is_set else None)
    return {"requests": metrics.requests, "duration_seconds": round(duration_seconds, 3),
            "request_throughput_rps": metrics.request_throughput_rps, "goodput_share": metrics.goodput_share,
            "output_tokens_per_second": metrics.output_throughput_tps,
            **{name: getattr(metrics, name) for name in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")}}


class SweepOutcome(BaseModel):
    """A finished sweep: its steps and the answer, as the result's ``details["sweep"]``."""

    model_config = ConfigDict(frozen=True)

    goal: float
    slo: Slo
    steps: list[SweepStep]
    #: The highest offered request rate whose goodput_share met the goal; None: none did.
    max_rate_meeting_slo: float | None
    #: Output throughput and $/M tokens of the step at that rate.
    output_tokens_per_second: float | None = None
    cost_per_million_tokens: float | None = None
    stop_reason: str = ""

    @classmethod
    def of(cls, search: RateSearch, steps: list[SweepStep], slo: Slo, price_per_hour: float | None) -> SweepOutcome:
        answer = search.answer
        step = next((s for s in steps if s.kind == "rate" and s.rate == answer), None)
        output = step.output_tokens_per_second if step is not None else None
        cost = cost_per_million_tokens(price_per_hour, output) if price_per_hour and output else None
        return cls(goal=search.goal, slo=slo, steps=steps, max_rate_meeting_slo=answer,
                   output_tokens_per_second=output, cost_per_million_tokens=cost, stop_reason=search.stop_reason)

    @property
    def answer_step(self) -> SweepStep | None:
        """The step measured at ``max_rate_meeting_slo``; None when no rate met the goal."""
        return next((s for s in self.steps if s.kind == "rate" and s.rate == self.max_rate_meeting_slo
                     and self.max_rate_meeting_slo is not None), None)

    @property
    def closest_step(self) -> SweepStep | None:
        """The answer step, else the rate step with the best goodput (what the headline shows then)."""
        rated = [s for s in self.steps if s.kind == "rate"]
        return self.answer_step or max(rated, key=lambda s: (s.goodput_share or 0.0, -(s.rate or 0.0)),
                                       default=None)

    def missed(self) -> str:
        """Why the sweep found no rate, as a failure message (call only when none met the goal)."""
        best = self.closest_step
        where = (f"; best {best.goodput_share:.1%} at {best.rate:g} req/s"
                 if best is not None and best.goodput_share is not None and best.rate is not None else "")
        return f"saturation sweep: no rate met goodput_share >= {self.goal:g} under the SLO{where}"


def sweep_identity(spec: SweepSpec, slo: Slo, kind: str = "rate") -> str:
    """What makes two sweeps' answers comparable, for the workload fingerprint: the goal, the SLO
    and the search's bounds (``sweep goodput_share >= 0.95 ttft_ms<=500 rates 0.5-probe``;
    a concurrency sweep: ``concurrency sweep ... levels 1-64 growth 0.05`` or its list)."""
    if kind == "concurrency":
        slo_text = " ".join(f"{key}<={value:g}" for key, value in slo.model_dump().items() if value is not None)
        levels = (",".join(map(str, spec.concurrency)) if spec.concurrency is not None
                  else f"1-{spec.top_concurrency} growth {spec.min_growth:g}")
        return " ".join(part for part in ("concurrency sweep", spec.goal_text, slo_text, "levels", levels) if part)
    bounds = (f"{spec.min_rate:g}" if spec.min_rate is not None else "top/10") + "-" + \
        (f"{spec.max_rate:g}" if spec.max_rate is not None else f"probe c{spec.probe_concurrency}")
    slo_text = " ".join(f"{key}<={value:g}" for key, value in slo.model_dump().items() if value is not None)
    return f"sweep {spec.goal_text} {slo_text} rates {bounds}"
