"""The report's GPU microbenchmarks (report/gather.py's microbench_rows, report/tables.py's microbench_table): each figure as a % of its GPU's
datasheet peak, the latest run's figure per GPU, provider and figure, the GPU's best LLM
figure beside it, skipped figures with their reason, and the peaks' sources; none without
microbench cells. Also: the sandbox catalog's achievable figures sit below every peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.measure.microbench import peaks_for
from pytest_gpubench.measure.microbench import figures_from_events
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults, TestConfig
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.report.tables import microbench_table
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore


def _events(memory: float, fp16: float) -> list[dict]:
    return [{"event": "device", "name": "NVIDIA GeForce RTX 4090", "capability": [8, 9], "torch": "2.5.1"},
            {"event": "figure", "kind": "memory_bandwidth", "precision": None, "unit": "GB/s",
             "values": [memory * 0.99, memory, memory * 1.01]},
            {"event": "figure", "kind": "matmul", "precision": "fp16", "unit": "TFLOPS", "values": [fp16, fp16]},
            {"event": "skipped", "kind": "matmul", "precision": "int8", "reason": "torch could not run it: no"}]


@pytest.fixture
def store(tmp_path: Path):
    with Manifest(tmp_path / "manifest.db") as manifest:
        store = SqliteStore(manifest)
        for run_id, memory in (("run-old", 500.0), ("run-new", 907.2)):  # run-new starts later
            store.start_run(run_id, ["pytest"], [])
            row = store.add_cell(run_id, "RTX_4090-vastai-microbench", gpu_type="RTX 4090", provider="vastai",
                                 model="microbench", matrix_file="m.yaml")
            store.add_microbench(row, figures_from_events(_events(memory, 82.6)))
            store.finish_cell(row, status="success")
        for model, output in (("qwen2:7b", 190.0), ("qwen2:1.5b", 300.0)):
            row = store.add_cell("run-new", f"RTX_4090-vastai-{model}", gpu_type="RTX 4090", provider="vastai",
                                 model=model, matrix_file="m.yaml")
            result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=1), provider="vastai", price_per_hour=0.4,
                                     results=PerformanceResults(total_requests=40, total_tokens=int(output * 10),
                                                                duration_seconds=10.0, avg_tokens_per_second=190.0))
            store.add_result(row, result)
            store.finish_cell(row, status="success")
        yield store


def test_each_figure_is_a_percentage_of_its_datasheet_peak_beside_the_gpus_best_llm_figure(store) -> None:
    report = build_report(store)
    rows = {row.label: row for row in report.microbench}
    assert list(rows) == ["memory_bandwidth", "matmul_fp16", "matmul_int8"]
    memory = rows["memory_bandwidth"]
    # The latest run's figure (907.2 GB/s), not the older 500: 90% of the RTX 4090's 1008 GB/s.
    assert memory.run_id == "run-new" and memory.value == pytest.approx(907.2)
    assert (memory.peak, memory.percent_of_peak) == (1008, pytest.approx(90.0))
    assert rows["matmul_fp16"].percent_of_peak == pytest.approx(50.0)  # 82.6 of 165.2 TFLOPS
    assert (memory.best_llm_tokens_per_second, memory.best_llm) == (pytest.approx(300.0), "qwen2:1.5b on vastai")
    assert rows["matmul_int8"].value is None and rows["matmul_int8"].percent_of_peak is None
    # The microbench cells are no LLM results: the leaderboards hold the two models only.
    assert sorted(r.model for r in report.results) == ["qwen2:1.5b", "qwen2:7b"]


def test_both_renderings_show_the_table_and_the_peaks_sources(store) -> None:
    report = build_report(store)
    table = microbench_table(report)
    memory = table.rows[0]
    assert [str(v) for v in memory[:3]] == ["RTX 4090", "vastai", "memory_bandwidth"]
    assert str(memory[5]) == "90%" and str(memory[4]) == "1,008.0 GB/s"
    assert str(memory[3]).startswith("907.2 ± ") and str(memory[7]) == "300.0 (qwen2:1.5b on vastai)"
    assert str(table.rows[2][3]) == "skipped: torch could not run it: no"
    markdown, html = render_markdown(report), render_html(report)
    assert "## GPU microbenchmarks" in markdown and "| RTX 4090 | vastai | matmul\\_fp16 |" in markdown
    assert peaks_for("RTX 4090").source in markdown
    assert "<h2>GPU microbenchmarks</h2>" in html and 'data-table="microbench"' in html and ">90%<" in html


def test_a_report_without_microbench_cells_has_no_such_section(tmp_path: Path) -> None:
    with Manifest(tmp_path / "manifest.db") as manifest:
        store = SqliteStore(manifest)
        store.start_run("run-a", ["pytest"], [])
        report = build_report(store)
    assert report.microbench == [] and "GPU microbenchmarks" not in render_markdown(report)


def test_every_sandbox_gpu_has_peaks_and_achieves_less_than_them() -> None:
    for name, gpu in load_catalog().gpus.items():
        peaks = peaks_for(name)
        assert peaks is not None, name
        assert gpu.microbench is not None and gpu.microbench.memory_gb_per_s < peaks.memory_gb_per_s, name
        for precision, achieved in gpu.microbench.tflops.items():
            assert precision in peaks.tflops and achieved < peaks.tflops[precision], (name, precision)
        assert set(gpu.microbench.tflops) == set(peaks.tflops), name  # the sandbox lacks what the card lacks


def test_figures_follow_the_matrix_precisions_order_a_new_precision_included(store, monkeypatch) -> None:
    from pytest_gpubench.matrix import cells as spec

    # int8 before fp16, and a precision the report never heard of: the order is the matrix's, not a copy.
    monkeypatch.setattr(spec, "PRECISIONS", ("fp4", "int8", "fp16"))
    row = store.add_cell("run-new", "RTX_4090-tensordock-microbench", gpu_type="RTX 4090", provider="tensordock",
                         model="microbench", matrix_file="m.yaml")
    events = _events(900.0, 80.0) + [{"event": "figure", "kind": "matmul", "precision": "fp4", "unit": "TFLOPS",
                                      "values": [160.0]}]
    store.add_microbench(row, figures_from_events(events))
    store.finish_cell(row, status="success")
    labels = [r.label for r in build_report(store).microbench if r.provider == "tensordock"]
    assert labels == ["memory_bandwidth", "matmul_fp4", "matmul_int8", "matmul_fp16"]
