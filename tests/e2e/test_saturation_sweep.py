"""A ``rate: sweep`` cell end to end on the sandbox: the Ollama stand-in batches requests, so TPOT
(and with it goodput under a TPOT SLO) gets worse as the offered rate rises; the sweep must find a
rate between its lowest one and the throughput probe's, keep every step's requests, and the report
must show the answer and the steps."""

from __future__ import annotations

import json

import httpx
import pytest
import sqlite_utils
from e2e_helpers import SANDBOX_AUTH, PytestRun, assert_every_session_released, run_pytest, sandbox_sessions
from polling import wait_for

from pytest_gpubench.commands.cli import main

SWEEP_MATRIX = """
name: sweep
workload: {duration: 3s, max_tokens: 32, rate: sweep, telemetry_interval: 1s,
           sweep: {min_rate: 2, steps: 5, precision: 25%, duration: 3s, probe_concurrency: 16}}
slo: {tpot_ms: 15}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
"""


@pytest.mark.slow
def test_a_sweep_finds_the_highest_rate_meeting_the_slo_and_the_report_shows_it(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_sweep.yaml"
    matrix.write_text(SWEEP_MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    assert row["cell_id"].endswith("-sweep") and row["status"] == "success"
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    details = json.loads(benchmark["details_json"])
    sweep = details["sweep"]
    probe, *steps = sweep["steps"]
    assert probe["kind"] == "probe" and probe["concurrency"] == 16 and probe["request_throughput_rps"] > 1
    assert steps and all(step["kind"] == "rate" for step in steps)
    # The top rate is the probe's achieved rate: past saturation, goodput under the SLO collapses.
    assert steps[0]["rate"] == pytest.approx(probe["request_throughput_rps"], rel=1e-3)
    assert steps[0]["met"] is False and steps[0]["goodput_share"] < 0.95
    answer = sweep["max_rate_meeting_slo"]
    assert answer is not None and 2 <= answer < steps[0]["rate"]
    assert answer == max(step["rate"] for step in steps if step["met"])
    assert sweep["stop_reason"] in ("within precision", "out of steps") and len(steps) <= 5
    # The headline is the step at that rate: its output throughput and $/M tokens.
    at_answer = next(step for step in steps if step["rate"] == answer)
    assert benchmark["output_tokens_per_second"] == pytest.approx(at_answer["output_tokens_per_second"], rel=1e-3)
    assert sweep["cost_per_million_tokens"] == pytest.approx(benchmark["cost_per_million_tokens"], rel=1e-3)
    # Every step's requests are kept, not only the answer's.
    stored = db.execute("select count(*) from requests where benchmark_id = ? and warmup = 0",
                        [row["benchmark_id"]]).fetchone()[0]
    assert stored == sum(step["requests"] for step in sweep["steps"])
    progress = (tmp_path / "reports" / "progress").rglob("*.log")
    text = "".join(path.read_text() for path in progress)
    assert text.count("PROGRESS: stage=sweep") == len(sweep["steps"])
    # Each point has its energy, from the power readings taken while its requests were in flight: the
    # probe and the top rate always have some; a low-rate step may have none in its idle gaps (then
    # empty, never 0).
    assert probe["joules_per_output_token"] > 0 and steps[0]["joules_per_output_token"] > 0
    for step in sweep["steps"]:
        if step["joules_per_output_token"] is None:
            assert step["output_tokens_per_second_per_watt"] is None, step
            continue
        assert step["joules_per_output_token"] > 0, step
        assert step["output_tokens_per_second_per_watt"] == pytest.approx(1 / step["joules_per_output_token"])
    assert "STATUS: SWEEP_COMPLETE max_rate_meeting_slo=" in text
    # Each step is a frontier point (issue 23): the probe a closed-loop one, the rate steps open-loop ones.
    frontier = details["frontier"]
    assert frontier["stop_reason"] == sweep["stop_reason"] and frontier["primary"] == "tpot_interactivity"
    assert [(p["concurrency"], p["rate"]) for p in frontier["points"]] == \
        [(s["concurrency"], s["rate"]) for s in sweep["steps"]]
    assert all(p["batch_limit"] == 64 and p["tpot_interactivity"] for p in frontier["points"])
    assert all(p["per_user_throughput"] is None for p in frontier["points"][1:])  # no concurrency to divide by

    assert main(["report", "--store", str(tmp_path / "reports" / "manifest.db"),
                 "--reports", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "BENCHMARK_REPORT.md").read_text()
    assert "## Saturation" in report and f"| RTX 4090 / vastai | qwen2:7b | {answer:g} |" in report
    assert "### RTX 4090 / vastai / qwen2:7b: sweep steps" in report
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<h2>Saturation</h2>" in html and 'data-chart="sweep steps RTX 4090 / vastai / qwen2:7b"' in html
    assert_every_session_released(url)


@pytest.mark.slow
def test_a_sweep_cut_short_keeps_the_steps_it_ran_and_their_requests(tmp_path, standalone_sandbox):
    """The instance vanishes after the first step: the cell is partial, and the first step and its
    requests are stored with the sweep so far (whether the second step had measured anything yet)."""
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_sweep.yaml"
    matrix.write_text(SWEEP_MATRIX.replace("min_rate: 2, steps: 5, precision: 25%, duration: 3s",
                                           "min_rate: 2, max_rate: 8, steps: 5, precision: 25%, duration: 6s"))
    run = PytestRun(tmp_path, url, "--rootdir", str(tmp_path), target=matrix)
    try:
        wait_for(lambda: [p for p in run.reports.glob("progress/*/*.log")
                          if "PROGRESS: stage=sweep step=0" in p.read_text()], 120, "the first step")
        (session,) = [s for s in sandbox_sessions(url) if s["status"] == "running"]
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
                   json={"fault": "kill_instance", "session_id": session["id"],
                                                  "silent": True}).raise_for_status()
        output = run.finish()
    finally:
        run.finish(5)
    assert run.process.returncode == 1, output[-3000:]
    (row,) = run.rows()
    assert row["status"] == "partial" and row["failure_stage"] == "benchmark", (row, output[-3000:])
    db = sqlite_utils.Database(run.manifest)
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    sweep = json.loads(benchmark["details_json"])["sweep"]
    (first,) = sweep["steps"]  # max_rate given: no probe; the top rate ran to its end
    assert first["kind"] == "rate" and first["rate"] == 8 and first["requests"] > 0
    stored = db.execute("select count(*) from requests where benchmark_id = ? and warmup = 0",
                        [row["benchmark_id"]]).fetchone()[0]
    assert stored >= first["requests"]  # and the interrupted step's records, if it had any
    assert "saturation sweep interrupted after 1 step(s)" in row["error_message"] or \
        "benchmark interrupted after" in row["error_message"], row["error_message"]
    assert_every_session_released(url)
