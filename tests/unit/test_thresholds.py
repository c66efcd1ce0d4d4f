"""Thresholds: every bound passes and fails on the right side, and violations read well."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from pytest_gpubench.matrix.cells import load_cells
from pytest_gpubench.errors import Stage
from pytest_gpubench.matrix.thresholds import DEFAULT_MAX_ERROR_RATE, Slo, Thresholds
from pytest_gpubench.measure.thresholds import Violation, check_thresholds, describe_violations

GOOD = {"tps": 50.0, "ttft_ms_by_percentile": {50: 200.0, 90: 400.0, 95: 500.0, 99: 900.0},
        "error_rate": 0.0, "match_rate": 1.0}


def check(thresholds: dict, **measured) -> list[Violation]:
    return check_thresholds(Thresholds.model_validate(thresholds), **{**GOOD, **measured})


def test_no_thresholds_no_violations_even_without_measurements():
    assert check_thresholds(Thresholds(), tps=None, ttft_ms_by_percentile={}, error_rate=None,
                            match_rate=None) == []


@pytest.mark.parametrize("thresholds,measured,violated", [
    # min_tps: below fails, equal and above pass
    ({"min_tps": 40}, {"tps": 39.9}, True),
    ({"min_tps": 40}, {"tps": 40.0}, False),
    ({"min_tps": 40}, {"tps": 40.1}, False),
    # max_ttft_ms at the chosen percentile: above fails, equal and below pass
    ({"max_ttft_ms": 500}, {"ttft_ms_by_percentile": {95: 500.1}}, True),
    ({"max_ttft_ms": 500}, {"ttft_ms_by_percentile": {95: 500.0}}, False),
    ({"max_ttft_ms": 500}, {"ttft_ms_by_percentile": {95: 499.9}}, False),
    ({"max_ttft_ms": 800, "ttft_percentile": 99}, {}, True),           # p99 is 900
    ({"max_ttft_ms": 800, "ttft_percentile": 95}, {}, False),          # p95 is 500
    ({"max_ttft_ms": 300, "ttft_percentile": 50}, {}, False),          # p50 is 200
    ({"max_ttft_ms": 300, "ttft_percentile": 90}, {}, True),           # p90 is 400
    # max_error_rate: above fails, equal and below pass
    ({"max_error_rate": "1%"}, {"error_rate": 0.0101}, True),
    ({"max_error_rate": "1%"}, {"error_rate": 0.01}, False),
    ({"max_error_rate": 0.01}, {"error_rate": 0.0}, False),
    ({"max_error_rate": 0}, {"error_rate": 0.001}, True),
    # min_match_rate: below fails, equal and above pass
    ({"min_match_rate": 0.9}, {"match_rate": 0.89}, True),
    ({"min_match_rate": "90%"}, {"match_rate": 0.9}, False),
    ({"min_match_rate": 0.9}, {"match_rate": 1.0}, False),
])
def test_each_bound_on_both_sides(thresholds, measured, violated):
    violations = check(thresholds, **measured)
    assert bool(violations) is violated
    if violated:
        (violation,) = violations
        assert violation.metric == next(k for k in thresholds if k != "ttft_percentile")
        assert violation.measured is not None


@pytest.mark.parametrize("thresholds,measured,label", [
    ({"min_tps": 40}, {"tps": None}, "min_tps"),
    ({"min_tps": 40}, {"tps": math.nan}, "min_tps"),
    ({"max_ttft_ms": 800}, {"ttft_ms_by_percentile": {50: 100.0}}, "max_ttft_ms (p95)"),
    ({"max_ttft_ms": 800, "ttft_percentile": 99}, {"ttft_ms_by_percentile": {99: None}},
     "max_ttft_ms (p99)"),
    ({"max_error_rate": 0.01}, {"error_rate": None}, "max_error_rate"),
    ({"min_match_rate": 0.9}, {"match_rate": None}, "min_match_rate"),
])
def test_a_missing_measurement_is_a_violation(thresholds, measured, label):
    (violation,) = check(thresholds, **measured)
    assert violation.measured is None and violation.label == label
    assert str(violation).startswith(f"{label}: could not be measured (")


def test_match_rate_without_expectation_prompts_reads_so():
    (violation,) = check({"min_match_rate": 0.9}, match_rate=None)
    assert str(violation) == (
        "min_match_rate: could not be measured (no answer to a prompt with `expect` answers was "
        "recorded; use `prompts: quality` or give prompts `expect`); the threshold is 90%")


@pytest.mark.parametrize("thresholds,measured,text", [
    ({"min_tps": 40}, {"tps": 38.2}, "min_tps: measured 38.2 tok/s, below the threshold of 40 tok/s"),
    ({"min_tps": 40}, {"tps": 38.24}, "min_tps: measured 38.2 tok/s, below the threshold of 40 tok/s"),
    ({"min_tps": 40}, {"tps": 39.96}, "min_tps: measured 39.96 tok/s, below the threshold of 40 tok/s"),
    ({"min_tps": 40.5}, {"tps": 12}, "min_tps: measured 12 tok/s, below the threshold of 40.5 tok/s"),
    ({"max_ttft_ms": 800}, {"ttft_ms_by_percentile": {95: 912.4}},
     "max_ttft_ms (p95): measured 912 ms, above the threshold of 800 ms"),
    ({"max_ttft_ms": 800}, {"ttft_ms_by_percentile": {95: 800.3}},
     "max_ttft_ms (p95): measured 800.3 ms, above the threshold of 800 ms"),
    ({"max_ttft_ms": 250, "ttft_percentile": 50}, {"ttft_ms_by_percentile": {50: 251}},
     "max_ttft_ms (p50): measured 251 ms, above the threshold of 250 ms"),
    ({"max_error_rate": "1%"}, {"error_rate": 0.025},
     "max_error_rate: measured 2.5%, above the threshold of 1%"),
    ({"max_error_rate": 0.0125}, {"error_rate": 1 / 3},
     "max_error_rate: measured 33.33%, above the threshold of 1.25%"),
    ({"max_error_rate": 0}, {"error_rate": 0.0001}, "max_error_rate: measured 0.01%, above the threshold of 0%"),
    ({"min_match_rate": 0.9}, {"match_rate": 0.8},
     "min_match_rate: measured 80%, below the threshold of 90%"),
    ({"min_match_rate": 0.9}, {"match_rate": 0.8999},
     "min_match_rate: measured 89.99%, below the threshold of 90%"),
])
def test_violations_read_as_sentences(thresholds, measured, text):
    (violation,) = check(thresholds, **measured)
    assert str(violation) == text


def test_violations_come_in_a_fixed_order_and_describe_on_one_line():
    violations = check_thresholds(
        Thresholds(min_tps=40, max_ttft_ms=800, max_error_rate=0.01, min_match_rate=0.9),
        tps=38.2, ttft_ms_by_percentile={95: 912.0}, error_rate=0.02, match_rate=None)
    assert [v.metric for v in violations] == ["min_tps", "max_ttft_ms", "max_error_rate",
                                              "min_match_rate"]
    line = describe_violations(violations)
    assert "\n" not in line
    assert line.startswith("min_tps: measured 38.2 tok/s, below the threshold of 40 tok/s; "
                           "max_ttft_ms (p95): measured 912 ms, above the threshold of 800 ms; ")
    assert line.endswith("min_match_rate: could not be measured (no answer to a prompt with "
                         "`expect` answers was recorded; use `prompts: quality` or give prompts "
                         "`expect`); the threshold is 90%")
    assert describe_violations([]) == ""


def test_violation_is_a_frozen_json_value():
    (violation,) = check({"max_ttft_ms": 800}, ttft_ms_by_percentile={95: 912.0})
    assert violation.model_dump() == {"metric": "max_ttft_ms", "threshold": 800.0,
                                      "measured": 912.0, "percentile": 95, "default": False}
    json.dumps(violation.model_dump())
    with pytest.raises(ValidationError):
        violation.measured = 1.0


def test_models_validate_directly():
    thresholds = Thresholds.model_validate({"max_error_rate": "1%", "min_match_rate": "90%"})
    assert (thresholds.max_error_rate, thresholds.min_match_rate) == (0.01, 0.9)
    assert thresholds.is_set and not Thresholds().is_set
    assert Slo(ttft_ms=500).is_set and not Slo().is_set
    with pytest.raises(ValidationError, match="must be one of 50, 90, 95, 99"):
        Thresholds(ttft_percentile=75)
    with pytest.raises(ValidationError, match="unknown key"):
        Slo.model_validate({"ttft": 5})


def test_cells_from_a_matrix_check_against_their_own_thresholds(tmp_path):
    path = tmp_path / "gpubench_t.yaml"
    path.write_text(textwrap.dedent("""\
        thresholds: {min_tps: 40}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, thresholds: {min_tps: 20}}
        """))
    strict, lenient = load_cells(path)
    figures = {**GOOD, "tps": 30.0}
    assert [v.metric for v in check_thresholds(strict.thresholds, **figures)] == ["min_tps"]
    assert check_thresholds(lenient.thresholds, **figures) == []


def test_thresholds_module_does_not_import_pytest():
    code = "import sys, pytest_gpubench.measure.thresholds; sys.exit('pytest' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------ the default error budget (issue 21 item 17)


@pytest.mark.parametrize("error_rate,missed", [(0.0, None), (0.5, None), (0.5001, "50.01%"), (0.99, "99%")])
def test_a_run_that_is_mostly_errors_misses_the_default_error_budget(error_rate, missed):
    violations = check({}, error_rate=error_rate)  # the matrix sets no max_error_rate
    assert [(v.metric, v.threshold, v.default) for v in violations] == (
        [("max_error_rate", DEFAULT_MAX_ERROR_RATE, True)] if missed else [])
    if missed:
        assert str(violations[0]) == (
            f"max_error_rate: {missed} of the measured requests failed, above the default error budget of "
            "50%: the run is mostly errors, not a measurement (thresholds.max_error_rate sets another budget, "
            "null none)")


def test_the_matrix_s_own_error_bound_replaces_the_default_and_null_removes_it(tmp_path):
    assert check({"max_error_rate": None}, error_rate=0.99) == []
    (own,) = check({"max_error_rate": 0.6}, error_rate=0.7)
    assert not own.default and str(own) == "max_error_rate: measured 70%, above the threshold of 60%"
    assert not Thresholds().is_set and Thresholds().max_error_rate == DEFAULT_MAX_ERROR_RATE
    # Through a matrix: a file-level bound, a row's null, and a row that sets nothing.
    path = tmp_path / "gpubench_e.yaml"
    path.write_text(textwrap.dedent("""\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, thresholds: {max_error_rate: null}}
          - {gpu: A100 80GB, provider: vastai, model: qwen2:7b, thresholds: {max_error_rate: 5%}}
        """))
    default, removed, own = (cell.thresholds for cell in load_cells(path))
    figures = {"tps": 50.0, "ttft_ms_by_percentile": {}, "error_rate": 0.9, "match_rate": None}
    assert [v.default for v in check_thresholds(default, **figures)] == [True]
    assert check_thresholds(removed, **figures) == []
    assert [v.default for v in check_thresholds(own, **figures)] == [False]


def test_missing_only_the_default_budget_makes_the_cell_partial_not_failed():
    from pytest_gpubench.errors import ErrorBudgetExceeded, ThresholdMissed
    from pytest_gpubench.plugin.fixtures import _failure

    budget = _failure(ErrorBudgetExceeded("max_error_rate: 99% of the measured requests failed"), Stage.BENCHMARK)
    assert (budget.status, budget.failure_stage, budget.failure_reason) == ("partial", "results",
                                                                           "ErrorBudgetExceeded")
    own = _failure(ThresholdMissed("max_error_rate: measured 2%, above the threshold of 1%"), Stage.BENCHMARK)
    assert (own.status, own.failure_stage) == ("failed", "results")
