"""A cell whose matrix names ``runtime: vllm`` runs end to end on the sandbox's ``vllm`` stand-in."""

from __future__ import annotations

import json

import httpx
import pytest
import sqlite_utils
from e2e_helpers import assert_every_session_released, run_pytest

VLLM_MATRIX = """
runtime: {name: vllm, args: [--max-model-len, "4096"]}
workload: {duration: 5s, max_tokens: 32, concurrency: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
"""


@pytest.mark.slow
def test_a_vllm_cell_passes_and_records_vllm_its_version_and_tokens_per_second(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_vllm.yaml"
    matrix.write_text(VLLM_MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    result, details = json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])
    assert (result["model"]["runtime"], result["model"]["runtime_version"]) == ("vllm", "0.10.1.1")
    assert details["runtime"] == {"name": "vllm", "version": "0.10.1.1", "num_parallel": 2, "started_here": True,
                                  "launch_args": ["--max-model-len", "4096"]}
    assert benchmark["decode_tokens_per_second"] > 0 and benchmark["output_tokens_per_second"] > 0
    metrics = details["metrics"]
    assert metrics["errors"] == 0 and metrics["requests"] > 0
    # Measured through vLLM's OpenAI API: the server's usage counts agree with the client's.
    assert metrics["output_tokens_server"] == metrics["output_tokens_client"] > 0
    assert details["cold_start"]["load_seconds"] > 0 and details["validity"]["fully_in_gpu"] is True
    assert_every_session_released(url)


@pytest.mark.slow
def test_an_instance_without_vllm_fails_the_cell_at_install_with_a_clear_error(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    httpx.post(f"{url}/sandbox/faults", json={"fault": "missing_tools", "offer_id": "vastai-18430205",
                                              "tools": ["vllm"]}).raise_for_status()
    matrix = tmp_path / "gpubench_vllm.yaml"
    matrix.write_text(VLLM_MATRIX.replace("model: 'qwen2:1.5b'}", "model: 'qwen2:1.5b', offer: {max_price: 0.115}}"))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["benchmark_manifest"].rows)
    assert (row["status"], row["failure_stage"]) == ("failed", "ollama_install"), row
    assert "vllm is not installed on the instance" in row["error_message"]
    assert_every_session_released(url)
