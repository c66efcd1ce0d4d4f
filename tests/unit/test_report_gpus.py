"""The report names a multi-GPU cell's GPUs ``2x RTX 4090`` (report/gather.py): from the GPUs its
server spanned, as the result's details record them (runtimes/base.py); one-GPU rows keep the bare name."""

from __future__ import annotations

import pytest

from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, PerformanceResults, TestConfig
from pytest_gpubench.remote.readings import HardwareInfo
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore


def result(gpus: int, price: float, tokens: int) -> BenchmarkResult:
    return BenchmarkResult(
        hardware=HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_count=gpus),
        model=ModelInfo(name="qwen2:7b", runtime="vllm"),
        test_config=TestConfig(concurrent_reqs=1, duration_minutes=1),
        results=PerformanceResults(total_requests=10, total_tokens=tokens, duration_seconds=100.0,
                                   avg_tokens_per_second=tokens / 100.0, p50_ttft_ms=40.0),
        provider="vastai", location="US", price_per_hour=price)


def test_a_two_gpu_row_is_labelled_with_its_count_and_priced_as_the_whole_machine(tmp_path) -> None:
    with Manifest(tmp_path / "manifest.db") as m:
        m.start_run("run", ["pytest"], [])
        for cell_id, gpus, price, tokens in (("RTX_4090-vastai-qwen2:7b", 1, 0.30, 20000),
                                            ("RTX_4090-vastai-qwen2:7b-x2", 2, 0.62, 28000)):
            row = m.add_cell("run", cell_id, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                             matrix_file="m.yaml")
            benchmark = m.add_benchmark(row, result(gpus, price, tokens), [])
            runtime = {"name": "vllm"} | ({"gpus": {"count": 2, "tensor_parallel": 2, "visible_devices": ""}}
                                         if gpus > 1 else {})
            m.set_details(benchmark, {"load": {"concurrency": 1, "rate": None}, "runtime": runtime,
                                      "validity": {"valid": True, "reasons": []}})
            m.finish_cell(row, status="success", cost_usd=0.0)
        report = build_report(SqliteStore(m))
    rows = {row.cell_id: row for row in report.results}
    two, one = rows["RTX_4090-vastai-qwen2:7b-x2"], rows["RTX_4090-vastai-qwen2:7b"]
    assert (two.gpu, two.gpus, one.gpu, one.gpus) == ("2x RTX 4090", 2, "RTX 4090", 1)
    # $/M tokens: the whole machine's $0.62/h over the cell's 280 tok/s.
    assert two.cost_per_million_tokens == pytest.approx(0.62 / (280 * 3600) * 1e6)
    assert "| 2x RTX 4090 |" in render_markdown(report) and "2x RTX 4090" in render_html(report)
