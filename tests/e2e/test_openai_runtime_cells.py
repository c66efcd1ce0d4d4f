"""Cells whose matrix names an OpenAI-server runtime run end to end on the sandbox's launcher stand-ins."""

from __future__ import annotations

import json

import pytest
import sqlite_utils
from e2e_helpers import assert_every_session_released, assert_fails_at_install_without, run_pytest
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.runtimes.vllm import VllmRuntime

VLLM_MATRIX = """
runtime: {name: vllm, args: [--max-model-len, "4096"]}
workload: {duration: 5s, max_tokens: 32, concurrency: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
"""


def run_matrix(tmp_path, url: str, name: str, text: str) -> sqlite_utils.Database:
    """Run pytest on a matrix file against the standalone sandbox; it must pass; its manifest."""
    matrix = tmp_path / name
    matrix.write_text(text)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    return sqlite_utils.Database(tmp_path / "reports" / "manifest.db")


@pytest.mark.slow
def test_a_vllm_cell_passes_and_records_vllm_its_version_and_tokens_per_second(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    db = run_matrix(tmp_path, url, "gpubench_vllm.yaml", VLLM_MATRIX)
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
    assert_fails_at_install_without(tmp_path, standalone_sandbox, "vllm", VLLM_MATRIX,
                                    "vllm is not installed on the instance")


def test_a_vllm_serve_that_exits_fails_at_once_with_its_log_tail_and_stop_ends_a_running_one(api):
    """Over real SSH to a sandbox instance: an unknown model makes ``vllm serve`` exit (its log's
    tail is the error, long before the stage timeout); a good one serves until ``stop``."""
    session, key = new_session(api)
    loop = LoopThread("vllm-serve")
    try:
        conn = loop.run(connect(session, key), 60)

        async def scenario() -> tuple[StageError, bool, bool]:
            broken = VllmRuntime(conn, model="no-such-org/no-such-model")
            await broken.ensure_installed(30)
            await broken.locate(30)
            try:
                await broken.ensure_serving(600)
            except StageError as exc:
                failure = exc
            else:
                raise AssertionError("vllm serve of an unknown model served")
            good = VllmRuntime(conn, model="qwen2:1.5b")
            await good.locate(30)
            await good.ensure_serving(120, num_parallel=3)
            serving = await good._healthy()
            await good.stop(30)
            return failure, serving, await good._healthy()

        failure, serving, after_stop = loop.run(scenario(), 300)
        assert failure.stage is Stage.RUNTIME_SETUP
        assert "vllm serve exited before /health answered" in str(failure)
        assert "is not a valid model identifier" in str(failure)  # the server's own words, from its log
        assert (serving, after_stop) == (True, False)
        loop.run(conn.close(), 15)
    finally:
        loop.close()
        api.post(f"/api/v1/sessions/{session['id']}/done")


FAMILY_MATRIX = """
workload: {duration: 3s, max_tokens: 16, concurrency: 2, warmup_requests: 1}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', runtime: {name: sglang, args: [--mem-fraction-static, '0.8']}}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', runtime: tgi}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', runtime: llamacpp}
"""
VERSIONS = {"sglang": "0.5.1", "tgi": "3.3.4", "llamacpp": "6188 (21c17b5b)"}


@pytest.mark.slow
def test_cells_on_sglang_tgi_and_llamacpp_pass_through_the_whole_plugin(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    db = run_matrix(tmp_path, url, "gpubench_family.yaml", FAMILY_MATRIX)
    rows = list(db["benchmark_manifest"].rows)
    assert len(rows) == 3 and {row["status"] for row in rows} == {"success"}, rows
    seen = {}
    for row in rows:
        benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
        result, details = json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])
        name = result["model"]["runtime"]
        seen[name] = result["model"]["runtime_version"]
        assert details["runtime"]["name"] == name and details["runtime"]["started_here"] is True
        metrics = details["metrics"]
        assert metrics["errors"] == 0 and metrics["requests"] > 0
        assert metrics["output_tokens_server"] == metrics["output_tokens_client"] > 0  # the server's usage counts
        launch = details["fingerprint"]["fields"].get("launch")
        assert launch == ({"args": ["--mem-fraction-static", "0.8"], "port": None} if name == "sglang" else None)
    assert seen == VERSIONS
    assert_every_session_released(url)
