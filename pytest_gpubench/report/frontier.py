"""Frontiers across cells: throughput per GPU and billed $/M tokens against interactivity, and the cost at a target.

For one model and workload, every GPU x provider x runtime is a :class:`Curve`: the points it was
measured at (a ``concurrency: sweep`` cell has several, a cell at one load one; the result's
``details["frontier"]``, or for an older result one point made from ``details["metrics"]``,
:func:`stored_points`). Of those points the **non-dominated** ones (:func:`non_dominated`: no other
point is both at least as interactive and at least as good) make the curve's frontier, sorted by
interactivity: a monotone line (throughput falls, cost rises as interactivity grows). Between two
adjacent frontier points a figure is read linearly (:func:`value_at`); beyond the most interactive
point nothing is read (never extrapolated): the target is "not reached".

:func:`answer` answers "at >= X tokens/s per user, which curve is cheapest per million output tokens,
and by how much over the runner-up" for one group of curves. Interactivity is the primary definition,
``tpot_interactivity`` (1000 / TPOT p50; docs/metrics.md, "Frontiers"). The costs are the billed price
of the measurement's session (:attr:`FrontierPoint.cost_per_million_tokens`); the setup a user pays
once per session (provision, SSH, runtime setup, model pull) is :attr:`Curve.setup_seconds`, never
folded in. Plain functions, no I/O: :mod:`.gather` builds the groups, :mod:`.frontier_view` shows them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..figures import cost_per_million_tokens
from ..measure.frontier import PRIMARY_INTERACTIVITY, FrontierPoint
from ..measure.metrics import DetailedMetrics

__all__ = ["SETUP_STAGES", "Curve", "FrontierGroup", "Standing", "TargetAnswer", "answer", "non_dominated",
           "setup_seconds", "slo_targets", "stored_points", "value_at"]

#: The stages a user pays once per session before anything is measured (errors.Stage values).
SETUP_STAGES = ("provision", "ssh_wait", "ssh_connect", "runtime_setup", "model_pull")

Figure = Callable[[FrontierPoint], "float | None"]


def _interactivity(point: FrontierPoint) -> float | None:
    return point.interactivity(PRIMARY_INTERACTIVITY)


def _throughput(point: FrontierPoint) -> float | None:
    return point.output_tokens_per_second_per_gpu


def _cost(point: FrontierPoint) -> float | None:
    return point.cost_per_million_tokens


def non_dominated(points: Iterable[FrontierPoint], figure: Figure = _throughput, *,
                  lower_is_better: bool = False) -> list[FrontierPoint]:
    """The points no other point dominates, most interactive last.

    A point is dominated when another is at least as interactive and at least as good on ``figure``
    (higher throughput; lower cost with ``lower_is_better``), and strictly better in one of the two.
    Points without interactivity or without the figure take no part. Of equal points the first stays.
    """
    sign = -1.0 if lower_is_better else 1.0
    usable = [(x, sign * y, p) for p in points if (x := _interactivity(p)) is not None and x > 0
              and (y := figure(p)) is not None]
    # Most interactive first; at equal interactivity the best figure first: a point is kept when
    # its figure beats every more interactive point's.
    usable.sort(key=lambda item: (-item[0], -item[1]))
    kept: list[FrontierPoint] = []
    best: float | None = None
    for _, value, point in usable:
        if best is None or value > best:
            kept.append(point)
            best = value
    return kept[::-1]


def value_at(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """``curve``'s figure at interactivity ``target``: ``curve`` is (interactivity, figure) of a frontier,
    interactivity ascending. Linear between the two adjacent points around ``target``; below the least
    interactive point, that point's figure (a measured point beyond the target meets it); above the most
    interactive one None: the curve does not reach ``target`` and nothing is extrapolated."""
    if not curve or target > curve[-1][0]:
        return None
    if target <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in pairwise(curve):
        if x0 <= target <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (target - x0) / (x1 - x0)
    return None  # unreachable for a sorted curve


class Curve(BaseModel):
    """One GPU x provider x runtime of a model and workload: its measured points."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    provider: str
    runtime: str
    #: ``RTX 4090 / vastai`` (``/ vllm`` for another runtime than the default): how charts and tables name it.
    label: str
    points: list[FrontierPoint]
    #: The billed $/h of the session the points were measured on (all its GPUs); None: unknown.
    price_per_hour: float | None = None
    #: Seconds of provision, SSH, runtime setup and model pull (:data:`SETUP_STAGES`) its session took
    #: before the first measurement, paid once per session; None: not recorded.
    setup_seconds: float | None = None
    #: Why its sweep stopped (``details["frontier"]["stop_reason"]``), "" for a cell at one load.
    stop_reason: str = ""
    #: ``frontier``: the points came from ``details["frontier"]``; ``metrics``: made from an older
    #: result's ``details["metrics"]``.
    source: str = "frontier"

    @property
    def throughput_frontier(self) -> list[FrontierPoint]:
        return non_dominated(self.points, _throughput)

    @property
    def cost_frontier(self) -> list[FrontierPoint]:
        return non_dominated(self.points, _cost, lower_is_better=True)

    @property
    def best_interactivity(self) -> float | None:
        """The most interactive measured point's interactivity (tokens/s per user)."""
        return max((x for p in self.points if (x := _interactivity(p)) is not None), default=None)

    def cost_at(self, target: float) -> float | None:
        """Billed $/M output tokens at interactivity >= ``target``, read off the cost frontier."""
        return value_at([(_interactivity(p), _cost(p)) for p in self.cost_frontier], target)  # type: ignore[misc]

    def throughput_at(self, target: float) -> float | None:
        """Output tokens/s per GPU at interactivity >= ``target``, read off the throughput frontier."""
        return value_at([(_interactivity(p), _throughput(p)) for p in self.throughput_frontier],  # type: ignore[misc]
                        target)

    @property
    def setup_cost(self) -> float | None:
        """The setup's billed cost: ``setup_seconds`` at ``price_per_hour``."""
        if self.setup_seconds is None or self.price_per_hour is None:
            return None
        return self.setup_seconds / 3600 * self.price_per_hour


class Standing(BaseModel):
    """One curve at one target: its cost and throughput there."""

    model_config = ConfigDict(frozen=True)

    label: str
    cost_per_million_tokens: float
    output_tokens_per_second_per_gpu: float | None


class TargetAnswer(BaseModel):
    """The curves of one group at one target interactivity, cheapest first."""

    model_config = ConfigDict(frozen=True)

    target: float
    #: Where the target came from: ``--gpubench-target-interactivity`` or ``slo tpot_ms 50``.
    source: str
    ranked: list[Standing]
    #: (label, best interactivity it reached) of the curves that stop below the target.
    not_reached: list[tuple[str, float]]
    #: Labels of curves that reach the target but have no price (no $/M tokens to rank).
    unpriced: list[str] = []

    @property
    def cheapest(self) -> Standing | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Standing | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def margin(self) -> float | None:
        """How much more the runner-up costs per million output tokens, in $."""
        if self.cheapest is None or self.runner_up is None:
            return None
        return self.runner_up.cost_per_million_tokens - self.cheapest.cost_per_million_tokens

    @property
    def margin_share(self) -> float | None:
        """The margin as a share of the cheapest's cost (0.25: the runner-up costs 25% more)."""
        margin, cheapest = self.margin, self.cheapest
        if margin is None or cheapest is None or cheapest.cost_per_million_tokens <= 0:
            return None
        return margin / cheapest.cost_per_million_tokens

    @property
    def best_reached(self) -> float | None:
        """The highest interactivity any curve reached, when none reaches the target."""
        return max((best for _, best in self.not_reached), default=None)


class FrontierGroup(BaseModel):
    """One model and workload: its curves and the answers at each target."""

    model_config = ConfigDict(frozen=True)

    model: str
    #: What makes two results the same workload (prompts, max_tokens ...), "" when not recorded.
    workload: str
    #: The workload for people: ``max_tokens 256, prompts 3f2a9c1e``; "" when not recorded.
    workload_label: str
    curves: list[Curve]
    answers: list[TargetAnswer] = []

    @property
    def name(self) -> str:
        return self.model + (f" ({self.workload_label})" if self.workload_label else "")


def answer(curves: Sequence[Curve], target: float, source: str) -> TargetAnswer:
    """The curves at ``target`` tokens/s per user: those reaching it by cost (ties by label), those not."""
    ranked, not_reached, unpriced = [], [], []
    for curve in curves:
        best = curve.best_interactivity
        if best is None:
            continue
        if best < target:
            not_reached.append((curve.label, best))
            continue
        cost = curve.cost_at(target)
        if cost is None:
            unpriced.append(curve.label)
            continue
        ranked.append(Standing(label=curve.label, cost_per_million_tokens=cost,
                               output_tokens_per_second_per_gpu=curve.throughput_at(target)))
    ranked.sort(key=lambda s: (s.cost_per_million_tokens, s.label))
    return TargetAnswer(target=target, source=source, ranked=ranked,
                        not_reached=sorted(not_reached, key=lambda item: (-item[1], item[0])),
                        unpriced=sorted(unpriced))


# ------------------------------------------------------------ stored results


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stored_points(details: Mapping[str, Any], *, price_per_hour: float | None, gpus: int,
                  output_tokens_per_second: float | None = None) -> tuple[list[FrontierPoint], str, str]:
    """(points, source, stop_reason) of one stored result.

    ``details["frontier"]["points"]`` when the result has them (each validated: a malformed point is
    left out, it is data); otherwise one point made from ``details["metrics"]`` (a DetailedMetrics
    dump) at the result's price, its output throughput ``output_tokens_per_second`` when the metrics
    have none; ``ntpot_interactivity`` is unknown there (it needs the records). No points: ``[]``.
    """
    frontier = details.get("frontier")
    if isinstance(frontier, Mapping) and isinstance(frontier.get("points"), list):
        points = []
        for raw in frontier["points"]:
            try:
                points.append(FrontierPoint.model_validate(raw))
            except ValidationError:
                continue
        if points:
            return points, "frontier", str(frontier.get("stop_reason") or "")
    raw_metrics = details.get("metrics")
    if not isinstance(raw_metrics, Mapping):
        return [], "", ""
    try:
        metrics = DetailedMetrics.model_validate(raw_metrics)
    except ValidationError:
        return [], "", ""
    load = details.get("load") if isinstance(details.get("load"), Mapping) else {}
    rate = _number(load.get("rate"))
    concurrency = load.get("concurrency") if rate is None and isinstance(load.get("concurrency"), int) else None
    output = metrics.output_throughput_tps or output_tokens_per_second
    gpus = max(gpus, 1)
    point = FrontierPoint(
        concurrency=concurrency, rate=rate, gpus=gpus, requests=metrics.requests,
        duration_seconds=metrics.duration_seconds, output_tokens_per_second=output,
        output_tokens_per_second_per_gpu=output / gpus if output else None,
        request_throughput_rps=metrics.request_throughput_rps,
        tpot_interactivity=1000.0 / metrics.tpot_p50_ms if metrics.tpot_p50_ms else None,
        per_user_throughput=output / concurrency if output and concurrency else None,
        ttft_p50_ms=metrics.ttft_p50_ms, ttft_p95_ms=metrics.ttft_p95_ms, ttft_p99_ms=metrics.ttft_p99_ms,
        tpot_p50_ms=metrics.tpot_p50_ms, tpot_p95_ms=metrics.tpot_p95_ms, tpot_p99_ms=metrics.tpot_p99_ms,
        e2e_p50_ms=metrics.e2e_p50_ms, e2e_p95_ms=metrics.e2e_p95_ms, e2e_p99_ms=metrics.e2e_p99_ms,
        goodput_share=metrics.goodput_share, price_per_hour=price_per_hour,
        cost_per_million_tokens=cost_per_million_tokens(price_per_hour, output) if price_per_hour and output
        else None)
    return [point], "metrics", ""


def setup_seconds(stage_seconds: Mapping[str, float]) -> float | None:
    """The cell's seconds in :data:`SETUP_STAGES`; None when it recorded none of them."""
    found = [seconds for stage, seconds in stage_seconds.items() if stage in SETUP_STAGES
             and _number(seconds) is not None]
    return float(sum(found)) if found else None


def slo_targets(details: Mapping[str, Any]) -> list[float]:
    """The target interactivities a result's stored SLO implies: ``1000 / tpot_ms`` of the SLO kept
    in ``details["frontier"]``, ``details["sweep"]`` or ``details["metrics"]`` (goodput's)."""
    found = []
    for part in ("frontier", "sweep", "metrics"):
        section = details.get(part)
        slo = section.get("slo") if isinstance(section, Mapping) else None
        tpot = _number(slo.get("tpot_ms")) if isinstance(slo, Mapping) else None
        if tpot is not None and tpot > 0:
            found.append(round(1000.0 / tpot, 6))
    return sorted(set(found))
