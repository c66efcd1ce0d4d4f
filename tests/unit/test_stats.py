"""Tests of pytest_gpubench.measure.results: repeated-run statistics on hand-checked samples."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from pytest_gpubench.measure.results import (
    RunStatistics,
    bootstrap_mean_ci,
    format_mean_std,
    tukey_outliers,
    until_cv_reached,
)

RUNS = [41.2, 41.6, 42.0, 41.5, 41.7]  # tokens/s of five warm runs


# ------------------------------------------------------------- mean, std, CV


def test_mean_std_cv_of_known_runs():
    s = RunStatistics.from_values(RUNS)
    assert s.n == 5 and s.values == tuple(RUNS)
    assert s.mean == pytest.approx(41.6)
    # squared deviations .16 + 0 + .16 + .01 + .01 = .34, over n - 1 = 4
    assert s.std == pytest.approx(math.sqrt(0.34 / 4))
    assert s.std == pytest.approx(statistics.stdev(RUNS))
    assert s.cv == pytest.approx(math.sqrt(0.085) / 41.6)
    assert (s.min, s.max) == (41.2, 42.0)
    assert s.outliers == ()


def test_single_run_is_degenerate_not_an_error():
    s = RunStatistics.from_values([37.5])
    assert (s.n, s.mean, s.std, s.cv) == (1, 37.5, 0.0, 0.0)
    assert (s.ci_low, s.ci_high) == (37.5, 37.5)
    assert s.outliers == ()


def test_zero_mean_has_no_cv():
    assert RunStatistics.from_values([-1.0, 1.0]).cv is None


@pytest.mark.parametrize("values", [[], [1.0, float("nan")], [float("inf")]])
def test_rejects_empty_and_non_finite(values):
    with pytest.raises(ValueError):
        RunStatistics.from_values(values)


def test_run_statistics_is_frozen():
    s = RunStatistics.from_values(RUNS)
    with pytest.raises(ValueError):
        s.mean = 0.0


# ------------------------------------------------------------------ outliers


def test_tukey_flags_seed_003_example_that_two_sigma_misses():
    # RUCKUS's own test names 5.0 the outlier of these runs; its |z| > 2 rule
    # cannot flag it (|z| is at most (n - 1) / sqrt(n) = 1.5 for n = 4).
    values = [1.0, 1.1, 1.2, 5.0]
    z = (5.0 - statistics.fmean(values)) / statistics.stdev(values)
    assert 1.49 < z <= 1.5
    # Q1 = 1.075, Q3 = 2.15, upper fence = 2.15 + 1.5 * 1.075 = 3.7625
    assert RunStatistics.from_values(values).outliers == (3,)


def test_tukey_flags_low_outliers_and_both_sides():
    assert tukey_outliers([10.0, 50.0, 51.0, 52.0, 53.0]) == (0,)
    # Q1 = 40, Q3 = 41, fences 38.5 and 42.5
    assert tukey_outliers([40.0, 1.0, 40.0, 41.0, 41.0, 90.0]) == (1, 5)


def test_tukey_fence_is_exclusive():
    # Q1 = 2, Q3 = 4 (IQR 2), upper fence 7 exactly: 7 stays in, 7.01 is out
    assert tukey_outliers([1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 2.0, 4.0, 3.0]) == ()
    assert tukey_outliers([1.0, 2.0, 3.0, 4.0, 5.0, 7.01, 2.0, 4.0, 3.0]) == (5,)


def test_three_runs_never_have_outliers():
    assert tukey_outliers([1.0, 1.0, 1000.0]) == ()


# ------------------------------------------------------------- bootstrap CI


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    a = RunStatistics.from_values(RUNS)
    b = RunStatistics.from_values(list(RUNS))
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert a.min <= a.ci_low < a.mean < a.ci_high <= a.max
    assert a.confidence == 0.95
    # the seed is what makes it repeatable: another seed, another (close) interval
    rng = random.Random(3)
    values = [rng.uniform(40, 43) for _ in range(20)]
    assert bootstrap_mean_ci(values) == bootstrap_mean_ci(values, seed=0)
    assert bootstrap_mean_ci(values, seed=1) != bootstrap_mean_ci(values)


def test_bootstrap_ci_matches_normal_approximation_for_many_runs():
    rng = random.Random(7)
    values = [rng.gauss(100.0, 5.0) for _ in range(200)]
    low, high = bootstrap_mean_ci(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert (low + high) / 2 == pytest.approx(statistics.fmean(values), abs=0.2)


def test_bootstrap_ci_rejects_bad_arguments():
    with pytest.raises(ValueError):
        bootstrap_mean_ci([])
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0, 2.0], resamples=0)


# ----------------------------------------------------------------- formatting


def test_format_mean_std():
    s = RunStatistics.from_values([41.2, 41.6, 42.0])  # std exactly 0.4
    assert format_mean_std(s) == "41.6 ± 0.4"
    assert format_mean_std(s, "tok/s") == "41.6 ± 0.4 tok/s"
    fine = RunStatistics.from_values([41.61, 41.62, 41.66])  # std 0.026
    assert format_mean_std(fine) == "41.63 ± 0.03"
    coarse = RunStatistics.from_values([100.0, 120.0, 140.0])  # std 20
    assert format_mean_std(coarse, "ms") == "120.0 ± 20.0 ms"
    assert format_mean_std(RunStatistics.from_values([5.0])) == "5.0 ± 0.0"


# ------------------------------------------------------------- until_cv_reached


def test_until_cv_waits_for_min_runs_then_checks_the_bound():
    steady = [100.0, 101.0, 99.0]  # CV 1%
    assert not until_cv_reached(steady[:2], 0.02, max_runs=10)
    assert until_cv_reached(steady, 0.02, max_runs=10)
    assert not until_cv_reached(steady, 0.005, max_runs=10)
    assert until_cv_reached(steady, 0.01, max_runs=10)  # the bound is inclusive


def test_until_cv_stops_at_max_runs_whatever_the_spread():
    noisy = [10.0, 50.0, 90.0, 20.0]
    assert not until_cv_reached(noisy, 0.02, max_runs=5)
    assert until_cv_reached(noisy + [70.0], 0.02, max_runs=5)
    assert not until_cv_reached([0.0, 0.0, 0.0], 0.02, max_runs=10)  # zero mean: no CV


@pytest.mark.parametrize(
    "kwargs",
    [dict(bound=0.0, max_runs=10), dict(bound=0.02, max_runs=2), dict(bound=0.02, max_runs=10, min_runs=1)],
)
def test_until_cv_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        until_cv_reached([1.0, 1.0, 1.0], **kwargs)
