"""The saturation sweep's search (measure/saturation.py): given goodput as a function of the
offered rate, it finds the highest passing rate within its precision, in few steps."""

from __future__ import annotations

import random

import pytest

from pytest_gpubench.matrix.workload import SweepSpec
from pytest_gpubench.measure.saturation import RateSearch, SweepOutcome, SweepStep
from pytest_gpubench.matrix.thresholds import Slo


def run(search: RateSearch, goodput) -> list[float]:
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, goodput(rate))
        assert len(rates) <= 50, "the search must end"
    return rates


def knee(at: float):
    """Goodput 1.0 up to ``at`` requests/s, then falling fast (a server past saturation)."""
    return lambda rate: 1.0 if rate <= at else max(0.0, 1.0 - (rate - at) / at * 4)


@pytest.mark.parametrize("true_knee", [1.3, 2.0, 4.7, 7.9])
def test_monotone_goodput_finds_the_knee_within_precision_in_few_steps(true_knee: float) -> None:
    search = RateSearch(0.8, 8.0, goal=0.95, precision=0.05, steps=20)
    rates = run(search, knee(true_knee))
    assert search.answer is not None
    assert knee(true_knee)(search.answer) >= 0.95  # it passed
    assert search.failing is not None and search.failing <= search.answer * 1.05
    assert search.answer >= true_knee / 1.05
    assert len(rates) <= 8  # two bounds and log2(ln 10 / ln 1.05) ~ 6 bisections
    assert search.stop_reason == "within precision"


def test_goal_met_at_the_top_rate_stops_after_one_step() -> None:
    search = RateSearch(0.5, 5.0, goal=0.95, precision=0.05, steps=8)
    assert run(search, lambda rate: 1.0) == [5.0]
    assert search.answer == 5.0 and search.stop_reason == "met at the top rate"


def test_goal_never_met_stops_at_the_lowest_rate() -> None:
    search = RateSearch(0.5, 5.0, goal=0.95, precision=0.05, steps=8)
    assert run(search, lambda rate: 0.2) == [5.0, 0.5]
    assert search.answer is None and search.stop_reason == "missed at the lowest rate"


def test_a_missing_goodput_counts_as_missed() -> None:
    search = RateSearch(0.5, 5.0, goal=0.95, precision=0.05, steps=8)
    assert not search.record(5.0, None)


def test_steps_cap_the_search() -> None:
    search = RateSearch(0.01, 1000.0, goal=0.95, precision=0.001, steps=4)
    assert len(run(search, knee(3.0))) == 4
    assert search.stop_reason == "out of steps" and search.answer is not None


def test_noisy_goodput_keeps_the_answer_consistent() -> None:
    """With noise the found rate may differ from the knee, but every tried rate lies inside the
    bracket, the answer passed, and the first failure above it is within precision."""
    for seed in range(20):
        rng = random.Random(seed)
        search = RateSearch(1.0, 10.0, goal=0.9, precision=0.05, steps=12)
        rates = run(search, lambda rate: min(1.0, max(0.0, knee(4.0)(rate) + rng.uniform(-0.08, 0.08))))
        passed = [rate for rate, _, met in search.tried if met]
        assert search.answer == max(passed)
        assert all(rate > search.answer for rate, _, met in search.tried if not met and rate > search.low)
        assert 2.5 <= search.answer <= 4.5
        assert len(rates) <= 12


def test_the_spec_sets_the_bounds() -> None:
    search = RateSearch.of(SweepSpec(min_rate=0.5, goal=0.9, precision=0.1, steps=5), top=6.0)
    assert (search.low, search.high, search.goal, search.precision, search.steps) == (0.5, 6.0, 0.9, 0.1, 5)
    assert RateSearch.of(SweepSpec(), top=6.0).low == pytest.approx(0.6)  # default: a tenth of the top
    assert RateSearch.of(SweepSpec(min_rate=9), top=6.0).low == pytest.approx(0.6)  # a probe below min_rate


def test_the_outcome_prices_the_step_at_the_answer() -> None:
    search = RateSearch(1.0, 4.0, goal=0.95, precision=0.05, steps=8)
    for rate, share in ((4.0, 0.5), (1.0, 1.0), (2.0, 1.0)):
        search.record(rate, share)
    steps = [SweepStep(step=0, kind="probe", concurrency=32, run_index=0, output_tokens_per_second=900.0),
             *(SweepStep(step=i + 1, kind="rate", rate=rate, run_index=i + 1, goodput_share=share,
                         output_tokens_per_second=rate * 100, met=share >= 0.95)
               for i, (rate, share) in enumerate(((4.0, 0.5), (1.0, 1.0), (2.0, 1.0))))]
    outcome = SweepOutcome.of(search, steps, Slo(ttft_ms=500), price_per_hour=0.72)
    assert outcome.max_rate_meeting_slo == 2.0
    assert outcome.output_tokens_per_second == 200.0
    assert outcome.cost_per_million_tokens == pytest.approx(0.72 / (200.0 * 3600) * 1e6)
    assert outcome.answer_step is steps[3]


def test_sweeps_compare_only_with_the_same_goal_slo_and_bounds() -> None:
    from pytest_gpubench.measure.saturation import sweep_identity

    assert sweep_identity(SweepSpec(min_rate=0.5), Slo(ttft_ms=500, tpot_ms=50)) == \
        "sweep goodput_share >= 0.95 ttft_ms<=500 tpot_ms<=50 rates 0.5-probe c32"
    assert sweep_identity(SweepSpec(max_rate=4, goal=0.9), Slo(e2e_ms=2000)) == \
        "sweep goodput_share >= 0.9 e2e_ms<=2000 rates top/10-4"
