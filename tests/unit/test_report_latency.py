"""The report's latency views (a percentile table per cell, latency against throughput
for load sweeps) and its chart legibility: labelled points, fixed provider colours,
axis titles clear of the tick labels (measured in Chromium)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import DevTools

from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults, TestConfig
from pytest_gpubench.report.charts import PROVIDER_COLORS, Bar, Point, bar_chart, provider_color, scatter_chart
from pytest_gpubench.report.gather import build_report, write_reports
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.report.sweep import percentile_table, sweeps
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

DURATION = 100.0
#: (provider, concurrency) -> (output tokens over 100 s, e2e p50 ms): throughput saturates, latency grows.
SWEEP = {("vastai", 1): (5000, 1300.0), ("vastai", 4): (16000, 1600.0), ("vastai", 8): (22000, 2300.0),
         ("tensordock", 1): (4500, 1400.0), ("tensordock", 8): (19000, 2600.0)}


def _result(provider: str, tokens: int, concurrency: int) -> BenchmarkResult:
    return BenchmarkResult(test_config=TestConfig(concurrent_reqs=concurrency), provider=provider, price_per_hour=0.4,
                           results=PerformanceResults(total_requests=40, total_tokens=tokens,
                                                      duration_seconds=DURATION, avg_tokens_per_second=50.0,
                                                      p50_ttft_ms=40.0))


@pytest.fixture
def sweep_manifest(tmp_path) -> Path:
    path = tmp_path / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-s", ["pytest"], [])
        for (provider, concurrency), (tokens, e2e) in SWEEP.items():
            row = m.add_cell("run-s", f"RTX_4090-{provider}-qwen2:7b-c{concurrency}", gpu_type="RTX 4090",
                             provider=provider, model="qwen2:7b", matrix_file="m.yaml")
            bench = m.add_benchmark(row, _result(provider, tokens, concurrency))
            m.set_details(bench, {"load": {"concurrency": concurrency, "rate": None},
                                  "metrics": {"ttft_p50_ms": 40.0 * concurrency, "ttft_p95_ms": 60.0 * concurrency,
                                              "ttft_p99_ms": 90.0 * concurrency, "tpot_p50_ms": 5.0,
                                              "tpot_p95_ms": 6.5, "tpot_p99_ms": 8.25, "itl_p50_ms": 4.9,
                                              "itl_p95_ms": 7.0, "itl_p99_ms": 12.0, "e2e_p50_ms": e2e,
                                              "e2e_p95_ms": e2e * 1.2, "e2e_p99_ms": e2e * 1.5}})
            m.finish_cell(row, status="success")
        # Another GPU measured at one load only: no sweep.
        row = m.add_cell("run-s", "RTX_3090-vastai-qwen2:7b", gpu_type="RTX 3090", provider="vastai",
                         model="qwen2:7b", matrix_file="m.yaml")
        m.add_benchmark(row, _result("vastai", 3000, 1))
        m.finish_cell(row, status="success")
    return path


def test_a_percentile_table_per_cell(sweep_manifest):
    with Manifest(sweep_manifest) as m:
        report = build_report(SqliteStore(m))
    c4 = next(r for r in report.results if r.provider == "vastai" and r.load == "c4")
    table = percentile_table(c4)
    assert table.header == ("Latency", "p50 ms", "p95 ms", "p99 ms")
    assert [[str(v) for v in row] for row in table.rows] == [
        ["TTFT", "160", "240", "360"], ["TPOT", "5.0", "6.5", "8.2"], ["ITL", "4.9", "7.0", "12"],
        ["e2e latency", "1600", "1920", "2400"]]
    bare = next(r for r in report.results if r.gpu == "RTX 3090")  # no details: the Go fields, or "-"
    assert [[str(v) for v in row] for row in percentile_table(bare).rows][0] == ["TTFT", "40", "-", "-"]
    markdown = render_markdown(report)
    assert "## Latency percentiles" in markdown and "#### RTX 4090 on vastai at c4" in markdown
    assert "| TTFT | 160 | 240 | 360 |" in markdown
    assert render_html(report).count('data-table="percentiles ') == len(report.results) == 6


def test_sweeps_are_one_line_per_provider_through_its_loads(sweep_manifest):
    with Manifest(sweep_manifest) as m:
        report = build_report(SqliteStore(m))
    [sweep] = sweeps(report)  # the RTX 3090 ran at one load: no sweep
    assert sweep.name == "RTX 4090 / qwen2:7b"
    assert {series: [(r.load, r.output_tokens_per_second) for r in rows] for series, rows in sweep.lines.items()} == {
        "tensordock": [("c1", 45.0), ("c8", 190.0)], "vastai": [("c1", 50.0), ("c4", 160.0), ("c8", 220.0)]}
    html = render_html(report)
    chart = html[html.index('<svg class="chart line-chart" data-chart="latency against throughput'):]
    chart = chart[:chart.index("</svg>")]
    assert 'data-chart="latency against throughput RTX 4090 / qwen2:7b"' in chart
    assert chart.count("<polyline") == 2 and chart.count('class="point"') == 5
    assert f'stroke="{PROVIDER_COLORS["vastai"]}"' in chart and f'stroke="{PROVIDER_COLORS["tensordock"]}"' in chart
    assert ">c4</text>" in chart  # each point labelled with its load
    markdown = render_markdown(report)
    assert "## Load sweeps" in markdown and "| vastai | c8 | 220.0 | 50.0 | 320 | 2300 | 3450 |" in markdown


def test_a_provider_keeps_its_colour_whatever_else_is_in_the_report():
    assert provider_color("vastai") == provider_color("Vast.ai") == PROVIDER_COLORS["vastai"]
    alone = bar_chart([Bar("RTX 4090 / vastai", 10.0, "10", "t", color=provider_color("vastai"))], name="a", unit="u")
    assert f'fill="{PROVIDER_COLORS["vastai"]}"' in alone
    # An unknown provider's colour comes from a stable hash of its name: the same in another process
    # (str hashes are salted per process; this one must not be).
    code = "from pytest_gpubench.report.charts import provider_color; print(provider_color('acme-gpu'))"
    colours = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
    assert colours == {provider_color("acme-gpu")}
    assert provider_color("acme-gpu") not in PROVIDER_COLORS.values()


def test_scatter_points_carry_their_labels_escaped():
    svg = scatter_chart([Point(100, 0.5, "vastai", "t", label="RTX 4090 / vastai / qwen2:7b"),
                         Point(120, 0.45, "acme", "t", label="<b>x</b> / acme / m")],
                        name="s", x_label="x", y_label="y",
                        colors={"vastai": provider_color("vastai"), "acme": provider_color("acme")})
    assert svg.count('class="point-label"') == 2
    assert ">RTX 4090 / vastai / qwen2:7b</text>" in svg and "&lt;b&gt;x&lt;/b&gt; / acme / m" in svg


# ----------------------------------------------------------------- Chromium




#: For every chart: boxes of its axis titles, tick labels and point labels, as the browser laid them out.
_LAYOUT_JS = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return [...document.querySelectorAll('svg.chart')].map(svg => ({
    name: svg.dataset.chart,
    titles: [...svg.querySelectorAll('.axis-label')].map(box),
    ticks: [...svg.querySelectorAll('.tick')].map(box),
    labels: [...svg.querySelectorAll('.point-label')].map(box),
    svg: box(svg)}));
})()"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.timeout(120)
def test_axis_titles_and_point_labels_are_clear_of_each_other_in_chromium(tmp_path, sweep_manifest, chromium):
    with Manifest(sweep_manifest) as m:
        # A second sweep at 60% of the first's throughput and a cheaper price crowds the middle of the
        # scatter: labels that only went beside their points overlapped there.
        for (provider, concurrency), (tokens, e2e) in SWEEP.items():
            row = m.add_cell("run-s", f"RTX_3080-{provider}-qwen2:7b-c{concurrency}", gpu_type="RTX 3080",
                             provider=provider, model="qwen2:7b", matrix_file="m.yaml")
            result = _result(provider, int(tokens * 0.6), concurrency)
            bench = m.add_benchmark(row, result.model_copy(update={"price_per_hour": 0.25 + 0.01 * concurrency}))
            m.set_details(bench, {"load": {"concurrency": concurrency, "rate": None},
                                  "metrics": {"e2e_p50_ms": e2e / 0.6, "ttft_p50_ms": 40.0 * concurrency}})
            m.finish_cell(row, status="success")
        _, html = write_reports(build_report(SqliteStore(m)), tmp_path / "site")

    async def scenario() -> list[dict]:
        async with DevTools(chromium.websocket_url()) as tools:
            page = await tools.new_page()
            await page.send("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
            await page.navigate(html.as_uri())
            charts = await page.evaluate(_LAYOUT_JS)
            assert page.errors() == []
            return charts

    charts = asyncio.run(scenario())
    kinds = {chart["name"].split(" ")[0] for chart in charts}
    assert {"tokens/s", "cost", "latency"} <= kinds  # bar, scatter and line charts all checked
    for chart in charts:
        assert chart["titles"] and chart["ticks"], chart["name"]
        for title in chart["titles"]:
            clashes = [tick for tick in chart["ticks"] if _overlap(title, tick)]
            assert clashes == [], (chart["name"], title, clashes)
            assert chart["svg"][0] <= title[0] and title[2] <= chart["svg"][2], (chart["name"], title)
        labels = chart["labels"]
        assert all(not _overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]), chart["name"]
    scatter = next(chart for chart in charts if chart["name"] == "cost against tokens/s qwen2:7b")
    assert len(scatter["labels"]) == 11  # every priced result labelled
