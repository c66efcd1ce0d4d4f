"""Statistics over repeated runs of one benchmark cell: mean ± std, outliers, a CI.

One run of a cell gives one figure (say, its average tokens per second); a matrix
that asks for ``runs: 5`` or ``runs: {until_cv: 2%, max: 10}`` gives a short list
of them, and this module says how much to trust their mean. It follows seed 003
(the RUCKUS agent's multi-run jobs): the first, cold run is reported apart from
the warm ones, and the warm runs are summarised as mean ± sample standard
deviation with the outlying runs named by index. Pass only the warm runs here.

Outliers: Tukey's fences, not seed 003's z-score
------------------------------------------------
RUCKUS flags a run whose value lies more than two sample standard deviations
from the mean (``agent/src/ruckus_agent/core/agent.py``,
``_calculate_multi_run_statistics``: ``abs(val - mean) > 2 * stdev``). With the
handful of runs a benchmark can afford that rule cannot fire: a value's
distance from the sample mean is at most ``(n - 1) / sqrt(n)`` sample standard
deviations, which is below 2 for every n up to 5 (1.79 at n = 5). RUCKUS's own
test case, ``[1.0, 1.1, 1.2, 5.0]`` with 5.0 "the outlier", is one its rule
does not flag (z = 1.499). So a run here is an outlier when it lies beyond
Tukey's fences, more than 1.5 interquartile ranges below the first quartile or
above the third (quartiles by the same linear interpolation as
:func:`~pytest_gpubench.measure.results.percentile`). The fences do not depend on the
outlier's own pull on the mean and standard deviation, and they flag 5.0 above.
Below four runs no value can lie outside them, which is honest: three runs
cannot say which one is wrong.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from .results import percentile

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "RunStatistics",
    "format_mean_std",
    "tukey_outliers",
    "until_cv_reached",
]

#: Resamples of the bootstrap confidence interval: enough for a stable 95% interval
#: of a mean, and a few milliseconds for the run counts a matrix asks for.
BOOTSTRAP_RESAMPLES = 2000
#: Tukey's fence factor.
IQR_FACTOR = 1.5


class RunStatistics(BaseModel):
    """Summary of one figure over repeated runs, built by :meth:`from_values`.

    ``std`` is the sample standard deviation (n - 1), 0.0 for a single run; ``cv``
    is ``std / |mean|`` (None when the mean is 0); ``outliers`` are indices into
    ``values`` (Tukey's fences, see the module docstring); ``ci_low`` / ``ci_high``
    bound a percentile-bootstrap confidence interval of the mean at ``confidence``,
    degenerate (both equal to the value) for a single run.
    """

    model_config = ConfigDict(frozen=True)

    values: tuple[float, ...]
    n: int
    mean: float
    std: float
    cv: float | None
    min: float
    max: float
    outliers: tuple[int, ...] = ()
    ci_low: float
    ci_high: float
    confidence: float = Field(default=0.95, gt=0, lt=1)

    @classmethod
    def from_values(
        cls,
        values: Sequence[float],
        *,
        confidence: float = 0.95,
        resamples: int = BOOTSTRAP_RESAMPLES,
        seed: int = 0,
    ) -> RunStatistics:
        """Statistics of ``values`` (one per run, in run order).

        The bootstrap draws ``resamples`` resamples with ``random.Random(seed)``, so
        the same values always give the same interval. An empty list or a
        non-finite value is a ``ValueError``: a run without a figure must be
        dropped (and said so) by the caller, not averaged as zero.
        """
        data = tuple(float(v) for v in values)
        if not data:
            raise ValueError("RunStatistics needs at least one run")
        if not all(math.isfinite(v) for v in data):
            raise ValueError(f"run values must be finite numbers, got {data}")
        mean = statistics.fmean(data)
        std = statistics.stdev(data) if len(data) > 1 else 0.0
        low, high = bootstrap_mean_ci(data, confidence=confidence, resamples=resamples, seed=seed)
        return cls(
            values=data,
            n=len(data),
            mean=mean,
            std=std,
            cv=std / abs(mean) if mean != 0 else None,
            min=min(data),
            max=max(data),
            outliers=tukey_outliers(data),
            ci_low=low,
            ci_high=high,
            confidence=confidence,
        )


def tukey_outliers(values: Sequence[float], factor: float = IQR_FACTOR) -> tuple[int, ...]:
    """Indices of the values outside ``[Q1 - factor*IQR, Q3 + factor*IQR]``."""
    if len(values) < 4:
        return ()  # no value can fall outside the fences of three or fewer
    q1, q3 = percentile(values, 25), percentile(values, 75)
    spread = factor * (q3 - q1)
    low, high = q1 - spread, q3 + spread
    return tuple(i for i, v in enumerate(values) if v < low or v > high)


def bootstrap_mean_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of ``values``.

    Draws ``resamples`` samples of the same size with replacement and takes the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of their means.
    Deterministic for a given ``seed``. One value gives ``(value, value)``.
    """
    if not values:
        raise ValueError("a confidence interval needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    n = len(values)
    if n == 1:
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    means = [math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples)]
    tail = (1 - confidence) / 2 * 100
    return percentile(means, tail), percentile(means, 100 - tail)


def format_mean_std(stats: RunStatistics, unit: str = "") -> str:
    """``"41.6 ± 0.4"`` (or ``"41.6 ± 0.4 tok/s"`` with a unit).

    Both numbers get the decimals that show the standard deviation to one
    significant digit, and at least one: more digits than the spread would be
    noise, fewer would hide it.
    """
    decimals = 1
    if stats.std > 0:
        decimals = min(6, max(1, -math.floor(math.log10(stats.std))))
    text = f"{stats.mean:.{decimals}f} ± {stats.std:.{decimals}f}"
    return f"{text} {unit}" if unit else text


def until_cv_reached(values: Sequence[float], bound: float, max_runs: int, min_runs: int = 3) -> bool:
    """Whether a ``runs: {until_cv: bound, max: max_runs}`` loop may stop now.

    True once ``max_runs`` runs are done, or once at least ``min_runs`` are and
    the coefficient of variation of ``values`` is at most ``bound`` (a fraction:
    2% is 0.02). A mean of zero never meets a CV bound. ``min_runs`` below 2 is
    refused, since one run has no spread to judge.
    """
    if bound <= 0:
        raise ValueError(f"the CV bound must be positive (2% is 0.02), got {bound}")
    if min_runs < 2:
        raise ValueError(f"min_runs must be at least 2, got {min_runs}")
    if max_runs < min_runs:
        raise ValueError(f"max_runs ({max_runs}) must not be below min_runs ({min_runs})")
    if len(values) >= max_runs:
        return True
    if len(values) < min_runs:
        return False
    mean = statistics.fmean(values)
    if mean == 0:
        return False
    return statistics.stdev(values) / abs(mean) <= bound
