"""Issue 23 item 4 end to end on the sandbox: a conversation cell on Ollama and a shared-prefix cell
on vLLM, as a user writes them in a matrix, proved by each session's server-side request log
(GET /sandbox/sessions/{id}/requests) and stored with the prefix-reuse figures."""

from __future__ import annotations

import json

import pytest
import sqlite_utils
from e2e_helpers import run_pytest, sandbox_api

MATRIX = """
workload: {duration: 2s, max_tokens: 8, concurrency: 2, warmup_requests: 1}
matrix:
  - gpu: RTX 4090
    provider: vastai
    model: 'qwen2:1.5b'
    workload:
      prompts: {conversations: {turns: 3, input_tokens: 40, output_tokens: 8, think_time: 0.1, count: 30}}
  - gpu: RTX 4090
    provider: vastai
    model: 'qwen2:1.5b'
    runtime: {name: vllm, args: [--max-model-len, "4096"]}
    workload:
      prompts: {synthetic: {input_tokens: 130, output_tokens: 8, shared_prefix: 50%, count: 400}}
"""


@pytest.mark.slow
def test_conversations_on_ollama_and_a_shared_prefix_on_vllm_reach_the_servers_as_configured(
        tmp_path, standalone_sandbox):
    matrix = tmp_path / "gpubench_reuse.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    rows = {("vllm" if "vllm" in r["cell_id"] else "ollama"): r for r in db["benchmark_manifest"].rows}
    api = sandbox_api(standalone_sandbox)

    def logged(row):
        return api.get(f"/sandbox/sessions/{row['session_id']}/requests").json()["requests"]

    def metrics(row):
        benchmark = next(db.query("select details_json from benchmarks where id = ?", [row["benchmark_id"]]))
        return json.loads(benchmark["details_json"])["metrics"]

    # Ollama: the conversation went to /api/chat; a later turn holds the earlier ones and an answer.
    chats = [e for e in logged(rows["ollama"]) if e["route"] == "/api/chat"]
    later = [e for e in chats if len(e["messages"]) >= 3]
    assert later, chats
    for entry in later:
        roles = [m["role"] for m in entry["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        earlier = [e for e in chats if e["messages"] == entry["messages"][:-2]]
        assert earlier and earlier[0]["received_at"] + 0.1 <= entry["received_at"]  # after the think time
    ollama = metrics(rows["ollama"])
    assert 0 < ollama["prefix_cached_share"] <= ollama["prefix_cacheable_share"] < 1

    # vLLM: one system prompt, byte-identical, half of every prompt; the cache served most of it.
    # (the runtime's own readiness probe, one "Hello" for one token, is not the workload's)
    generations = [e for e in logged(rows["vllm"]) if e["route"] == "/v1/chat/completions" and e["max_tokens"] == 8]
    systems = {e["messages"][0]["content"] for e in generations if e["messages"][0]["role"] == "system"}
    assert len(generations) >= 3 and len(systems) == 1
    assert all(e["messages"][0]["role"] == "system" for e in generations), [
        e for e in generations if e["messages"][0]["role"] != "system"][:3]
    vllm = metrics(rows["vllm"])
    assert vllm["prefix_cacheable_share"] == pytest.approx(0.5, abs=0.03)
    assert 0.3 < vllm["prefix_cached_share"] <= vllm["prefix_cacheable_share"]
