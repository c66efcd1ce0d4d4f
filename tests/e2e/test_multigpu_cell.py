"""A 2-GPU cell end to end on the sandbox: vLLM with tensor parallelism 2 on a 2x RTX 4090 machine, its
result recording both GPUs and the whole machine's $/M tokens, and the report naming it ``2x RTX 4090``."""

from __future__ import annotations

import json

import pytest
import sqlite_utils
from e2e_helpers import assert_every_session_released, run_pytest

from pytest_gpubench.figures import cost_per_million_tokens
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

MATRIX = """
runtime: vllm
workload: {duration: 4s, max_tokens: 32, concurrency: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', gpus: 2}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
"""
#: The price of the catalog's only 2x RTX 4090 offer (vastai-18430204): the whole machine's, both GPUs.
TWO_GPU_PRICE = 0.62


@pytest.mark.slow
def test_a_two_gpu_vllm_cell_records_both_gpus_and_the_whole_machines_cost(tmp_path, standalone_sandbox):
    matrix = tmp_path / "gpubench_multigpu.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    rows = {row["cell_id"]: row for row in db["benchmark_manifest"].rows}
    two = rows["RTX_4090-vastai-qwen2:1.5b-x2-c2-runtime_vllm"]
    one = rows["RTX_4090-vastai-qwen2:1.5b-c2-runtime_vllm"]
    benchmark = next(db.query("select * from benchmarks where id = ?", [two["benchmark_id"]]))
    result, details = json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])

    assert result["hardware"]["gpu_count"] == 2 and "RTX 4090" in result["hardware"]["gpu_name"]
    assert details["runtime"]["gpus"] == {"count": 2, "tensor_parallel": 2, "visible_devices": ""}
    assert details["fingerprint"]["fields"]["gpus"] == 2
    assert details["validity"]["fully_in_gpu"] is True
    # The machine's price, both GPUs, over the throughput: the one cost formula.
    assert result["price_per_hour"] == pytest.approx(TWO_GPU_PRICE)
    assert benchmark["cost_per_million_tokens"] == pytest.approx(
        cost_per_million_tokens(TWO_GPU_PRICE, benchmark["output_tokens_per_second"]), rel=1e-6)

    # The one-GPU cell of the same run: its own machine, one GPU, nothing about GPUs in its runtime.
    single = next(db.query("select * from benchmarks where id = ?", [one["benchmark_id"]]))
    other = json.loads(single["details_json"])
    assert "gpus" not in other["runtime"] and "gpus" not in other["fingerprint"]["fields"]
    assert json.loads(single["result_json"])["hardware"]["gpu_count"] == 1
    # Tensor parallelism decodes faster in the sandbox (sqrt(2) = 1.41x, sandbox/openai_launchers.py);
    # both cells ran on the same machine load, so a generous bound holds.
    assert benchmark["decode_tokens_per_second"] > 1.1 * single["decode_tokens_per_second"], (
        benchmark["decode_tokens_per_second"], single["decode_tokens_per_second"])

    with Manifest(tmp_path / "reports" / "manifest.db") as manifest:
        report = build_report(SqliteStore(manifest))
    labels = {row.gpu for row in report.results}
    assert labels == {"2x RTX 4090", "RTX 4090"}
    assert "| 2x RTX 4090 |" in render_markdown(report)
    assert_every_session_released(standalone_sandbox)
