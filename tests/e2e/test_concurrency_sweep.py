"""A ``concurrency: sweep`` cell end to end on the sandbox (and, on the vLLM cell, accuracy beside
speed): the Ollama stand-in batches requests, so
each doubling of the concurrency adds less output throughput until the sweep calls the runtime
saturated. Every step runs on one session and one model load, is stored as a frontier point with
its three interactivities, and the server ran at the batch limit the matrix implies (the top level).

The points match the sandbox's batching law (sandbox/law.py, docs/sandbox.md) within 3%, for
Ollama and for vLLM (a list of levels); `gpubench report` draws both curves and answers the cost at
the default targets, and headless Chromium's screenshot of the Frontiers section shows the charts,
labelled (the issue 23 demo, small)."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlite_utils
from chromium import DevTools
from e2e_helpers import assert_every_session_released, run_pytest, sandbox_sessions

from pytest_gpubench.matrix.accuracy import builtin_problems
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.law import expected_point
from pytest_gpubench.sandbox.ollama_common import answers_right

MIN_GROWTH = 0.25
TOP = 16
PROBLEMS = 10  # the vLLM cell's accuracy pass (issue 23 item 5), after its last step
#: Prompts whose stand-in answers run into the 24-token cap (sandbox/ollama_common.py plan_output:
#: an answer is 60-100% of the cap, decided by the prompt), so every request makes exactly 24 tokens
#: and the law's throughput is one number.
PROMPTS = json.dumps([f"Describe step {step} of brewing coffee in detail." for step in (1, 6, 9)])
MATRIX = f"""
name: frontier
workload: {{duration: 3s, max_tokens: 24, concurrency: sweep, telemetry_interval: 1s, prompts: {PROMPTS},
           sweep: {{max_concurrency: {TOP}, min_growth: {MIN_GROWTH:.0%}, duration: 3s}}}}
matrix:
  - {{gpu: RTX 5060 Ti, provider: vastai, model: 'qwen2:7b'}}
  - {{gpu: RTX 5060 Ti, provider: vastai, model: 'qwen2:7b', runtime: vllm,
     workload: {{sweep: {{concurrency: [1, 4, 16]}}, accuracy: {{builtin: {PROBLEMS}}}}}}}
"""
MAX_TOKENS = 24
#: A step's throughput is held to the law when it lasted this many request cycles: with fewer, where
#: the window's end falls in a cycle (prefill or decode) moves the count by a visible share.
CYCLES = 6



@pytest.mark.slow
def test_a_concurrency_sweep_doubles_on_one_session_until_the_runtime_saturates(tmp_path, standalone_sandbox,
                                                                               chromium):
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_frontier.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    row, vllm = sorted(db["benchmark_manifest"].rows, key=lambda r: r["cell_id"])
    assert row["cell_id"] == "RTX_5060_Ti-vastai-qwen2:7b-csweep" and row["status"] == "success"
    assert vllm["cell_id"] == "RTX_5060_Ti-vastai-qwen2:7b-csweep-runtime_vllm" and vllm["status"] == "success"
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    frontier = json.loads(benchmark["details_json"])["frontier"]
    points = frontier["points"]
    assert frontier["primary"] == "tpot_interactivity"

    # The levels double from 1, and the stopping rule holds on the stored figures: every doubling
    # but the last raised output throughput by MIN_GROWTH or more, the last by less.
    levels = [point["concurrency"] for point in points]
    assert levels == [2 ** i for i in range(len(levels))] and 2 <= len(levels) and levels[-1] <= TOP
    throughput = [point["output_tokens_per_second"] for point in points]
    assert all(after >= before * (1 + MIN_GROWTH) for before, after in zip(throughput[:-2], throughput[1:-1]))
    assert frontier["stop_reason"] == "saturated", frontier
    assert throughput[-1] < throughput[-2] * (1 + MIN_GROWTH)
    assert frontier["saturated_at"] == levels[-2]

    for point in points:
        assert point["requests"] > 0 and point["rate"] is None
        # The server was started for the sweep's top level (runtime.batch_limit's default).
        assert point["batch_limit"] == TOP
        # All three interactivities, each by its definition (docs/metrics.md, "Frontiers").
        assert point["tpot_interactivity"] == pytest.approx(1000 / point["tpot_p50_ms"])
        assert point["per_user_throughput"] == pytest.approx(point["output_tokens_per_second"] / point["concurrency"])
        assert point["ntpot_interactivity"] > 0
        assert point["cost_per_million_tokens"] > 0 and point["price_per_hour"] == benchmark["price_per_hour"]
    # Batching: each stream gets slower as more share the GPU.
    assert points[-1]["tpot_interactivity"] < points[0]["tpot_interactivity"]

    # The headline is the step with the highest output throughput (no SLO: every step counts).
    best = max(points, key=lambda point: point["output_tokens_per_second"])
    assert benchmark["output_tokens_per_second"] == pytest.approx(best["output_tokens_per_second"], rel=1e-3)
    # Every step's requests are kept, on one session with one model load.
    stored = db.execute("select count(*) from requests where benchmark_id = ? and warmup = 0",
                        [row["benchmark_id"]]).fetchone()[0]
    assert stored == sum(point["requests"] for point in points)
    assert len(sandbox_sessions(url)) == 2  # one per cell: a vLLM cell does not reuse Ollama's session
    text = "".join(path.read_text() for path in (tmp_path / "reports" / "progress").rglob("*.log"))
    assert text.count("STATUS: MODEL_READY") == 2 and "RUNTIME_RESTART" not in text
    assert text.count("PROGRESS: stage=sweep") == len(points) + 3
    assert "PROGRESS: stage=sweep kind=concurrency concurrency=1 output_tokens_per_second=" in text
    assert "tpot_interactivity=" in text
    assert f"STATUS: SWEEP_COMPLETE kind=concurrency stop=saturated steps={len(points)}" in text
    assert_every_session_released(url)

    # The vLLM cell ran exactly its three levels, whatever the figures.
    vllm_points = _frontier(db, vllm)["points"]
    assert [point["concurrency"] for point in vllm_points] == [1, 4, 16]
    assert _frontier(db, vllm)["stop_reason"] == "every level ran"
    for cell, runtime, kept in ((row, "ollama", points), (vllm, "vllm", vllm_points)):
        _matches_the_law(db, cell, runtime, kept)
    _accuracy_is_the_models_known_share_and_no_measured_request(db, vllm, vllm_points)
    _report_draws_the_frontiers(tmp_path, chromium)


def _accuracy_is_the_models_known_share_and_no_measured_request(db: sqlite_utils.Database, cell: dict,
                                                                points: list[dict]) -> None:
    """The accuracy pass ran after the last step, scored exactly against the stand-in's known share of
    right answers (the catalog's qwen2:7b: 80%, which problems by its rule), and none of its requests
    is a measured one: the stored requests are the steps' own, none of them a problem."""
    benchmark = next(db.query("select details_json from benchmarks where id = ?", [cell["benchmark_id"]]))
    share = load_catalog().models["qwen2:7b"].accuracy
    right = sum(answers_right(p.text, "qwen2:7b", share) for p in builtin_problems(PROBLEMS))
    assert 0 < right < PROBLEMS  # some wrong: a scorer that counted every reply right would fail here
    assert json.loads(benchmark["details_json"])["accuracy"] == {
        "source": f"builtin ({PROBLEMS} problems)", "problems": PROBLEMS, "correct": right,
        "wrong": PROBLEMS - right, "unanswered": 0, "failed": 0, "accuracy": round(right / PROBLEMS, 6),
        "max_tokens": MAX_TOKENS, "concurrency": 4}
    stored = list(db.query("select matched from requests where benchmark_id = ? and warmup = 0",
                           [cell["benchmark_id"]]))
    assert len(stored) == sum(point["requests"] for point in points)
    assert all(r["matched"] is None for r in stored)


def _frontier(db: sqlite_utils.Database, cell: dict) -> dict:
    benchmark = next(db.query("select details_json from benchmarks where id = ?", [cell["benchmark_id"]]))
    return json.loads(benchmark["details_json"])["frontier"]


def _matches_the_law(db: sqlite_utils.Database, cell: dict, runtime: str, points: list[dict]) -> None:
    """Each point against sandbox/law.py: the interactivity (1000 / TPOT p50) within 3% at every load;
    the output throughput within 3% where the step held CYCLES request cycles or more."""
    records = list(db.query("select output_tokens, error, incomplete from requests where benchmark_id = ? "
                            "and warmup = 0 order by rowid", [cell["benchmark_id"]]))
    assert all(r["output_tokens"] == MAX_TOKENS for r in records if r["error"] is None and not r["incomplete"])
    checked = 0
    for point in points:
        law = expected_point("RTX 5060 Ti", "qwen2:7b", runtime, point["concurrency"], provider="vastai",
                             output_tokens=MAX_TOKENS, parallel=point["batch_limit"])
        # TPOT runs from the first token to the end of the request (vLLM's definition: the finish comes
        # with the end-of-sequence step), so n tokens span n steps over n - 1 gaps.
        per_user = law.per_stream_tps * (MAX_TOKENS - 1) / MAX_TOKENS
        assert point["tpot_interactivity"] == pytest.approx(per_user, rel=0.03), (point, law)
        cycle = law.ttft_ms / 1000 + MAX_TOKENS / law.per_stream_tps
        if point["duration_seconds"] >= CYCLES * cycle:
            assert point["output_tokens_per_second"] == pytest.approx(law.output_tps, rel=0.03), (point, law)
            checked += 1
    assert checked >= 1


def _report_draws_the_frontiers(tmp_path, chromium) -> None:
    """`gpubench report` on the run: both curves in each frontier chart, axes labelled, the cost at the
    default targets; Chromium's screenshot of the section is a real picture of it."""
    from pytest_gpubench.commands.cli import main

    site = tmp_path / "site"
    assert main(["report", "--store", str(tmp_path / "reports" / "manifest.db"), "--reports", str(site)]) == 0
    markdown = (site / "BENCHMARK_REPORT.md").read_text().replace("\\", "")
    assert "| &gt;= 20 | default | RTX 5060 Ti / vastai / vllm |" in markdown

    async def scenario() -> tuple[dict, bytes]:
        async with DevTools(chromium.websocket_url()) as tools:
            page = await tools.new_page()
            await page.send("Emulation.setDeviceMetricsOverride",
                            {"width": 1300, "height": 900, "deviceScaleFactor": 1, "mobile": False})
            await page.navigate((site / "index.html").as_uri())
            found = await page.evaluate(FRONTIER_CHARTS_JS)
            picture = await page.screenshot(FRONTIER_SECTION_JS)
            assert page.errors() == []
            return found, picture

    found, picture = asyncio.run(scenario())
    assert len(found["charts"]) == 2  # throughput and cost, one model and workload
    for chart in found["charts"]:
        assert chart["width"] > 400 and chart["height"] > 200
        assert "interactivity (tokens/s per user, 1000 / TPOT p50)" in chart["labels"]
        assert {"RTX 5060 Ti / vastai", "RTX 5060 Ti / vastai / vllm"} <= set(chart["legend"])
    assert found["targets"] >= 2  # the default targets' rows
    # A PNG of the section as drawn: as wide as the page, as tall as the charts.
    assert picture[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(picture[16:20], "big"), int.from_bytes(picture[20:24], "big")
    assert width >= 1200 and height > 2 * 200
    assert len(picture) > 20_000  # drawn, not blank
    (tmp_path / "frontier.png").write_bytes(picture)


#: The Frontiers section's charts as the reader sees them: size, axis labels and legend entries.
FRONTIER_CHARTS_JS = """(() => ({
  charts: [...document.querySelectorAll('svg.chart[data-chart^="frontier "]')].map(svg => {
    const box = svg.getBoundingClientRect();
    return {width: box.width, height: box.height,
            labels: [...svg.querySelectorAll('.axis-label')].map(t => t.textContent),
            legend: [...svg.querySelectorAll(".legend-item text")].map(t => t.textContent)}; }),
  targets: document.querySelectorAll('table[data-table^="targets "] tbody tr').length}))()"""

#: The region from the Frontiers heading to the next section's, in page coordinates.
FRONTIER_SECTION_JS = """(() => {
  const heads = [...document.querySelectorAll('h2')];
  const at = heads.findIndex(h => h.textContent === 'Frontiers');
  const top = heads[at].getBoundingClientRect().top + window.scrollY;
  const end = at + 1 < heads.length ? heads[at + 1].getBoundingClientRect().top + window.scrollY
                                   : document.documentElement.scrollHeight;
  return {x: 0, y: top, width: document.documentElement.clientWidth, height: end - top}; })()"""
