"""A ``concurrency: sweep`` cell end to end on the sandbox: the Ollama stand-in batches requests, so
each doubling of the concurrency adds less output throughput until the sweep calls the runtime
saturated. Every step runs on one session and one model load, is stored as a frontier point with
its three interactivities, and the server ran at the batch limit the matrix implies (the top level)."""

from __future__ import annotations

import json

import pytest
import sqlite_utils
from e2e_helpers import assert_every_session_released, run_pytest, sandbox_sessions

MIN_GROWTH = 0.25
TOP = 16
MATRIX = f"""
name: frontier
workload: {{duration: 3s, max_tokens: 24, concurrency: sweep, telemetry_interval: 1s,
           sweep: {{max_concurrency: {TOP}, min_growth: {MIN_GROWTH:.0%}, duration: 2s}}}}
matrix:
  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}}
"""


@pytest.mark.slow
def test_a_concurrency_sweep_doubles_on_one_session_until_the_runtime_saturates(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_frontier.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    assert row["cell_id"] == "RTX_4090-vastai-qwen2:7b-csweep" and row["status"] == "success"
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
    assert len(sandbox_sessions(url)) == 1
    text = "".join(path.read_text() for path in (tmp_path / "reports" / "progress").rglob("*.log"))
    assert text.count("STATUS: MODEL_READY") == 1 and "RUNTIME_RESTART" not in text
    assert text.count("PROGRESS: stage=sweep") == len(points)
    assert "PROGRESS: stage=sweep kind=concurrency concurrency=1 output_tokens_per_second=" in text
    assert "tpot_interactivity=" in text
    assert f"STATUS: SWEEP_COMPLETE kind=concurrency stop=saturated steps={len(points)}" in text
    assert_every_session_released(url)
