"""compare.py: the rule grammar, changes and regressions, and the texts people read."""

from __future__ import annotations

import pytest

from pytest_gpubench.figures import METRICS, Rule, parse_compare_fail
from pytest_gpubench.measure.compare import compare, figures_of
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults

BASE = {"run_id": "20261122T0300Z-abc", "decode_tokens_per_second": 195.3, "ttft_p50_ms": 42.0,
        "cost_per_million_tokens": 0.569, "error_rate": 0.0}


def current(**changes):
    return {**BASE, "run_id": "20261123T0300Z-def", **changes}


# ------------------------------------------------------------------------ rules


def test_rules_comma_separated_or_repeated():
    assert parse_compare_fail("tps:10%,ttft:20%") == [Rule(metric="tps", percent=10), Rule(metric="ttft", percent=20)]
    assert parse_compare_fail(["tps:10%", "cost:5%", "error_rate:2%"]) == [
        Rule(metric="tps", percent=10), Rule(metric="cost", percent=5), Rule(metric="error_rate", percent=2)]
    assert parse_compare_fail(" tps : 7.5 % , ") == [Rule(metric="tps", percent=7.5)]
    assert parse_compare_fail("TPS:10") == [Rule(metric="tps", percent=10)]  # the % sign is optional


def test_aliases_and_the_strictest_bound_wins():
    assert parse_compare_fail("tokens_per_second:10%,ttft_p50_ms:20%,tps:5%,ttft:30%") == [
        Rule(metric="tps", percent=5), Rule(metric="ttft", percent=20)]
    assert str(Rule(metric="tps", percent=10.0)) == "tps:10%"


@pytest.mark.parametrize("text, message", [
    ("speed:10%", "unknown metric 'speed'"),
    ("tps", "expected METRIC:PERCENT"),
    ("tps:", "expected METRIC:PERCENT"),
    ("tps:-5%", "expected METRIC:PERCENT"),
    ("tps:ten", "expected METRIC:PERCENT"),
    ("tps:10%%", "expected METRIC:PERCENT"),
    ("", "expected at least one"),
    (",", "expected at least one"),
])
def test_bad_rules_say_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_compare_fail(text)
    assert "tps, ttft, cost, error_rate" in str(info.value)
    # settings.py shows messages that start like these as they are
    assert str(info.value).startswith(("unknown", "expected", "must"))


def test_settings_validate_the_rules_with_this_grammar():
    from pytest_gpubench import options

    assert options._compare_rules("tps:10%,ttft:20%") == "tps:10%,ttft:20%"
    with pytest.raises(ValueError, match="unknown metric"):
        options._compare_rules("latency:10%")


# -------------------------------------------------------------------- comparing


def test_the_line_shows_tps_and_ttft_changes():
    comparison = compare(current(decode_tokens_per_second=180.1, ttft_p50_ms=45.0), BASE, [])
    assert comparison.line() == "vs run 20261122T0300Z-abc: tps 195.3 -> 180.1 (-7.8%), ttft p50 42 -> 45 ms (+7.1%)"
    assert not comparison.failed and comparison.failure() == ""
    tps = comparison.change("tps")
    assert tps.baseline == 195.3 and tps.current == 180.1
    assert tps.change_pct == pytest.approx(-7.783, abs=1e-3) and tps.worse_by == pytest.approx(7.783, abs=1e-3)
    assert comparison.change("ttft").worse_by == pytest.approx(7.143, abs=1e-3)


def test_regressions_beyond_the_bounds_fail_with_metric_bound_and_change():
    rules = parse_compare_fail("tps:5%,ttft:20%,cost:5%")
    comparison = compare(current(decode_tokens_per_second=180.1, ttft_p50_ms=45.0, cost_per_million_tokens=0.617),
                         BASE, rules)
    assert comparison.failed
    assert [v.rule.metric for v in comparison.violations] == ["tps", "cost"]
    failure = comparison.failure()
    assert "tps fell 7.8% vs run 20261122T0300Z-abc (195.3 -> 180.1), more than the 5% allowed by tps:5%" in failure
    assert "cost/Mtok rose 8.4%" in failure and "($0.569 -> $0.617)" in failure and "cost:5%" in failure
    assert "ttft" not in failure  # +7.1% is within 20%
    assert "cost/Mtok $0.569 -> $0.617 (+8.4%)" in comparison.line()  # a ruled metric is shown


def test_improvements_never_fail():
    rules = parse_compare_fail("tps:0%,ttft:0%,cost:0%,error_rate:0%")
    comparison = compare(current(decode_tokens_per_second=250.0, ttft_p50_ms=30.0, cost_per_million_tokens=0.4),
                         BASE, rules)
    assert not comparison.failed
    assert comparison.change("tps").worse_by < 0 and comparison.change("ttft").worse_by < 0


def test_a_change_exactly_at_the_bound_passes():
    comparison = compare(current(decode_tokens_per_second=100.0), {**BASE, "decode_tokens_per_second": 200.0},
                         parse_compare_fail("tps:50%"))
    assert not comparison.failed


def test_error_rate_is_bounded_in_percentage_points():
    rules = parse_compare_fail("error_rate:2%")
    within = compare(current(error_rate=0.02), BASE, rules)
    assert not within.failed
    assert "errors 0.0% -> 2.0% (+2.0 pts)" in within.line()
    beyond = compare(current(error_rate=0.025), BASE, rules)
    assert beyond.failed
    assert "errors rose 2.5 points" in beyond.failure() and "the 2 points allowed by error_rate:2%" in beyond.failure()


def test_unknown_figures_break_no_rule_and_show_as_unknown():
    comparison = compare(current(ttft_p50_ms=None, cost_per_million_tokens=None), BASE,
                         parse_compare_fail("ttft:1%,cost:1%"))
    assert not comparison.failed
    assert "ttft p50 42 -> ? ms" in comparison.line()
    assert comparison.change("cost").worse_by is None


def test_a_cell_that_produced_nothing_regresses_fully():
    comparison = compare(current(decode_tokens_per_second=0.0), BASE, parse_compare_fail("tps:50%"))
    assert comparison.failed and comparison.change("tps").worse_by == pytest.approx(100)


def test_baseline_answers_and_results_are_read_alike():
    """A Manifest.baseline answer (manifest row + benchmarks row) and a result both work."""
    baseline = {"run_id": "r1", "decode_tokens_per_second": 200.0, "ttft_p50_ms": 40.0, "cost_per_million_tokens": 0.5,
                "total_requests": 10, "error_count": 1, "benchmark": {"error_rate": 0.1}}
    result = BenchmarkResult(price_per_hour=0.36, results=PerformanceResults(
        avg_tokens_per_second=190.0, p50_ttft_ms=44.0, error_rate=0.0, total_requests=10,
        total_tokens=1900, duration_seconds=10.0))
    from_figures = compare(figures_of(result, "r2"), baseline, [])
    from_dump = compare(result.model_dump(mode="json"), baseline, [])
    assert from_figures.changes == from_dump.changes
    assert from_figures.change("error_rate").baseline == 0.1
    assert from_figures.change("cost").current == pytest.approx(0.36 / (190 * 3600) * 1e6)
    # tps compares the median per-request rate where both sides have it.
    with_median = compare({**figures_of(result, "r2"), "p50_tokens_per_second": 150.0},
                          {**baseline, "benchmark": {"p50_tokens_per_second": 300.0}}, [])
    assert (with_median.change("tps").baseline, with_median.change("tps").current) == (300.0, 150.0)
    legacy = {"run_id": "r0", "decode_tokens_per_second": 200.0, "total_requests": 20, "error_count": 2}
    assert compare(figures_of(result), legacy, []).change("error_rate").baseline == pytest.approx(0.1)


def test_every_metric_has_a_direction():
    assert {name: m.higher_is_better for name, m in METRICS.items()} == {
        "tps": True, "ttft": False, "cost": False, "error_rate": False}
