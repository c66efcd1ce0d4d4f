"""The summary table's columns (--gpubench-columns) and the figures registry behind them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_gpubench.errors import UsageProblem
from pytest_gpubench.figures import FIGURES, FigureSource, figure_values
from pytest_gpubench.settings import resolve
from pytest_gpubench.figures import ALLOWED_COLUMNS, parse_columns
from pytest_gpubench.report.summary_table import DEFAULT_COLUMNS, SummaryTable

ROW = {"gpubench_cell": "c4-cell", "gpubench_status": "success", "gpubench_output_tokens_per_second": 650.5,
       "gpubench_decode_tokens_per_second": 178.9, "gpubench_ttft_p99_ms": 812.4, "gpubench_goodput_share": 0.925,
       "gpubench_concurrency": 4, "gpubench_slo": "ttft_ms<=500", "gpubench_valid": False}


def test_columns_are_chosen_in_order_once_each():
    assert parse_columns("ttft_p99_ms, STATUS,goodput_share,ttft_p99_ms") == ("ttft_p99_ms", "status", "goodput_share")
    assert parse_columns("cell,concurrency") == ("concurrency",)  # the cell is always first anyway
    table = SummaryTable(parse_columns("concurrency,output_tokens_per_second,ttft_p99_ms,goodput_share,slo"))
    table.add(ROW)
    header, row = table.render()[:2]
    assert header.split() == ["cell", "conc", "output", "tok/s", "TTFT", "p99", "ms", "goodput", "SLO"]
    # "!" marks a figure that does not describe the GPU (validity flags).
    assert row.split() == ["c4-cell", "4", "650.5", "!", "812", "92.5%", "ttft_ms<=500"]


@pytest.mark.parametrize("text, message", [
    ("tokens_per_second", "unknown column 'tokens_per_second'; allowed: status, cost_usd, output_tokens_per_second"),
    ("status,tps,ttft", "unknown columns 'tps', 'ttft'; allowed: "),
    (" , ", "expected at least one column name; allowed: "),
])
def test_a_bad_column_names_the_allowed_ones(text, message):
    with pytest.raises(UsageProblem) as info:
        resolve({"columns": text}, {}, lambda key: None)
    assert str(info.value).startswith(f"--gpubench-columns: {text!r} ")
    assert message in str(info.value)
    assert all(name in str(info.value) for name in ALLOWED_COLUMNS)


def test_columns_come_from_the_environment_and_default_to_both_throughputs():
    assert resolve({}, {"GPUBENCH_COLUMNS": "rate,run_id"}, lambda key: None).columns == ("rate", "run_id")
    assert resolve({}, {}, lambda key: None).columns is None
    assert {"output_tokens_per_second", "decode_tokens_per_second"} <= set(DEFAULT_COLUMNS)


def test_the_option_changes_the_table_pytest_prints(pytester):
    pytester.makeconftest("")
    pytester.makepyfile(test_x="""
        def test_cell(record_property):
            record_property("gpubench_cell", "c1")
            record_property("gpubench_status", "success")
            record_property("gpubench_itl_p99_ms", 31.5)
    """)
    result = pytester.runpytest("-p", "gpubench", "--gpubench-columns", "itl_p99_ms,status")
    result.stdout.fnmatch_lines(["*gpubench summary*", "cell*ITL p99 ms*status*", "c1*31.5*success*"])
    bad = pytester.runpytest("-p", "gpubench", "--gpubench-columns", "itl_p42_ms")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--gpubench-columns*unknown column 'itl_p42_ms'; allowed: status, cost_usd*"])


def test_every_figure_reads_none_from_nothing_and_is_defined_in_the_docs():
    assert set(figure_values(FigureSource({}, {}))) == set(FIGURES)
    assert all(value is None for value in figure_values(FigureSource({}, {})).values())
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    undefined = [name for name in ALLOWED_COLUMNS if not re.search(rf"`{name}`", docs)]
    assert undefined == []


def test_figures_read_the_stored_result_and_details():
    result = {"results": {"total_tokens": 3903, "duration_seconds": 6.0, "avg_tokens_per_second": 178.9,
                          "p50_ttft_ms": 40.0, "total_requests": 40, "total_errors": 2, "error_rate": 0.05,
                          "match_rate": 0.0, "prompts_with_expected": 0},
              "price_per_hour": 0.36, "test_config": {"concurrent_reqs": 4}}
    details = {"metrics": {"ttft_p99_ms": 90.0, "itl_p50_ms": 5.2, "goodput_share": 0.9,
                           "slo": {"ttft_ms": 500.0, "tpot_ms": None, "e2e_ms": None}},
               "load": {"concurrency": 4, "rate": None}, "run_statistics": {"n": 1, "std": 0.0}}
    values = figure_values(FigureSource(result, details, "run-7"))
    assert values["output_tokens_per_second"] == pytest.approx(650.5)
    assert values["decode_tokens_per_second"] == 178.9
    assert values["ttft_p50_ms"] == 40.0  # from the Go field: the details have none
    assert values["ttft_p99_ms"] == 90.0 and values["itl_p50_ms"] == 5.2
    assert values["goodput_share"] == 0.9 and values["slo"] == "ttft_ms<=500"
    assert values["match_rate"] is None  # nothing was checked: not a 0% match
    assert values["decode_tokens_per_second_std"] is None  # one run: no spread
    assert values["concurrency"] == 4 and values["rate"] is None and values["run_id"] == "run-7"
    assert values["cost_per_million_tokens"] == pytest.approx(0.36 / (3903 / 6 * 3600) * 1e6)
    rated = figure_values(FigureSource(result, {"load": {"concurrency": 1, "rate": 2.5}}))
    assert rated["rate"] == 2.5 and rated["concurrency"] is None
