"""The frontier across cells (issue 23 item 2): for each model and workload, throughput per GPU and billed
$/M output tokens against interactivity per GPU x provider x runtime, the non-dominated points joined, the
cost at target interactivities read off the curves (linear between frontier points, never extrapolated),
the exports of every point, the PNGs, and rankings that compare one model only."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest
from chromium import DevTools

from pytest_gpubench.errors import UsageProblem
from pytest_gpubench.measure.frontier import FrontierPoint
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults, TestConfig
from pytest_gpubench.options import parse_targets
from pytest_gpubench.report import frontier_view
from pytest_gpubench.report.frontier import Curve, answer, non_dominated, stored_points, value_at
from pytest_gpubench.report.frontier_view import (
    POINT_COLUMNS,
    point_rows,
    target_lines,
    target_table,
    write_pngs,
    write_points,
)
from pytest_gpubench.report.gather import build_report, write_reports
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.settings import resolve
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

PRICE = {"RTX 4090": 0.40, "RTX 3090": 0.20, "A100": 1.20}


def _point(concurrency: int, interactivity: float, throughput: float, price: float = 0.4) -> FrontierPoint:
    return FrontierPoint(concurrency=concurrency, tpot_interactivity=interactivity, tpot_p50_ms=1000 / interactivity,
                         output_tokens_per_second=throughput, output_tokens_per_second_per_gpu=throughput,
                         price_per_hour=price, cost_per_million_tokens=price / (throughput * 3600) * 1e6)


# ------------------------------------------------------------------ the math


def test_non_dominated_keeps_only_points_no_other_beats_on_both_axes() -> None:
    points = [_point(1, 100, 90), _point(2, 80, 160), _point(4, 60, 150),  # c4: c2 is more interactive AND faster
              _point(8, 40, 300), _point(16, 20, 290), _point(32, 10, 310), _point(64, 10, 305)]
    kept = non_dominated(points)
    assert [p.concurrency for p in kept] == [32, 8, 2, 1]
    # The curve is monotone: interactivity rises, throughput falls, from one kept point to the next.
    xs, ys = [p.tpot_interactivity for p in kept], [p.output_tokens_per_second_per_gpu for p in kept]
    assert xs == sorted(xs) and len(set(xs)) == len(xs) and ys == sorted(ys, reverse=True)
    # The cost frontier (cheaper is better) keeps the same points at one price.
    assert [p.concurrency for p in non_dominated(points, lambda p: p.cost_per_million_tokens,
                                                 lower_is_better=True)] == [32, 8, 2, 1]
    # A point without interactivity takes no part.
    assert non_dominated([FrontierPoint(output_tokens_per_second_per_gpu=500.0), _point(1, 50, 10)]) == \
        [_point(1, 50, 10)]


def test_value_at_interpolates_between_adjacent_points_and_never_extrapolates() -> None:
    curve = [(10.0, 300.0), (40.0, 200.0), (100.0, 90.0)]
    assert value_at(curve, 25.0) == pytest.approx(250.0)
    assert value_at(curve, 70.0) == pytest.approx(145.0)
    assert value_at(curve, 40.0) == pytest.approx(200.0)
    assert value_at(curve, 100.0) == pytest.approx(90.0)
    assert value_at(curve, 5.0) == 300.0  # a measured point beyond the target meets it
    assert value_at(curve, 100.01) is None  # beyond the most interactive point: not reached
    assert value_at([], 1.0) is None


def _curve(label: str, price: float, points: list[tuple[int, float, float]]) -> Curve:
    gpu, provider = label.split(" / ")
    return Curve(gpu=gpu, provider=provider, runtime="ollama", label=label, price_per_hour=price,
                 points=[_point(c, x, y, price) for c, x, y in points])


def test_the_answer_at_a_target_names_the_cheapest_the_runner_up_and_the_margin() -> None:
    fast = _curve("A100 / runpod", 1.2, [(1, 120, 100), (8, 60, 700), (32, 20, 1500)])
    cheap = _curve("RTX 3090 / vastai", 0.2, [(1, 60, 50), (8, 24, 300)])
    result = answer([fast, cheap], 20.0, "--target-interactivity")
    assert [s.label for s in result.ranked] == ["RTX 3090 / vastai", "A100 / runpod"]
    cost_3090 = 0.2 / (300 * 3600) * 1e6  # 20 is below its least interactive point (24): that point
    cost_a100 = 1.2 / (1500 * 3600) * 1e6
    assert result.cheapest.cost_per_million_tokens == pytest.approx(cost_3090)
    assert result.margin == pytest.approx(cost_a100 - cost_3090)
    assert result.margin_share == pytest.approx((cost_a100 - cost_3090) / cost_3090)
    # At 40 the 3090 is read between its c8 (24) and c1 (60) points, linearly in cost.
    at40 = answer([fast, cheap], 40.0, "x")
    low, high = 0.2 / (300 * 3600) * 1e6, 0.2 / (50 * 3600) * 1e6
    expected = low + (high - low) * (40 - 24) / (60 - 24)
    standing = next(s for s in at40.ranked if s.label == "RTX 3090 / vastai")
    assert standing.cost_per_million_tokens == pytest.approx(expected)
    assert standing.output_tokens_per_second_per_gpu == pytest.approx(300 + (50 - 300) * (40 - 24) / (60 - 24))
    # At 100 only the A100 reaches: no runner-up; the 3090 is listed with its best.
    at100 = answer([fast, cheap], 100.0, "x")
    assert [s.label for s in at100.ranked] == ["A100 / runpod"] and at100.runner_up is None
    assert at100.not_reached == [("RTX 3090 / vastai", 60.0)]
    # Beyond every curve: not reached, with the best interactivity any curve got.
    at500 = answer([fast, cheap], 500.0, "x")
    assert at500.cheapest is None and at500.best_reached == 120.0


@pytest.mark.parametrize("text", ["fast", "0", "-5", "20,,50", "nan", "1e9", ""])
def test_bad_target_interactivity_names_the_option_and_what_is_allowed(text: str) -> None:
    with pytest.raises(UsageProblem) as caught:
        resolve({"target_interactivity": text or " "}, {}, lambda key: None)
    message = str(caught.value)
    assert message.startswith("--gpubench-target-interactivity: ")
    assert "comma-separated list of interactivities in tokens/s per user" in message and "such as 20,50" in message
    with pytest.raises(UsageProblem, match="^ini option gpubench_target_interactivity: 'x' must be"):
        resolve({}, {}, {"gpubench_target_interactivity": "x"}.get)


def test_targets_parse_sorted_once_each() -> None:
    assert parse_targets("50, 20,20") == (20.0, 50.0)
    assert resolve({}, {"GPUBENCH_TARGET_INTERACTIVITY": "30"}, lambda key: None).target_interactivity == (30.0,)


# ------------------------------------------------------------- stored results


def _sweep_points(gpu: str, scale: float) -> list[dict]:
    """A concurrency sweep: per-user speed falls as throughput grows, then saturates (c8 is dominated by c4)."""
    price = PRICE[gpu]
    rows = [(1, 100.0, 95.0), (2, 90.0, 170.0), (4, 70.0, 270.0), (8, 60.0, 260.0), (16, 35.0, 520.0)]
    return [_point(c, x * scale, y * scale, price).model_dump(mode="json") for c, x, y in rows]


def _metrics(tpot_ms: float, output: float) -> dict:
    return {"requests": 40, "duration_seconds": 10.0, "tpot_p50_ms": tpot_ms, "ttft_p50_ms": 40.0,
            "output_throughput_tps": output, "e2e_p50_ms": 900.0}


def _add(m: Manifest, run: str, gpu: str, model: str, details: dict, *, provider: str = "vastai",
         tokens: int = 1000, name: str = "") -> None:
    row = m.add_cell(run, f"{gpu.replace(' ', '_')}-{provider}-{model}{name}", gpu_type=gpu, provider=provider,
                     model=model, matrix_file="m.yaml")
    result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=1), provider=provider, price_per_hour=PRICE[gpu],
                             results=PerformanceResults(total_requests=40, total_tokens=tokens, duration_seconds=10.0,
                                                        avg_tokens_per_second=50.0))
    bench = m.add_benchmark(row, result)
    m.set_details(bench, details)
    m.update_cell(row, stage_seconds={"provision": 60.0, "ssh_wait": 6.0, "runtime_setup": 24.0,
                                      "model_pull": 30.0, "benchmark": 300.0})
    m.finish_cell(row, status="success")


def _fingerprint(max_tokens: int = 256) -> dict:
    return {"hash": "x", "fields": {"prompts": "3f2a9c1e00aa00bb", "max_tokens": max_tokens, "think": None}}


@pytest.fixture
def manifest(tmp_path) -> Path:
    path = tmp_path / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-f", ["pytest"], [])
        for gpu, scale in (("RTX 4090", 1.0), ("A100", 2.0)):
            _add(m, "run-f", gpu, "qwen2:7b", {"load": {"concurrency": 1, "rate": None}, "fingerprint": _fingerprint(),
                                               "frontier": {"points": _sweep_points(gpu, scale),
                                                            "stop_reason": "saturated", "primary":
                                                            "tpot_interactivity"},
                                               "metrics": {**_metrics(10.0, 95.0), "slo": {"tpot_ms": 25.0}}})
        # An older result without details["frontier"]: one point from its metrics (tpot 20 ms -> 50 tok/s/user).
        _add(m, "run-f", "RTX 3090", "qwen2:7b", {"load": {"concurrency": 4, "rate": None},
                                                  "fingerprint": _fingerprint(), "metrics": _metrics(20.0, 150.0)})
        # Another model, and the same model on another workload: never on the same chart or in the same ranking.
        _add(m, "run-f", "RTX 4090", "qwen2:1.5b", {"load": {"concurrency": 1, "rate": None},
                                                    "metrics": _metrics(5.0, 400.0)}, tokens=4000)
        _add(m, "run-f", "RTX 4090", "qwen2:7b", {"load": {"concurrency": 1, "rate": None},
                                                  "fingerprint": _fingerprint(1024), "metrics": _metrics(12.0, 80.0)},
             provider="tensordock", name="-long")
    return path


def test_a_result_without_a_stored_frontier_is_one_point_from_its_metrics() -> None:
    points, source, _ = stored_points({"load": {"concurrency": 4}, "metrics": _metrics(20.0, 150.0)},
                                      price_per_hour=0.2, gpus=2)
    (point,) = points
    assert source == "metrics" and point.tpot_interactivity == pytest.approx(50.0)
    assert point.output_tokens_per_second_per_gpu == pytest.approx(75.0) and point.ntpot_interactivity is None
    assert point.per_user_throughput == pytest.approx(150.0 / 4)
    assert point.cost_per_million_tokens == pytest.approx(0.2 / (150 * 3600) * 1e6)
    # A malformed stored point is data: left out, never an error.
    points, source, reason = stored_points({"frontier": {"points": [{"concurrency": "many"},
                                                                    _point(1, 40, 80).model_dump(mode="json")],
                                                         "stop_reason": "cap"}}, price_per_hour=0.4, gpus=1)
    assert len(points) == 1 and source == "frontier" and reason == "cap"
    assert stored_points({}, price_per_hour=None, gpus=1) == ([], "", "")


def test_groups_are_one_model_and_workload_each(manifest: Path) -> None:
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m))
    names = [(g.model, g.workload_label, [c.label for c in g.curves]) for g in report.frontiers]
    assert names == [
        ("qwen2:1.5b", "", ["RTX 4090 / vastai"]),
        ("qwen2:7b", "max_tokens 1024, prompts 3f2a9c1e", ["RTX 4090 / tensordock"]),
        ("qwen2:7b", "max_tokens 256, prompts 3f2a9c1e", ["A100 / vastai", "RTX 3090 / vastai", "RTX 4090 / vastai"]),
    ]
    group = report.frontiers[2]
    a100 = group.curves[0]
    assert len(a100.points) == 5 and [p.concurrency for p in a100.throughput_frontier] == [16, 4, 2, 1]
    assert a100.setup_seconds == 120.0 and a100.setup_cost == pytest.approx(120 / 3600 * 1.2)
    assert group.curves[1].source == "metrics"
    # No target given: the stored SLO's (tpot_ms 25 -> 40 tokens/s per user).
    assert [(a.target, a.source) for a in group.answers] == [(40.0, "slo tpot_ms 25")]


def test_cost_at_target_table_and_headlines(manifest: Path) -> None:
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m), targets=(50.0, 150.0))
    group = report.frontiers[2]
    table = target_table(group)
    first, second = ([str(v) for v in row] for row in table.rows)
    # At 50 the 4090 reads between its c16 (35) and c4 (70) points of its cost frontier: $0.30; the A100
    # (twice as fast on every axis, 3x the price) meets it at its c16 point (70): $0.32; the 3090 (one point
    # at 50 tok/s/user, $0.20/h at 150 tok/s): $0.37.
    cost_4090_at_50 = value_at([(35.0, 0.4 / (520 * 3600) * 1e6), (70.0, 0.4 / (270 * 3600) * 1e6)], 50.0)
    cost_a100_at_50 = 1.2 / (1040 * 3600) * 1e6
    assert first[:4] == [">= 50", "--target-interactivity", "RTX 4090 / vastai", "$0.30"]
    ranked = group.answers[0].ranked
    assert [s.label for s in ranked] == ["RTX 4090 / vastai", "A100 / vastai", "RTX 3090 / vastai"]
    assert ranked[0].cost_per_million_tokens == pytest.approx(cost_4090_at_50)
    assert ranked[1].cost_per_million_tokens == pytest.approx(cost_a100_at_50)
    assert group.answers[0].margin == pytest.approx(cost_a100_at_50 - cost_4090_at_50)
    assert first[5:] == ["A100 / vastai ($0.32)", "+$0.0220 (+7%)"]
    # At 150 only the A100 reaches (200 at c1): no runner-up.
    assert second[2] == "A100 / vastai" and second[5] == "-"
    lines = dict(target_lines(group))
    lead = "qwen2:7b (max_tokens 256, prompts 3f2a9c1e) at >= 50 tokens/s per user"
    assert lines[lead] == ("cheapest RTX 4090 / vastai at $0.30/M output tokens; runner-up A100 / vastai at $0.32 "
                           "(+$0.0220 (+7%))")
    # Beyond every curve (the A100 reaches 200): not reached, with the best.
    with Manifest(manifest) as m:
        far = build_report(SqliteStore(m), targets=(500.0,))
    assert [str(v) for v in target_table(far.frontiers[2]).rows[0]][2] == "not reached: best 200 tok/s/user"
    markdown = render_markdown(report)
    assert "## Frontiers" in markdown and "RTX 3090 / vastai: setup 2.0 min" in markdown
    assert f"- **{lead}**: cheapest RTX 4090 / vastai" in markdown.replace("\\", "").replace("&gt;", ">")


def test_rankings_compare_one_model_at_a_time(manifest: Path) -> None:
    with Manifest(manifest) as m:
        markdown = render_markdown(build_report(SqliteStore(m)))
    tokens = markdown.split("## Tokens/s leaderboard\n")[1].split("\n## ")[0]
    assert "### qwen2:1.5b" in tokens and "### qwen2:7b" in tokens
    small = tokens.split("### qwen2:1.5b")[1].split("###")[0]
    assert small.count("| 1 |") == 1 and "| 2 |" not in small  # the 1.5b model ranks alone


def test_html_draws_both_frontier_charts_with_labelled_axes(manifest: Path) -> None:
    with Manifest(manifest) as m:
        html = render_html(build_report(SqliteStore(m), targets=(50.0,)))
    assert "<h2>Frontiers</h2>" in html
    for kind in ("throughput", "cost"):
        name = f'data-chart="frontier {kind} qwen2:7b (max_tokens 256, prompts 3f2a9c1e)"'
        assert name in html
        chart = html.split(name)[1].split("</svg>")[0]
        assert "interactivity (tokens/s per user, 1000 / TPOT p50)</text>" in chart
        assert ("output tokens/s per GPU" if kind == "throughput" else "billed $ per million output tokens") in chart
        assert chart.count('class="line"') == 3  # one joined curve per GPU / provider
    throughput = html.split('data-chart="frontier throughput qwen2:7b (max_tokens 256')[1].split("</svg>")[0]
    assert throughput.count('class="point dominated"') == 2  # the c8 points of the two sweeps
    # Every ranking chart is one model's.
    assert 'data-chart="cost against tokens/s qwen2:1.5b"' in html and 'data-chart="cost against tokens/s"' not in html
    assert 'data-table="targets qwen2:7b (max_tokens 256, prompts 3f2a9c1e)"' in html


def test_points_export_every_point(manifest: Path) -> None:
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m))
    rows = point_rows(report)
    assert len(rows) == 5 + 5 + 1 + 1 + 1
    assert sum(row["on_frontier"] for row in rows) == 4 + 4 + 3
    out = io.StringIO()
    assert write_points(report, "csv", out) == len(rows)
    parsed = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(parsed[0]) == POINT_COLUMNS and parsed[0]["model"] == "qwen2:1.5b"
    out = io.StringIO()
    write_points(report, "json", out)
    assert json.loads(out.getvalue())[0]["tpot_interactivity"] == pytest.approx(200.0)


def test_pngs_are_written_beside_the_report_only(manifest: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'pytest-gpubench[charts]'")
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m))
    report = report.model_copy(update={"frontiers": report.frontiers[1:]})  # two groups: enough, and quicker
    site = tmp_path / "site"
    site.mkdir()
    before = set(tmp_path.rglob("*"))
    written = write_pngs(report, site)
    assert written is not None and [p.name for p in written] == [
        "frontier-01-qwen2-7b-throughput.png", "frontier-01-qwen2-7b-cost.png",
        "frontier-02-qwen2-7b-throughput.png", "frontier-02-qwen2-7b-cost.png"]
    assert {p.parent for p in written} == {site}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in written)
    assert set(tmp_path.rglob("*")) - before == set(written)


# ----------------------------------------------------------------- Chromium




@pytest.mark.timeout(120)
def test_the_page_has_no_horizontal_scroll_at_1300_px(tmp_path, manifest, chromium):
    with Manifest(manifest) as m:
        # A failure whose message is one long word, and a wide table (every column of a hardware row), must not
        # widen the page: they wrap, or scroll inside their own box.
        row = m.add_cell("run-f", "H100-vastai-qwen2:7b", gpu_type="H100", provider="vastai", model="qwen2:7b",
                         matrix_file="m.yaml")
        m.finish_cell(row, status="failed", failure_stage="model_pull", error_message="x" * 400)
        _, html = write_reports(build_report(SqliteStore(m), targets=(50.0,)), tmp_path / "site")

    async def scenario() -> dict:
        async with DevTools(chromium.websocket_url()) as tools:
            page = await tools.new_page()
            await page.send("Emulation.setDeviceMetricsOverride",
                            {"width": 1300, "height": 900, "deviceScaleFactor": 1, "mobile": False})
            await page.navigate(html.as_uri())
            found = await page.evaluate("""(() => ({
              scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth,
              frontiers: [...document.querySelectorAll('svg.chart[data-chart^="frontier "]')].map(svg => ({
                width: svg.getBoundingClientRect().width,
                titles: [...svg.querySelectorAll('.axis-label')].map(t => t.textContent)}))}))()""")
            assert page.errors() == []
            return found

    found = asyncio.run(scenario())
    assert found["scroll"] <= found["client"], found
    assert len(found["frontiers"]) == 6
    for chart in found["frontiers"]:
        assert chart["width"] > 400  # drawn, readable
        assert "interactivity (tokens/s per user, 1000 / TPOT p50)" in chart["titles"]


# ------------------------------------------------------------------ commands


def test_report_command_takes_the_targets_and_writes_the_pngs(manifest, tmp_path, capsys, monkeypatch) -> None:
    from pytest_gpubench.commands.cli import main

    monkeypatch.chdir(tmp_path)  # no ini file of this project's
    site = tmp_path / "site"
    drawn = []  # the drawing itself is test_pngs_are_written_beside_the_report_only's (matplotlib is slow to load)
    monkeypatch.setattr(frontier_view, "write_pngs", lambda report, where: drawn.append(where) or [where / "a.png"])
    assert main(["report", "--store", str(manifest), "--reports", str(site), "--target-interactivity", "50"]) == 0
    out = capsys.readouterr().out
    assert "cheapest RTX 4090 / vastai" in (site / "BENCHMARK_REPORT.md").read_text()
    assert drawn == [site] and f"wrote 1 frontier PNG in {site}" in out
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    # Without matplotlib: the report is written all the same, and says how to get the PNGs.
    modules = __import__("sys").modules
    for name in [name for name in modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.setitem(modules, name, None)  # as if it were not installed, whatever loaded it before
    monkeypatch.setitem(modules, "matplotlib", None)
    bare = tmp_path / "bare"
    assert main(["report", "--store", str(manifest), "--reports", str(bare)]) == 0
    out = capsys.readouterr().out
    assert "matplotlib is not installed; pip install 'pytest-gpubench[charts]'" in out
    assert sorted(p.name for p in bare.iterdir()) == ["BENCHMARK_REPORT.md", "index.html"]
    # A bad target: one line naming the option and what is allowed, exit 2.
    assert main(["report", "--store", str(manifest), "--reports", str(bare), "--target-interactivity", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target-interactivity: '0' must be a comma-separated list" in err[0]


def test_export_points_command(manifest, tmp_path, capsys) -> None:
    from pytest_gpubench.commands.cli import main

    target = tmp_path / "points.csv"
    assert main(["export", "--points", "--format", "csv", "--store", str(manifest), "-o", str(target)]) == 0
    assert "exported 13 frontier points of all runs" in capsys.readouterr().err
    rows = list(csv.DictReader(target.open()))
    assert len(rows) == 13 and {row["source"] for row in rows} == {"frontier", "metrics"}


def test_without_a_target_or_an_slo_the_table_answers_at_the_default_targets(manifest: Path) -> None:
    with Manifest(manifest) as m:
        report = build_report(SqliteStore(m))
    sources = {tuple((a.target, a.source) for a in group.answers) for group in report.frontiers}
    # A group whose results stored an SLO answers at it; one without, at the defaults.
    assert ((40.0, "slo tpot_ms 25"),) in sources
    assert ((20.0, "default"), (50.0, "default")) in sources
    assert "| >= 20 | default |" in render_markdown(report).replace("\\", "").replace("&gt;", ">")
