"""A cell's JUnit properties, manifest row and COMPLETED line name each figure for what it is."""

from __future__ import annotations

import pytest

from pytest_gpubench.store.opening import open_store
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.measure.metrics import detailed_metrics
from pytest_gpubench.store.progress import read_progress
from pytest_gpubench.run.record import CellRecorder, CellOutcome
from pytest_gpubench.measure.results import BenchmarkResult, TestConfig, summarize
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.report.summary_table import SummaryTable, exact_figures

MATRIX = """
workload: {duration: 4s, concurrency: 4}
slo: {ttft_ms: 100}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
"""
DURATION = 4.0


def _records() -> list[RequestRecord]:
    """16 requests, 4 at a time, 100 tokens each at 50 tokens/s per stream: the machine
    delivers 4 x 50 = 200 tokens/s, one stream decodes at 50."""
    records = []
    for i in range(16):
        ttft = 60.0 + 10 * i  # the last six miss the 100 ms TTFT bound
        latency = ttft + 99 / 50 * 1000
        records.append(RequestRecord(index=i, prompt_index=i % 3, started_at=float(i // 4), ttft_ms=ttft,
                                     latency_ms=latency, output_tokens=100, eval_count=100,
                                     tokens_per_second=50.0, matched=i % 4 != 0 if i < 8 else None))
    return records


@pytest.fixture
def finished(tmp_path):
    (cell,) = expand(parse_matrix(MATRIX, "gpubench_t.yaml"))
    with open_store(tmp_path / "manifest.db") as store:
        store.start_run("run-9", [], [])
        recorder = CellRecorder.start(store, "run-9", cell, cell.cell_id, tmp_path / "progress", "main")
        records = _records()
        recorder.result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=4), price_per_hour=0.36,
                                          results=summarize(records, DURATION))
        recorder.records = records
        recorder.details = {
            "metrics": detailed_metrics(records, DURATION, slo=cell.slo).model_dump(mode="json"),
            "load": {"concurrency": cell.concurrency, "rate": cell.rate},
            "validity": {"valid": True, "reasons": []},
        }
        props = recorder.finish(CellOutcome("success"))
        yield props, store.cell(recorder.row_id).model_dump(), recorder.progress.path


def test_junit_properties_carry_every_figure_by_its_name(finished):
    props, _, _ = finished
    assert "gpubench_tokens_per_second" not in props  # the ambiguous name is gone
    assert props["gpubench_output_tokens_per_second"] == pytest.approx(16 * 100 / DURATION)
    assert props["gpubench_decode_tokens_per_second"] == 50.0
    assert props["gpubench_ttft_p50_ms"] == pytest.approx(135.0)
    assert props["gpubench_ttft_p95_ms"] == pytest.approx(202.5, abs=0.01)
    assert props["gpubench_ttft_p99_ms"] == pytest.approx(208.5, abs=0.01)
    assert props["gpubench_tpot_p50_ms"] == pytest.approx(20.0)
    assert props["gpubench_e2e_p99_ms"] == pytest.approx(208.5 + 1980.0, abs=0.01)
    assert props["gpubench_goodput_share"] == pytest.approx(5 / 16)  # TTFT 60..100 ms: 5 of 16
    assert props["gpubench_slo"] == "ttft_ms<=100"
    assert props["gpubench_match_rate"] == pytest.approx(6 / 8)
    assert props["gpubench_concurrency"] == 4 and "gpubench_rate" not in props
    assert props["gpubench_run_id"] == "run-9"
    assert props["gpubench_cost_per_million_tokens"] == pytest.approx(0.36 / (400 * 3600) * 1e6, abs=1e-4)
    assert "gpubench_ttfat_p50_ms" not in props  # not a reasoning model: not measured, not 0


def test_manifest_row_and_completed_line_name_both_rates(finished):
    props, row, progress = finished
    assert row["output_tokens_per_second"] == pytest.approx(400.0)
    assert row["decode_tokens_per_second"] == pytest.approx(50.0)
    [completed] = [line for line in read_progress(progress) if line.label == "COMPLETED"]
    assert completed.fields["output_tokens_per_second"] == "400.0"
    assert completed.fields["decode_tokens_per_second"] == "50.0"
    assert "tps" not in completed.fields


def test_the_summary_shows_both_rates_of_the_cell(finished):
    props, _, _ = finished
    table = SummaryTable()
    table.add(props)
    assert table.render()[1].split()[1:4] == ["success", "400.0", "50.0"]


def test_the_summary_shows_the_stored_figure_rounded_once(finished, tmp_path):
    """JUnit's 167.35 (from 167.3504) would print as 167.3; the report, reading the store, says 167.4."""
    props, _, _ = finished
    with open_store(tmp_path / "manifest.db") as store:
        exact = exact_figures(store.results("run-9"))
    assert exact[props["gpubench_cell"]]["gpubench_output_tokens_per_second"] == pytest.approx(400.0)
    props = {**props, "gpubench_output_tokens_per_second": 167.35}  # as digits=3 rounds 167.3504
    exact[props["gpubench_cell"]]["gpubench_output_tokens_per_second"] = 167.3504
    table = SummaryTable(("output_tokens_per_second",))
    table.add(props)
    assert table.render()[1].split()[1] == "167.3"  # the double rounding the store's figure avoids
    assert table.render(exact=exact)[1].split()[1] == "167.4"


def test_progress_lines_name_the_load_generators_rate(tmp_path):
    """The load generator's running ``tps`` (tokens so far / time so far) is output throughput."""
    from types import SimpleNamespace

    from pytest_gpubench.run.cell_benchmark import Bench
    from pytest_gpubench.store.progress import ProgressWriter

    writer = ProgressWriter(tmp_path / "cell.log")
    bench = Bench(None, None, SimpleNamespace(progress=writer), None, None)  # only its recorder is used here
    bench._on_event({"event": "progress", "requests": 12, "tokens": 3120, "tps": 650.5, "errors": 0})
    [line] = read_progress(tmp_path / "cell.log")
    assert line.kind == "PROGRESS"
    assert line.fields == {"requests": "12", "tokens": "3120", "output_tokens_per_second": "650.5", "errors": "0"}
