"""The report tells runtimes apart: the same GPU, provider, model and load served by two
servers are two results (not one result and an "earlier" one left out), tables gain a
Runtime column once a result was served by anything but Ollama, and provider head-to-heads
compare only results of the same runtime."""

from __future__ import annotations

from pathlib import Path

from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, PerformanceResults, TestConfig
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

#: (provider, runtime, launch mode, output tokens/s)
CELLS = [("vastai", "ollama", None, 400.0), ("vastai", "vllm", None, 900.0), ("vastai", "vllm", "entrypoint", 880.0),
         ("tensordock", "vllm", None, 700.0)]


def _report(path: Path):
    with Manifest(path) as m:
        return build_report(SqliteStore(m))


def _manifest(path: Path, cells=CELLS) -> Path:
    with Manifest(path) as m:
        m.start_run("run-r", ["pytest"], [])
        for provider, runtime, mode, output in cells:
            suffix = "" if runtime == "ollama" else f"-runtime_{runtime}" + ("-entrypoint" if mode else "")
            row = m.add_cell("run-r", f"RTX_4090-{provider}-qwen2:7b{suffix}", gpu_type="RTX 4090",
                             provider=provider, model="qwen2:7b", matrix_file="m.yaml")
            result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=1), provider=provider, price_per_hour=0.4,
                                     model=ModelInfo(name="qwen2:7b", runtime=runtime),
                                     results=PerformanceResults(total_requests=40, total_tokens=int(output * 10),
                                                                duration_seconds=10.0, avg_tokens_per_second=90.0))
            bench = m.add_benchmark(row, result)
            m.set_details(bench, {"load": {"concurrency": 1, "rate": None},
                                  "runtime": {"name": runtime, **({"launch": {"mode": mode}} if mode else {})}})
            m.finish_cell(row, status="success")
    return path


def test_each_runtime_is_its_own_result_and_the_tables_name_it(tmp_path):
    report = _report(_manifest(tmp_path / "manifest.db"))
    assert [(r.provider, r.runtime, r.output_tokens_per_second) for r in report.by_tokens] == [
        ("vastai", "vllm", 900.0), ("vastai", "vllm (entrypoint)", 880.0), ("tensordock", "vllm", 700.0),
        ("vastai", "ollama", 400.0)]
    assert report.replaced == 0
    text = render_markdown(report)
    assert "| Rank | GPU | Provider | Runtime | output tok/s |" in text
    assert "| 2 | RTX 4090 | vastai | vllm \\(entrypoint\\) | 880.0 |" in text
    assert "fastest RTX 4090 on vastai with vllm \\(900.0 output tok/s\\)" in text


def test_providers_are_compared_only_on_the_same_runtime(tmp_path):
    report = _report(_manifest(tmp_path / "manifest.db"))
    (matchup,) = report.matchups  # vLLM on vastai against vLLM on tensordock; Ollama has no rival
    assert (matchup.runtime, [r.provider for r in matchup.entries], matchup.faster) == (
        "vllm", ["tensordock", "vastai"], "vastai")


def test_a_report_of_ollama_alone_has_no_runtime_column(tmp_path):
    report = _report(_manifest(tmp_path / "manifest.db", [("vastai", "ollama", None, 400.0)]))
    text = render_markdown(report)
    assert "| Rank | GPU | Provider | output tok/s |" in text and "Runtime" not in text


def test_a_result_that_names_no_runtime_is_ollamas(tmp_path):
    """Results from before runtimes were recorded, and imports, leave ``model.runtime`` empty."""
    path = tmp_path / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-o", ["pytest"], [])
        row = m.add_cell("run-o", "RTX_4090-vastai-qwen2:7b", gpu_type="RTX 4090", provider="vastai",
                         model="qwen2:7b", matrix_file="m.yaml")
        result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=1), provider="vastai",
                                 results=PerformanceResults(total_requests=4, total_tokens=40, duration_seconds=1.0))
        assert result.model.runtime == ""
        bench = m.add_benchmark(row, result)
        m.set_details(bench, {"load": {"concurrency": 1}})
        m.finish_cell(row, status="success")
    (only,) = _report(path).results
    assert only.runtime == "ollama"
