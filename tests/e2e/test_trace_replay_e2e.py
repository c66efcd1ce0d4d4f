"""Trace replay and speculative decoding end to end on the sandbox (issue 23 item 4): the
server-side request log proves each request arrived when the client says it sent it, scheduled at
its trace time, with its lengths, against Ollama and vLLM; vLLM started with a speculative config
reports its acceptance from /metrics, Ollama says it has none. (The schedule's precision, within
10 ms on a free CPU, is tests/e2e/test_loadgen.py's, retried there: a busy machine only makes
sends late, and each request's record says by how much.)"""

from __future__ import annotations

import json

import httpx
import pytest
import sqlite_utils
from e2e_helpers import SANDBOX_AUTH, run_pytest

from pytest_gpubench.sandbox.openai_launchers import expected_accepted

SPEEDUP = 2
#: Mooncake-style records (timestamps in ms). Input lengths the sandbox's token rule counts
#: exactly (13 tokens are 10 words, 10 words count 13); gaps from 50 to 260 ms after the speedup.
TRACE = [(0, 13, 4), (240, 26, 5), (340, 39, 4), (860, 52, 6), (1380, 65, 5)]

MATRIX = """
workload:
  max_tokens: 32
  trace: {file: trace.jsonl, speedup: %d}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
  - gpu: RTX 4090
    provider: vastai
    model: 'qwen2:7b'
    runtime: {name: vllm, args: [--speculative-config, '{"method": "eagle", "num_speculative_tokens": 3}']}
""" % SPEEDUP


@pytest.mark.slow
def test_a_trace_arrives_on_schedule_with_its_lengths_and_vllm_reports_its_acceptance(tmp_path, standalone_sandbox):
    (tmp_path / "trace.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [1]}) + "\n"
        for t, i, o in TRACE))
    matrix = tmp_path / "gpubench_trace.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    runtimes = set()
    offsets = [t / 1000 / SPEEDUP for t, _, _ in TRACE]
    for row in db["benchmark_manifest"].rows:
        benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
        details = json.loads(benchmark["details_json"])
        runtimes.add(details["runtime"]["name"])
        assert details["load"]["trace"] == {"label": "trace trace.jsonl (5 requests, speedup 2)", "requests": 5,
                                            "speedup": 2.0, "window_s": offsets[-1]}
        metrics = details["metrics"]
        assert metrics["requests"] == 5 and metrics["errors"] == 0
        records = list(db.query("select scheduled_at, send_lag_ms from requests where benchmark_id = ? "
                                "and warmup = 0 order by rowid", [row["benchmark_id"]]))
        assert [r["scheduled_at"] for r in records] == pytest.approx(offsets, abs=1e-6)
        assert metrics["send_lag_max_ms"] == pytest.approx(max(r["send_lag_ms"] for r in records), abs=1e-3)

        logged = httpx.get(f"{standalone_sandbox}/sandbox/sessions/{row['session_id']}/requests",
                           headers=SANDBOX_AUTH, timeout=30).json()["requests"][-len(TRACE):]
        arrived = [e["received_at"] - logged[0]["received_at"] for e in logged]
        # The server saw each request arrive when the client's record says it was sent (a generous
        # bound: a starved server stamps its arrivals late too).
        sent = [r["scheduled_at"] + r["send_lag_ms"] / 1000 for r in records]
        assert max(abs(a - (s - sent[0])) for a, s in zip(arrived, sent, strict=True)) < 0.050, \
            (row["cell_id"], arrived, sent)
        assert [e["prompt_tokens"] for e in logged] == [i for _, i, _ in TRACE]
        if details["runtime"]["name"] == "vllm":
            assert [e["max_tokens"] for e in logged] == [o for _, _, o in TRACE]
            assert all(len(e["messages"]) == 1 and e["messages"][0]["role"] == "user" for e in logged)
            spec = details["spec_decode"]
            assert spec["acceptance_rate"] == pytest.approx(expected_accepted(3) / 3, abs=0.05)
            assert spec["mean_acceptance_length"] == pytest.approx(1 + expected_accepted(3), abs=0.15)
        else:
            assert all(e["route"] == "/api/generate" and e["prompt"] for e in logged)
            assert details["spec_decode"]["acceptance_rate"] is None
            assert "no Prometheus /metrics" in details["spec_decode"]["reason"]
    assert runtimes == {"ollama", "vllm"}
