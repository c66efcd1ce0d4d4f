"""The report's saturation sweeps (report/sweep.py): the Saturation table ranks cells by
max_rate_meeting_slo, shows the output throughput and $/M tokens at that rate, and each sweep's
steps; a report without a sweep has no such section."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.figures import FigureSource, figure_values
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults, TestConfig
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.report.sweep import saturated, saturation_table, step_points, steps_table
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore


def _step(step: int, rate: float, share: float, output: float, met: bool) -> dict:
    return {"step": step, "kind": "rate", "rate": rate, "run_index": step, "requests": 40, "duration_seconds": 10.0,
            "request_throughput_rps": rate * 0.98, "goodput_share": share, "output_tokens_per_second": output,
            "ttft_p50_ms": 40.0 * rate, "ttft_p95_ms": 60.0 * rate, "tpot_p50_ms": 5.0, "tpot_p95_ms": 7.5,
            "met": met}


def _sweep(answer: float | None, output: float | None) -> dict:
    return {"goal": 0.95, "slo": {"ttft_ms": 500.0, "tpot_ms": None, "e2e_ms": None},
            "steps": [{"step": 0, "kind": "probe", "concurrency": 32, "run_index": 0, "requests": 90,
                       "duration_seconds": 10.0, "request_throughput_rps": 9.0, "goodput_share": 0.0,
                       "output_tokens_per_second": 900.0, "met": None},
                      _step(1, 9.0, 0.2, 800.0, False), _step(2, 0.9, 1.0, 90.0, True),
                      _step(3, 2.85, 0.97, 280.0, True)],
            "max_rate_meeting_slo": answer, "output_tokens_per_second": output,
            "cost_per_million_tokens": 0.4 / (output * 3600) * 1e6 if output else None, "stop_reason": "out of steps"}


@pytest.fixture
def manifest(tmp_path) -> Path:
    path = tmp_path / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-s", ["pytest"], [])
        for gpu, answer, output in (("RTX 4090", 2.85, 280.0), ("RTX 3090", 1.2, 120.0)):
            row = m.add_cell("run-s", f"{gpu.replace(' ', '_')}-vastai-qwen2:7b-sweep", gpu_type=gpu,
                             provider="vastai", model="qwen2:7b", matrix_file="m.yaml")
            result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=1), provider="vastai", price_per_hour=0.4,
                                     results=PerformanceResults(total_requests=40, total_tokens=int(output * 10),
                                                                duration_seconds=10.0, avg_tokens_per_second=190.0))
            bench = m.add_benchmark(row, result)
            m.set_details(bench, {"load": {"concurrency": 1, "rate": None, "sweep": True},
                                  "sweep": _sweep(answer, output)})
            m.finish_cell(row, status="success")
    return path


def test_the_saturation_table_ranks_by_the_highest_rate_meeting_the_slo(manifest: Path) -> None:
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m))
    rows = saturated(report)
    assert [(r.gpu, r.load, r.figures["max_rate_meeting_slo"]) for r in rows] == [("RTX 4090", "sweep", 2.85),
                                                                                  ("RTX 3090", "sweep", 1.2)]
    table = saturation_table(rows)
    assert [str(v) for v in table.rows[0]] == ["RTX 4090 / vastai", "qwen2:7b", "2.85", "280.0", "$0.40",
                                               "goodput_share >= 0.95", "ttft_ms<=500", "4", "out of steps"]
    # The cell's headline figures are the answer step's: the same output throughput and $/M tokens.
    assert rows[0].output_tokens_per_second == pytest.approx(280.0)
    assert rows[0].cost_per_million_tokens == pytest.approx(0.4 / (280.0 * 3600) * 1e6)
    steps = steps_table(rows[0])
    assert [str(row[0]) + " " + str(row[1]) for row in steps.rows] == ["probe c32", "rate 0.9", "rate 2.85",
                                                                       "rate 9"]
    assert [str(v) for v in steps.rows[2]] == ["rate", "2.85", "2.79", "97.0%", "280.0", "114", "171", "5.0", "7.5",
                                               "yes"]
    assert [label for _, _, label, _ in step_points(rows[0])] == ["r0.9/s", "r2.85/s", "r9/s"]
    markdown = render_markdown(report)
    assert "## Saturation" in markdown and "### RTX 4090 / vastai / qwen2:7b: sweep steps" in markdown
    html = render_html(report)
    assert "<h2>Saturation</h2>" in html and html.count('data-chart="sweep steps ') == 2


def test_a_report_without_a_sweep_has_no_saturation_section(tmp_path: Path) -> None:
    with Manifest(tmp_path / "manifest.db") as m:
        m.start_run("run-s", ["pytest"], [])
        row = m.add_cell("run-s", "RTX_4090-vastai-qwen2:7b", gpu_type="RTX 4090", provider="vastai",
                         model="qwen2:7b", matrix_file="m.yaml")
        m.add_benchmark(row, BenchmarkResult(provider="vastai", results=PerformanceResults(
            total_requests=4, total_tokens=400, duration_seconds=10.0)))
        m.finish_cell(row, status="success")
        report = build_report(SqliteStore(m))
    assert not saturated(report)
    assert "## Saturation" not in render_markdown(report) and "<h2>Saturation</h2>" not in render_html(report)


def test_max_rate_meeting_slo_is_a_registered_figure() -> None:
    figures = figure_values(FigureSource({}, {"sweep": _sweep(2.85, 280.0)}))
    assert figures["max_rate_meeting_slo"] == 2.85
    sweep_cell = FigureSource({"test_config": {"concurrent_reqs": 1}}, {"load": {"concurrency": 1, "sweep": True}})
    assert figure_values(sweep_cell)["concurrency"] is None  # a sweep of rates has no fixed concurrency
    assert figure_values(FigureSource({}, {}))["max_rate_meeting_slo"] is None
