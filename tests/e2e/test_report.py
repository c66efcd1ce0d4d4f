"""gpubench report: aggregation (report.py), the Markdown, the HTML, and the command,
against a real manifest file with known results."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from chromium import DevTools
from e2e_helpers import pytest_env

from pytest_gpubench.commands.cli import main
from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, PerformanceResults, TestConfig
from pytest_gpubench.remote.readings import HardwareInfo
from pytest_gpubench.report.charts import Bar, Point, bar_chart, nice_ticks, scatter_chart
from pytest_gpubench.report.gather import build_report, write_reports
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

REPO = Path(__file__).resolve().parents[2]
DURATION = 200.0


def make_result(gpu: str, model: str, provider: str, tokens: int, price: float, *,
                per_stream: float = 0.0, ttft: float = 40.0, requests: int = 50, errors: int = 0) -> BenchmarkResult:
    """A result of ``tokens`` output tokens over 200 s: output throughput tokens / 200."""
    return BenchmarkResult(
        hardware=HardwareInfo(gpu_name=f"NVIDIA GeForce {gpu}", gpu_count=1),
        model=ModelInfo(name=model, runtime="ollama"),
        test_config=TestConfig(concurrent_reqs=1, duration_minutes=3),
        results=PerformanceResults(total_requests=requests, total_errors=errors, total_tokens=tokens,
                                   duration_seconds=DURATION, avg_tokens_per_second=per_stream or tokens / DURATION,
                                   p50_ttft_ms=ttft),
        provider=provider, location="Spain, ES" if "3090" in gpu else "US", price_per_hour=price,
    )


class Builder:
    """Writes cells as the plugin does: cell, session and attempt, result, outcome."""

    def __init__(self, manifest: Manifest) -> None:
        self.m = manifest
        self.sessions = 0

    def run(self, run_id: str, started: str, finished: str | None = "auto") -> str:
        self.m.start_run(run_id, ["pytest"], [])
        self.m.db["runs"].update(run_id, {"started_at": started})
        if finished:
            self.m.db["runs"].update(run_id, {"finished_at": started if finished == "auto" else finished,
                                              "status": "passed"})
        return run_id

    def cell(self, run_id: str, gpu: str, provider: str, model: str, *, status: str = "success",
             result: BenchmarkResult | None = None, stage: str | None = None, message: str | None = None,
             session_cost: float | None = None, cell_cost: float | None = None, attempt: bool = True,
             shared_session: str | None = None, load: dict | None = None) -> str:
        cell_id = f"{gpu.replace(' ', '_')}-{provider}-{model}"
        row_id = self.m.add_cell(run_id, cell_id, gpu_type=gpu, provider=provider, model=model,
                                 matrix_file="m.yaml")
        price = result.price_per_hour if result else 0.5
        session_id = shared_session
        if session_id is None and session_cost is not None:
            self.sessions += 1
            session_id = f"session-{run_id}-{self.sessions}"
            if attempt:
                self.m.start_attempt(row_id, 1, offer_id="offer", provider=provider, gpu_type=gpu,
                                     price_per_hour=price)
                self.m.update_attempt(row_id, 1, session_id=session_id)
                self.m.end_attempt(row_id, 1, cost_usd=session_cost)
        elif session_cost is None and shared_session is None and stage == "provision" and attempt:
            self.m.start_attempt(row_id, 1, offer_id="offer", provider=provider, gpu_type=gpu, price_per_hour=price)
            self.m.end_attempt(row_id, 1, status="failed", stage="provision", error=message)
        if session_id is not None:
            self.m.record_session(row_id, session_id=session_id, consumer_id=f"gpubench-{run_id}-{cell_id}",
                                  offer_id="offer", price_per_hour=price)
        if result is not None:
            benchmark_id = self.m.add_benchmark(row_id, result, [])
            self.m.set_details(benchmark_id, {"load": load or {"concurrency": 1, "rate": None},
                                              "validity": {"valid": True, "reasons": []}})
        self.m.finish_cell(row_id, status=status, failure_stage=stage, error_message=message,
                           cost_usd=cell_cost if cell_cost is not None else (session_cost or 0.0))
        return row_id


@pytest.fixture
def manifest_path(tmp_path) -> Path:
    """Three runs with known results, failures, a shared session and an imported-style run.

    run-a (oldest): 4090/vastai/qwen 180 tok/s, 4090/tensordock/qwen 150, 3090/vastai/qwen 120,
                    3090/vastai/llama failed at model_pull, A100/vastai/qwen failed at provision.
    run-b:          4090/vastai/qwen 200 (replaces run-a's), 3090/vastai/llama 100, 4090/vastai/llama
                    150 partial (one shared session with the 4090 qwen cell), A100 failed again,
                    H100 skipped.
    run-c (newest): 3090/vastai/qwen partial 60: run-a's success stays; no attempts rows.
    """
    path = tmp_path / "reports" / "manifest.db"
    with Manifest(path) as m:
        b = Builder(m)
        a = b.run("run-a", "2026-11-20T10:00:00.000+00:00")
        b.cell(a, "RTX 4090", "vastai", "qwen2:7b", result=make_result("RTX 4090", "qwen2:7b", "vastai", 36000, 0.36),
               session_cost=0.10)
        b.cell(a, "RTX 4090", "tensordock", "qwen2:7b",
               result=make_result("RTX 4090", "qwen2:7b", "tensordock", 30000, 0.44), session_cost=0.12)
        b.cell(a, "RTX 3090", "vastai", "qwen2:7b",
               result=make_result("RTX 3090", "qwen2:7b", "vastai", 24000, 0.08, per_stream=260.0),
               session_cost=0.03)
        b.cell(a, "RTX 3090", "vastai", "llama3:8b", status="failed", stage="model_pull",
               message="pull failed: manifest unknown", session_cost=0.02)
        b.cell(a, "A100 80GB", "vastai", "qwen2:7b", status="failed", stage="provision",
               message="session failed: No available public IPs")
        bb = b.run("run-b", "2026-11-21T10:00:00.000+00:00")
        owner = b.cell(bb, "RTX 4090", "vastai", "qwen2:7b",
                       result=make_result("RTX 4090", "qwen2:7b", "vastai", 40000, 0.30, per_stream=210.0),
                       session_cost=0.25, cell_cost=0.15)
        shared = m.cell(owner)["session_id"]
        b.cell(bb, "RTX 4090", "vastai", "llama3:8b", status="partial", stage="benchmark",
               message="the instance is gone | lost",
               result=make_result("RTX 4090", "llama3:8b", "vastai", 30000, 0.30), shared_session=shared,
               cell_cost=0.08)
        b.cell(bb, "RTX 3090", "vastai", "llama3:8b",
               result=make_result("RTX 3090", "llama3:8b", "vastai", 20000, 0.08, ttft=55.0, errors=2),
               session_cost=0.04)
        b.cell(bb, "A100 80GB", "vastai", "qwen2:7b", status="failed", stage="provision",
               message="session failed: No available public IPs")
        b.cell(bb, "H100", "vastai", "qwen2:7b", status="skipped", stage="inventory",
               message="no eligible offer for H100")
        c = b.run("run-c", "2026-11-22T10:00:00.000+00:00")
        b.cell(c, "RTX 3090", "vastai", "qwen2:7b", status="partial", stage="benchmark",
               message="the instance is gone | lost",
               result=make_result("RTX 3090", "qwen2:7b", "vastai", 12000, 0.08), session_cost=0.05, attempt=False)
    return path


def per_million(price: float, tps: float) -> float:
    """The headline definition: $/h / (output tok/s x 3600) x 1e6."""
    return price / (tps * 3600) * 1e6


def key(row) -> tuple[str, str, str]:
    return (row.gpu, row.provider, row.model)


# ---------------------------------------------------------------- aggregation


def test_latest_successful_result_per_cell_and_the_rankings(manifest_path):
    with Manifest(manifest_path) as m:
        report = build_report(SqliteStore(m))
    assert report.run_ids == ["run-c", "run-b", "run-a"]
    by_key = {key(r): r for r in report.results}
    assert len(report.results) == 5 and report.replaced == 2 and report.runs_combined == 2
    assert by_key[("RTX 4090", "vastai", "qwen2:7b")].run_id == "run-b"  # the later success wins
    assert by_key[("RTX 3090", "vastai", "qwen2:7b")].run_id == "run-a"  # a success beats a later partial
    assert by_key[("RTX 3090", "vastai", "qwen2:7b")].status == "success"
    assert by_key[("RTX 4090", "vastai", "llama3:8b")].status == "partial"  # the only one: shown, marked

    # Ranked by output throughput, not by the per-stream rate (260 would put the 3090 first).
    assert [(key(r), r.output_tokens_per_second) for r in report.by_tokens] == [
        (("RTX 4090", "vastai", "qwen2:7b"), 200.0),
        (("RTX 4090", "tensordock", "qwen2:7b"), 150.0),  # a tie at 150: GPU, provider, model order
        (("RTX 4090", "vastai", "llama3:8b"), 150.0),
        (("RTX 3090", "vastai", "qwen2:7b"), 120.0),
        (("RTX 3090", "vastai", "llama3:8b"), 100.0),
    ]
    assert by_key[("RTX 3090", "vastai", "qwen2:7b")].decode_tokens_per_second == 260.0
    expected_cost = {("RTX 3090", "vastai", "qwen2:7b"): per_million(0.08, 120),
                     ("RTX 3090", "vastai", "llama3:8b"): per_million(0.08, 100),
                     ("RTX 4090", "vastai", "qwen2:7b"): per_million(0.30, 200),
                     ("RTX 4090", "vastai", "llama3:8b"): per_million(0.30, 150),
                     ("RTX 4090", "tensordock", "qwen2:7b"): per_million(0.44, 150)}
    assert [key(r) for r in report.by_cost] == list(expected_cost)
    for row in report.by_cost:
        assert row.cost_per_million_tokens == pytest.approx(expected_cost[key(row)], rel=1e-9)
    assert per_million(0.08, 120) == pytest.approx(0.185185, rel=1e-5)  # the arithmetic itself

    qwen, = (t for t in report.models if t.model == "qwen2:7b")
    assert [key(r) for r in qwen.rows] == [("RTX 4090", "vastai", "qwen2:7b"), ("RTX 4090", "tensordock", "qwen2:7b"),
                                            ("RTX 3090", "vastai", "qwen2:7b")]
    assert key(qwen.fastest) == ("RTX 4090", "vastai", "qwen2:7b")
    assert key(qwen.cheapest) == ("RTX 3090", "vastai", "qwen2:7b")
    assert report.best_value.model_dump() == {"gpu": "RTX 3090", "provider": "vastai", "cheapest_on": 2, "models": 2}


def test_head_to_head_failures_and_spend(manifest_path):
    with Manifest(manifest_path) as m:
        report = build_report(SqliteStore(m))
    (matchup,) = report.matchups
    assert (matchup.gpu, matchup.model, matchup.load) == ("RTX 4090", "qwen2:7b", "c1")
    assert [r.provider for r in matchup.entries] == ["tensordock", "vastai"]
    assert (matchup.faster, matchup.cheaper) == ("vastai", "vastai")
    assert [w.model_dump() for w in report.provider_wins] == [
        {"provider": "tensordock", "faster": 0, "cheaper": 0, "matchups": 1},
        {"provider": "vastai", "faster": 1, "cheaper": 1, "matchups": 1}]

    # Grouped by stage (in stage order) and message, counted.
    assert [(g.stage, g.count, g.message) for g in report.failures] == [
        ("provision", 2, "session failed: No available public IPs"),
        ("model_pull", 1, "pull failed: manifest unknown"),
        ("benchmark", 2, "the instance is gone | lost"),
    ]
    assert report.failures[0].cells == ["A100 80GB / vastai / qwen2:7b"]
    assert report.failures[2].cells == ["RTX 3090 / vastai / qwen2:7b", "RTX 4090 / vastai / llama3:8b"]
    assert [(g.stage, g.count) for g in report.skipped] == [("inventory", 1)]
    assert report.statuses == {"failed": 3, "partial": 2, "skipped": 1, "success": 5}

    # The shared session is billed once (its attempt, 0.25), not as the cells' shares (0.15 + 0.08).
    spend = {run.run_id: run for run in report.runs}
    assert spend["run-a"].spent_usd == pytest.approx(0.27) and spend["run-a"].sessions == 4
    assert spend["run-b"].spent_usd == pytest.approx(0.29) and spend["run-b"].sessions == 2
    assert spend["run-b"].cells_cost_usd == pytest.approx(0.27)
    assert (spend["run-c"].spent_from, spend["run-c"].spent_usd) == ("cells", pytest.approx(0.05))
    assert report.spent_usd == pytest.approx(0.61) and report.sessions == 7


def test_one_run_or_several(manifest_path):
    with Manifest(manifest_path) as m:
        only_a = build_report(SqliteStore(m), ["run-a"])
        a_and_c = build_report(SqliteStore(m), ["run-a", "run-c"])
    assert only_a.run_ids == ["run-a"] and only_a.replaced == 0
    assert {key(r): r.output_tokens_per_second for r in only_a.results}[("RTX 4090", "vastai", "qwen2:7b")] == 180.0
    assert only_a.spent_usd == pytest.approx(0.27) and only_a.statuses == {"failed": 2, "success": 3}
    assert a_and_c.run_ids == ["run-c", "run-a"] and a_and_c.replaced == 1


def test_a_session_never_released_counts_up_to_the_runs_end(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        b = Builder(m)
        run = b.run("run-x", "2026-11-20T10:00:00.000+00:00", finished="2026-11-20T11:00:00.000+00:00")
        row_id = b.cell(run, "RTX 4090", "vastai", "qwen2:7b", status="failed", stage="benchmark",
                        message="worker crashed", attempt=False)
        m.start_attempt(row_id, 1, offer_id="offer", provider="vastai", gpu_type="RTX 4090", price_per_hour=0.60)
        m.update_attempt(row_id, 1, session_id="s-1", session_started_at="2026-11-20T10:30:00.000+00:00")
        report = build_report(SqliteStore(m), now=datetime(2030, 1, 1, tzinfo=timezone.utc))
    (spend,) = report.runs
    assert spend.open_sessions == 1 and spend.spent_usd == pytest.approx(0.30)  # 30 min at $0.60/h
    assert "with no recorded end" in render_markdown(report)


def test_an_imported_result_without_totals_ranks_on_its_per_stream_rate(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        run = Builder(m).run("imported", "2026-11-20T10:00:00.000+00:00")
        row_id = m.add_cell(run, "x", gpu_type="RTX 5090", provider="vastai", model="qwen2:7b", matrix_file="import")
        m.add_benchmark(row_id, BenchmarkResult(model=ModelInfo(name="qwen2:7b"), price_per_hour=0.21,
                                                results=PerformanceResults(avg_tokens_per_second=304.8)))
        m.finish_cell(row_id, status="success")
        report = build_report(SqliteStore(m))
    (row,) = report.results
    assert row.per_stream_only and row.output_tokens_per_second == 304.8
    assert row.cost_per_million_tokens == pytest.approx(per_million(0.21, 304.8))
    assert "304.8 †" in render_markdown(report)


def test_each_load_is_its_own_cell_and_gets_a_column(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        b = Builder(m)
        run = b.run("run-l", "2026-11-20T10:00:00.000+00:00")
        b.cell(run, "RTX 4090", "vastai", "qwen2:7b", result=make_result("RTX 4090", "qwen2:7b", "vastai", 20000, 0.4),
               session_cost=0.01)
        m.add_cell(run, "RTX_4090-vastai-qwen2:7b-c8", gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                   matrix_file="m.yaml")
        row_id = f"{run}/RTX_4090-vastai-qwen2:7b-c8"
        bench = m.add_benchmark(row_id, make_result("RTX 4090", "qwen2:7b", "vastai", 160000, 0.4))
        m.set_details(bench, {"load": {"concurrency": 8, "rate": None}})
        m.finish_cell(row_id, status="success")
        report = build_report(SqliteStore(m))
    assert [(r.load, r.output_tokens_per_second) for r in report.by_tokens] == [("c8", 800.0), ("c1", 100.0)]
    rows = table_rows(section(render_markdown(report), "Tokens/s leaderboard"))
    assert [row[3:5] for row in rows] == [["c8", "800.0"], ["c1", "100.0"]]


# ----------------------------------------------------------------- Markdown


def section(markdown: str, title: str) -> str:
    start = markdown.index(f"## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start: end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the tables in ``text``, each cell as it reads rendered (escapes read)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[rendered(cell.strip()) for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[1:]]


def rendered(text: str) -> str:
    """``text`` with CommonMark's backslash escapes read (``\\(`` is ``(``), as a reader sees it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def test_markdown_sections_and_figures(manifest_path):
    with Manifest(manifest_path) as m:
        markdown = render_markdown(build_report(SqliteStore(m)))
    for title in ("Headline findings", "Tokens/s leaderboard", "$ per million tokens leaderboard", "Results by model",
                  "Provider head-to-head", "Failures by stage", "Spend", "Figures"):
        assert f"\n## {title}\n" in markdown
    headlines = rendered(section(markdown, "Headline findings"))
    assert ("- **qwen2:7b**: fastest RTX 4090 on vastai (200.0 output tok/s); cheapest RTX 3090 on vastai "
            "($0.19/M tokens)") in headlines
    assert "- **Best value**: RTX 3090 on vastai, the lowest $/M tokens on 2 of the 2 models it ran" in headlines
    assert "- **Cells**: 10 ran: 5 succeeded, 2 partial, 3 failed; 1 skipped" in headlines
    assert "- **Total spend**: $0.6100 across 7 sessions" in headlines
    assert "- **Runs combined**: 2: the latest successful result of each cell; 2 earlier results" in headlines

    # One ranking per model: llama3:8b's two results never rank against qwen2:7b's three.
    tokens = section(markdown, "Tokens/s leaderboard")
    assert [row[:5] for row in table_rows(tokens.split("### qwen2:7b\n")[1])] == [
        ["1", "RTX 4090", "vastai", "200.0", "$0.300"],
        ["2", "RTX 4090", "tensordock", "150.0", "$0.440"],
        ["3", "RTX 3090", "vastai", "120.0", "$0.080"],
    ]
    assert [row[:5] for row in table_rows(tokens.split("### llama3:8b\n")[1].split("###")[0])] == [
        ["1", "RTX 4090 (partial)", "vastai", "150.0", "$0.300"],
        ["2", "RTX 3090", "vastai", "100.0", "$0.080"],
    ]
    cost = section(markdown, "$ per million tokens leaderboard")
    assert [(row[0], row[1], row[3]) for row in table_rows(cost.split("### qwen2:7b\n")[1])] == [
        ("1", "RTX 3090", "$0.19"), ("2", "RTX 4090", "$0.42"), ("3", "RTX 4090", "$0.81")]
    assert [(row[0], row[1], row[3]) for row in table_rows(cost.split("### llama3:8b\n")[1].split("###")[0])] == [
        ("1", "RTX 3090", "$0.22"), ("2", "RTX 4090 (partial)", "$0.56")]

    llama = section(markdown, "Results by model").split("### llama3:8b\n")[1].split("###")[0]
    assert table_rows(llama) == [
        ["RTX 4090 (partial)", "vastai", "150.0", "150.0", "40", "$0.300", "$0.56", "50", "0"],
        ["RTX 3090", "vastai", "100.0", "100.0", "55", "$0.080", "$0.22", "50", "2"],
    ]
    assert ("**Fastest**: RTX 4090 on vastai (150.0 output tok/s). **Cheapest**: RTX 3090 on vastai "
            "($0.22/M tokens).") in rendered(llama)

    (matchup,) = table_rows(section(markdown, "Provider head-to-head"))
    assert matchup == ["RTX 4090", "qwen2:7b", "tensordock 150.0, vastai 200.0", "tensordock $0.440, vastai $0.300",
                       "tensordock $0.81, vastai $0.42", "vastai", "vastai"]

    failures = table_rows(section(markdown, "Failures by stage").split("### Skipped")[0])
    assert [row[:3] for row in failures] == [
        ["provision", "2", "session failed: No available public IPs"],
        ["model_pull", "1", "pull failed: manifest unknown"],
        ["benchmark", "2", "the instance is gone | lost"],  # a pipe in a message does not split the row
    ]
    skipped = table_rows(section(markdown, "Failures by stage").split("### Skipped cells")[1])
    assert skipped == [["inventory", "1", "no eligible offer for H100", "H100 / vastai / qwen2:7b"]]

    spend = table_rows(section(markdown, "Spend"))
    assert [row[0] for row in spend] == ["run-c", "run-b", "run-a", "Total"]
    assert spend[1][3:] == ["5", "2", "$0.2900", "$0.2700"]
    assert spend[-1][3:] == ["11", "7", "$0.6100", "$0.5900"]
    assert "run-c: no provisioning attempts recorded" in section(markdown, "Spend")


def test_output_is_deterministic_and_user_text_is_escaped(tmp_path, manifest_path):
    with Manifest(manifest_path) as m:
        first = build_report(SqliteStore(m))
        second = build_report(SqliteStore(m))
        row_id = m.add_cell("run-c", "evil", gpu_type="RTX 4090", provider="vastai",
                            model="<script>alert(1)</script>", matrix_file="m.yaml")
        m.finish_cell(row_id, status="failed", failure_stage="benchmark",
                      error_message='<img src=x onerror="alert(2)"> & | broken\nline')
        evil = build_report(SqliteStore(m))
    assert render_markdown(first) == render_markdown(second) and render_html(first) == render_html(second)
    markdown, html = render_markdown(evil), render_html(evil)
    assert "<script>alert" not in markdown and "<img" not in markdown
    assert "&lt;img src=x onerror=\"alert\\(2\\)\"&gt; &amp; \\| broken line" in markdown
    assert "<script>alert" not in html and "<img" not in html
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt; &amp; | broken line" in html


#: Markdown that turns text into something else: a link, an image, a code span, emphasis, HTML.
_ACTIVE = re.compile(r"\]\(|!\[|\[[^\]]*\]|`|<|\*\*\S|__\S|~~")


def _unescaped(line: str) -> str:
    """``line`` with every backslash escape (a backslash and the ASCII punctuation after it) removed:
    what CommonMark would still read as syntax."""
    return re.sub(r"\\[!-/:-@\[-`{-~]", "", line)


def test_hostile_model_provider_and_error_text_stay_text_in_the_markdown(tmp_path):
    """Issue 21 item 12: a model, provider, GPU or error message from the store never becomes a live
    link, image, code span or emphasis in BENCHMARK_REPORT.md (it did: ``[ ] ( ) !`` went through)."""
    model, provider = "[x](https://evil.example/m)", "![p](https://evil.example/p.png)"
    message = "see [docs](javascript:alert(1)) **now** `rm -rf` _x_ ~~y~~ #z"
    with Manifest(tmp_path / "manifest.db") as m:
        b = Builder(m)
        run = b.run("run-h", "2026-11-20T10:00:00.000+00:00")
        b.cell(run, "RTX 4090", provider, model, result=make_result("RTX 4090", model, provider, 36000, 0.36),
               session_cost=0.10)
        b.cell(run, "[g](https://evil.example/g)", provider, model, status="failed", stage="benchmark",
               message=message, session_cost=0.01)
        markdown = render_markdown(build_report(SqliteStore(m)))
    hostile = [line for line in markdown.splitlines() if "evil.example" in line or "javascript" in line]
    assert len(hostile) >= 5, markdown  # headings, leaderboards, the failures table
    for line in hostile:
        # Our own bold (``- **lead**:``, never escaped) is the only syntax left once the escapes are read.
        live = _ACTIVE.findall(_unescaped(re.sub(r"(?<!\\)\*\*", "", line)))
        assert not live, f"{live} live in: {line}"
        assert "](" not in line and "![" not in line
    assert "\\[x\\]\\(https://evil.example/m\\)" in markdown  # escaped, still readable as text
    failures = section(markdown, "Failures by stage")
    assert "see \\[docs\\]\\(javascript:alert\\(1\\)\\) \\*\\*now\\*\\* \\`rm -rf\\` \\_x\\_ \\~\\~y\\~\\~ \\#z" \
        in failures, failures


# --------------------------------------------------------------------- HTML


class _Scan(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_with_charts_and_sortable_tables(manifest_path):
    with Manifest(manifest_path) as m:
        html = render_html(build_report(SqliteStore(m)))
    scan = _Scan()
    scan.feed(html)
    tags = [tag for tag, _ in scan.tags]
    # Nothing loads from anywhere: no external script, style, image, font or frame.
    for tag, attrs in scan.tags:
        assert not attrs.get("src") and tag not in ("link", "iframe", "img", "object", "embed"), (tag, attrs)
        assert not (attrs.get("href") or "").startswith(("http", "//")), attrs
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace
    (csp,) = [a["content"] for t, a in scan.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp.startswith("default-src 'none';")  # the page itself forbids fetching anything
    assert tags.count("script") == 1 and tags.count("style") == 1
    bar_charts = [attrs for tag, attrs in scan.tags if tag == "svg" and "bar-chart" in (attrs.get("class") or "")]
    assert [a["data-chart"] for a in bar_charts] == ["tokens/s llama3:8b", "tokens/s qwen2:7b"]
    assert tags.count("rect") == 5 and sum(1 for t, a in scan.tags if t == "circle" and a.get("class") == "point") == 5
    tables = [attrs["data-table"] for tag, attrs in scan.tags if tag == "table"]
    assert [t for t in tables if not t.startswith("percentiles ")] == [
        "tokens llama3:8b", "tokens qwen2:7b", "cost llama3:8b", "cost qwen2:7b", "model llama3:8b", "model qwen2:7b",
        "head-to-head", "failures", "skipped", "spend"]
    assert sum(t.startswith("percentiles ") for t in tables) == 5  # one per cell


def test_charts_scale_and_escape():
    assert nice_ticks(273.4) == [0, 100, 200, 300] and nice_ticks(200) == [0, 50, 100, 150, 200]
    assert nice_ticks(0.9) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    near = scatter_chart([Point(100, 0.2, "a", "t"), Point(200, 0.4, "b", "t")], name="s", x_label="x", y_label="y")
    assert 'data-log-y="false"' in near
    spread = [Point(300, 0.13, "qwen2:7b", "t"), Point(36, 15.3, "deepseek-r1:70b", "t"),
              Point(3.5, 26.6, "deepseek-r1:70b", "t")]
    wide = scatter_chart(spread, name="s", x_label="x", y_label="y")
    assert 'data-log-y="true"' in wide and "(log scale)" in wide
    heights = [float(y) for y in re.findall(r'class="point" cx="[0-9.]+" cy="([0-9.]+)"', wide)]
    assert heights[0] > heights[1] > heights[2]  # cheaper is lower on the page
    bars = bar_chart([Bar("<b>x</b>", 10.0, "10.0", 'a "quoted" <title>')], name="n<", unit="u")
    assert "<b>" not in bars and "&lt;b&gt;x&lt;/b&gt;" in bars and 'data-chart="n&lt;"' in bars


def test_write_reports_makes_the_directory(tmp_path, manifest_path):
    with Manifest(manifest_path) as m:
        markdown, html = write_reports(build_report(SqliteStore(m)), tmp_path / "out" / "deeper")
    assert markdown.name == "BENCHMARK_REPORT.md" and html.name == "index.html"
    assert markdown.read_text().startswith("# GPU Benchmark Report\n") and html.read_text().startswith("<!DOCTYPE")


# ---------------------------------------------------------------------- CLI


def test_command_writes_both_files_and_says_where(tmp_path, manifest_path, capsys):
    out = tmp_path / "site"
    assert main(["report", "--store", str(manifest_path), "--reports", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == (f"gpubench report: 5 results from 2 of 3 runs, 5 failed or partial cells; "
                       f"wrote {out / 'BENCHMARK_REPORT.md'} and {out / 'index.html'}")
    assert "| 1 | RTX 4090 | vastai | 200.0 |" in (out / "BENCHMARK_REPORT.md").read_text()

    assert main(["report", "--store", str(manifest_path), "--reports", str(out), "--run", "last"]) == 0
    latest = rendered((out / "BENCHMARK_REPORT.md").read_text())
    assert "1 result from 1 of 1 run" in latest and "RTX 3090 (partial)" in latest and "run-a" not in latest
    assert main(["report", "--store", str(manifest_path), "--reports", str(out),
                 "--run", "run-a", "--run", "run-b", "--run", "run-a"]) == 0
    both = (out / "BENCHMARK_REPORT.md").read_text()
    assert "from 2 of 2 runs" in both and "run-c" not in both


def test_command_defaults_to_the_reports_dir(tmp_path, manifest_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUBENCH_STORE", raising=False)
    monkeypatch.setenv("GPUBENCH_REPORTS", str(manifest_path.parent))
    assert main(["report"]) == 0
    assert (manifest_path.parent / "BENCHMARK_REPORT.md").is_file()
    assert (manifest_path.parent / "index.html").is_file()
    monkeypatch.delenv("GPUBENCH_REPORTS")
    monkeypatch.chdir(tmp_path)  # reports/manifest.db is right here
    (manifest_path.parent / "index.html").unlink()
    assert main(["report"]) == 0 and (tmp_path / "reports" / "index.html").is_file()


@pytest.mark.parametrize("case", ["no manifest", "unknown run", "no runs", "unwritable"])
def test_command_errors_are_one_line(tmp_path, manifest_path, capsys, case):
    args = ["report", "--store", str(manifest_path), "--reports", str(tmp_path / "out")]
    expected_status, expected = 2, ""
    if case == "no manifest":
        args[2] = str(tmp_path / "missing.db")
        expected = f"no manifest at {tmp_path / 'missing.db'}"
    elif case == "unknown run":
        args += ["--run", "run-z"]
        expected = "no run 'run-z' in the manifest"
    elif case == "no runs":
        Manifest(tmp_path / "empty.db").close()
        args[2] = str(tmp_path / "empty.db")
        expected = "has no runs yet: nothing to report"
    else:
        blocker = tmp_path / "file"
        blocker.write_text("not a directory")
        args[4] = str(blocker / "out")
        expected_status, expected = 1, f"cannot write the report to {blocker / 'out'}: "
    assert main(args) == expected_status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpubench report: error: ") and expected in err, err


def test_console_command_runs_without_traceback(tmp_path, manifest_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "report", "--store", str(manifest_path),
                           "--reports", str(tmp_path / "o"), "--run", "nope"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1


# ------------------------------------------------------------------ Chromium




_CHARTS_JS = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width, h: r.height}; };
  const bars = [...document.querySelectorAll('svg.bar-chart')].map(svg => ({
    name: svg.dataset.chart, box: box(svg),
    widths: [...svg.querySelectorAll('rect.bar')].map(r => r.getBoundingClientRect().width)}));
  const scatters = [...document.querySelectorAll('svg.scatter-chart')];
  const inside = scatters.flatMap(scatter => [...scatter.querySelectorAll('circle.point')].map(c => {
    const p = box(c), s = box(scatter);
    return p.w > 0 && p.x >= s.x && p.y >= s.y && p.x + p.w <= s.x + s.w && p.y + p.h <= s.y + s.h; }));
  return {bars, scatters: scatters.map(s => ({name: s.dataset.chart, box: box(s)})), points: inside,
          scripts: document.scripts.length,
          failures: document.querySelector('table[data-table=failures]').innerText};
})()"""


def _column_js(table: str, column: int, attribute: bool) -> str:
    value = "c.dataset.sort" if attribute else "c.textContent"
    return (f"[...document.querySelectorAll('table[data-table={table}] tbody tr')]"
            f".map(r => {{ const c = r.cells[{column}]; return {value}; }})")


@pytest.mark.timeout(120)
def test_index_html_renders_its_charts_in_chromium_without_errors(tmp_path, manifest_path, chromium):
    with Manifest(manifest_path) as m:
        # User data that would run script if it were not escaped.
        row_id = m.add_cell("run-c", "evil", gpu_type="RTX 4090", provider="vastai",
                            model="<img src=x onerror=\"console.error('xss')\">", matrix_file="m.yaml")
        m.finish_cell(row_id, status="failed", failure_stage="benchmark", error_message="<script>throw 1</script>")
        _, html = write_reports(build_report(SqliteStore(m)), tmp_path / "site")

    async def scenario() -> None:
        async with DevTools(chromium.websocket_url()) as tools:
            page = await tools.new_page()
            await page.send("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
            await page.navigate(html.as_uri())
            charts = await page.evaluate(_CHARTS_JS)
            assert [c["name"] for c in charts["bars"]] == ["tokens/s llama3:8b", "tokens/s qwen2:7b"]
            for chart in charts["bars"]:
                assert chart["box"]["w"] > 300 and chart["box"]["h"] > 40, chart
                assert all(width > 0 for width in chart["widths"]), chart
                assert chart["widths"] == sorted(chart["widths"], reverse=True), chart  # fastest first
            assert [len(c["widths"]) for c in charts["bars"]] == [2, 3]
            # 200 vs 150 tok/s: the bars' lengths are the figures' ratio.
            assert charts["bars"][1]["widths"][0] / charts["bars"][1]["widths"][1] == pytest.approx(200 / 150,
                                                                                                   rel=0.02)
            # One scatter per model: a model's results are never drawn against another's.
            assert [c["name"] for c in charts["scatters"]] == ["cost against tokens/s llama3:8b",
                                                                "cost against tokens/s qwen2:7b"]
            assert all(c["box"]["w"] > 300 and c["box"]["h"] > 200 for c in charts["scatters"])
            assert charts["points"] == [True] * 5  # every point drawn, inside its chart
            assert charts["scripts"] == 1 and "<script>throw 1</script>" in charts["failures"]

            table = '"tokens qwen2:7b"'
            tps_column = _column_js(table, 3, attribute=True)
            before = await page.evaluate(tps_column)
            assert [float(v) for v in before] == [200, 150, 120]
            await page.click(f"table[data-table={table}] thead th:nth-child(4)")
            ascending = await page.evaluate(tps_column)
            assert [float(v) for v in ascending] == [120, 150, 200]
            await page.click(f"table[data-table={table}] thead th:nth-child(4)")
            assert [float(v) for v in await page.evaluate(tps_column)] == [200, 150, 120]
            await page.click(f"table[data-table={table}] thead th:nth-child(3)")  # Provider: text order
            assert await page.evaluate(_column_js(table, 2, attribute=False)) == ["tensordock", "vastai", "vastai"]
            state = await page.evaluate(
                f"[...document.querySelectorAll('table[data-table={table}] th')].map(th => th.getAttribute('aria-sort'))")
            assert state == [None, None, "ascending", None, None, None, None]

            assert page.errors() == []
            # Nothing fetched but the page itself (a browser may ask for a favicon next to it).
            assert html.as_uri() in page.requested()
            assert set(page.requested()) <= {html.as_uri(), (html.parent / "favicon.ico").as_uri()}

    asyncio.run(scenario())


# ------------------------------------------------------- a real sandbox run

TIME_SCALE = 0.02  # the module's sandbox (tests/e2e/conftest.py)


@pytest.mark.slow
def test_report_of_a_real_sandbox_run_matches_its_summary(tmp_path, sandbox, api):
    offers = api.get("/api/v1/inventory", params={"provider": "vastai"}).json()["offers"]
    cheapest_3090 = min((o for o in offers if o["gpu_type"] == "RTX 3090"), key=lambda o: o["price_per_hour"])
    api.post("/sandbox/faults", json={"offer_id": cheapest_3090["id"], "fault": "provision_error",
                                      "message": "No available public IPs"}).raise_for_status()
    env = pytest_env()  # the sandbox's token
    reports = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "matrix" / "gpubench_quick.yaml"), "-p", "no:cacheprovider",
         "--gpubench-reports", str(reports), "--gpubench-api", sandbox.url, "--gpubench-time-scale",
         str(TIME_SCALE), "-k", "3090 or 1.5b", "--gpubench-duration", "2", "--gpubench-max-attempts", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    printed_spend = float(re.search(r"; spent \$([0-9.]+)", done.stdout).group(1))

    made = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "report", "--store",
                           str(reports / "manifest.db"), "--reports", str(reports)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("gpubench report: 1 result from 1 of 1 run, 1 failed or partial cell; wrote ")
    markdown = (reports / "BENCHMARK_REPORT.md").read_text()
    with Manifest(reports / "manifest.db") as m:
        (bench,) = m.benchmarks()
        report = build_report(SqliteStore(m))
    output_tps = bench["total_tokens"] / bench["duration_seconds"]
    (row,) = report.by_tokens
    assert (row.gpu, row.model, row.output_tokens_per_second) == ("RTX 4090", "qwen2:1.5b", pytest.approx(output_tps))
    assert row.cost_per_million_tokens == pytest.approx(bench["price_per_hour"] / (output_tps * 3600) * 1e6)
    assert "### qwen2:1.5b\n\n| Rank | GPU | Provider | output tok/s |" in markdown
    assert f"| 1 | RTX 4090 | vastai | {output_tps:.1f} |" in markdown
    (failure,) = table_rows(section(markdown, "Failures by stage"))
    assert failure[:2] == ["provision", "1"] and "No available public IPs" in failure[2]
    assert failure[3] == "RTX 3090 / vastai / qwen2:7b"
    # The report's spend is the run summary's, to the printed precision.
    assert report.spent_usd == pytest.approx(printed_spend, abs=2e-4) and report.spent_usd > 0
    assert report.sessions == 2  # the failed create made a session too; it was billed (for seconds)
