"""A cell whose matrix names ``runtime: worker`` runs end to end on the sandbox's ``docker`` stand-in,
and each way a container worker breaks fails its cell with a clear error at the right stage."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import sqlite_utils
from e2e_helpers import (assert_every_session_released, assert_fails_at_install_without, manifest_rows,
                         run_pytest, session_processes)
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import expand, load_matrix
from pytest_gpubench.runtimes.worker import WorkerRuntime
from pytest_gpubench.sandbox.docker_standin import pull_seconds
from pytest_gpubench.sandbox.instance_spec import load_instance_spec

PRESETS = Path(__file__).parents[1] / "data" / "worker" / "model_presets.yaml"

WORKER_MATRIX = """
reuse: cell
runtime: {name: worker, presets: model_presets.yaml}
workload: {duration: 3s, max_tokens: 32, concurrency: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
"""

#: Python tests over the same cell, each arming one worker fault on its session before measuring.
FAULTED = '''
import os

import httpx
import pytest

API = {api!r}
#: The sandbox's token, as the plugin gets it (the test run's GPUBENCH_API_TOKEN).
SANDBOX_AUTH = {{"Authorization": "Bearer " + os.environ["GPUBENCH_API_TOKEN"]}}


def fault(gpubench, kind):
    httpx.post(API + "/sandbox/faults", headers=SANDBOX_AUTH,
               json={{"fault": kind, "session_id": gpubench.session.session.id,
                                               "after_tokens": 2}}).raise_for_status()


@pytest.mark.gpubench({matrix!r}, gpu="RTX4090", model="qwen2:1.5b")
def test_crash(gpubench):
    fault(gpubench, "worker_crash")
    gpubench.run()


@pytest.mark.gpubench({matrix!r}, gpu="RTX4090", model="qwen2:1.5b")
def test_malformed(gpubench):
    fault(gpubench, "worker_malformed")
    gpubench.run()


@pytest.mark.gpubench({matrix!r}, gpu="RTX4090", model="qwen2:1.5b")
def test_failed(gpubench):
    fault(gpubench, "worker_failed")
    gpubench.run()
'''


def worker_processes(rows: list[dict]) -> list[str]:
    """The ``docker`` stand-in's processes still alive on the sessions of ``rows`` (other tests' are not)."""
    assert rows and all(row["session_id"] for row in rows), rows
    alive = [line for row in rows if row["session_id"] for line in session_processes(row["session_id"])]
    return [line for line in alive if "sandbox.worker_standin" in line or "sandbox.docker_standin" in line]


def write_matrix(tmp_path: Path, text: str = WORKER_MATRIX) -> Path:
    shutil.copy(PRESETS, tmp_path / "model_presets.yaml")
    matrix = tmp_path / "gpubench_worker.yaml"
    matrix.write_text(text)
    return matrix


def sandbox_run(tmp_path: Path, url: str, *args: str):
    return run_pytest(tmp_path, *args, "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")


@pytest.mark.slow
def test_a_worker_cell_passes_through_the_plugin_and_leaves_no_container(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    done = sandbox_run(tmp_path, url, str(write_matrix(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    result, details = json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])
    assert (result["model"]["runtime"], result["model"]["runtime_version"]) == ("worker", "27.3.1")
    assert details["runtime"]["num_parallel"] == 2 and details["runtime"]["started_here"] is True
    metrics = details["metrics"]
    assert metrics["errors"] == 0 and metrics["requests"] > 0 and benchmark["decode_tokens_per_second"] > 0
    assert metrics["output_tokens_server"] in (None, 0)  # workers count nothing: the client's count it is
    progress = Path(row["progress_file"]).read_text()
    assert "stage=model_pull pct=100" in progress  # docker pull's progress
    # The containers' own status, once a run (either container may say it first).
    assert re.search(r'STATUS: WORKER container=[01] status=loading message="Loading qwen2:1.5b on GPU 0 '
                     r'\(command: python /app/worker.py\)"', progress), progress
    assert worker_processes([row]) == []
    assert_every_session_released(url)


@pytest.mark.slow
def test_an_instance_without_docker_fails_the_cell_at_install(tmp_path, standalone_sandbox):
    write_matrix(tmp_path)  # its presets file beside the matrix
    assert_fails_at_install_without(tmp_path, standalone_sandbox, "docker", WORKER_MATRIX,
                                    "docker is not installed on the instance")


@pytest.mark.slow
def test_each_worker_fault_fails_its_cell_with_a_clear_error(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    test_file = tmp_path / "test_faulted.py"
    test_file.write_text(FAULTED.format(api=url, matrix=str(write_matrix(tmp_path))))
    done = sandbox_run(tmp_path, url, str(test_file))
    assert "3 failed" in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    rows = {r["cell_id"].split("@")[1]: r for r in manifest_rows(tmp_path)}
    expected = {
        "test_crash": "worker exited with status 3 before its finish event; its stderr ends: "
                      "RuntimeError: CUDA error: device-side assert triggered",
        "test_malformed": "malformed worker output: not JSON: 'Loading checkpoint shards: 100%|##########| 2/2 "
                          "[00:03<00:00]'",
        "test_failed": "worker finished with status failed: CUDA error: an illegal memory access was encountered",
    }
    for name, error in expected.items():
        row = rows[name]
        # Every measured request failed the same way: the cell fails on its results, saying how.
        assert (row["status"], row["failure_stage"]) == ("failed", "results"), row
        assert "no successful request" in row["error_message"], row["error_message"]
        assert f"the requests failed with: {error} (" in row["error_message"], row["error_message"]
    assert worker_processes(list(manifest_rows(tmp_path))) == []
    assert_every_session_released(url)


def test_a_heavy_image_pulls_for_minutes_unscaled_and_a_short_stage_timeout_names_it(api, tmp_path):
    """Over real SSH to a sandbox instance: the catalog makes vLLM's image a long pull, which
    the runtime's pull ends at its timeout with the image named, at stage model_pull."""
    presets = tmp_path / "model_presets.yaml"
    presets.write_text("models:\n  qwen2:1.5b:\n    inference: {docker_image: 'vllm/vllm-openai:v0.10.1'}\n")
    matrix = tmp_path / "gpubench_heavy.yaml"
    matrix.write_text(WORKER_MATRIX)
    (cell,) = expand(load_matrix(str(matrix)))
    session, key = new_session(api)
    loop = LoopThread("worker-pull")
    try:
        conn = loop.run(connect(session, key), 60)
        runtime = WorkerRuntime.for_cell(conn, cell)
        with pytest.raises(StageError) as info:
            loop.run(runtime.pull(cell.model, 0.5), 60)
        assert info.value.stage is Stage.MODEL_PULL
        assert str(info.value) == ("docker pull vllm/vllm-openai:v0.10.1 did not finish within the stage timeout "
                                   "(0 s)")
        spec = load_instance_spec({"GPUBENCH_SANDBOX_INSTANCE": instance_file(conn, loop)})
        assert pull_seconds(spec, "vllm/vllm-openai:v0.10.1") > 60 > pull_seconds(spec, "some/small-worker")
        loop.run(conn.close(), 15)
    finally:
        loop.close()
        api.post(f"/api/v1/sessions/{session['id']}/done")


def instance_file(conn, loop) -> str:
    """The instance's ``instance.json``, as its programs find it."""
    result = loop.run(conn.run("echo $GPUBENCH_SANDBOX_INSTANCE", stage=Stage.MODEL_PULL, what="env", timeout=30),
                      60)
    return result.stdout.strip()


def test_a_worker_that_never_starts_fails_the_warm_up_at_model_pull_with_dockers_reason(api, tmp_path):
    """Over real SSH: ``docker run`` refusing the container (a flag it does not know, from
    ``runtime.args``) fails the warm-up with docker's own words; the image pulled fine."""
    (cell,) = expand(load_matrix(str(write_matrix(tmp_path, WORKER_MATRIX.replace(
        "presets: model_presets.yaml}", "presets: model_presets.yaml, args: [--no-such-flag, x]}")))))
    session, key = new_session(api)
    loop = LoopThread("worker-start")
    try:
        conn = loop.run(connect(session, key), 60)
        runtime = WorkerRuntime.for_cell(conn, cell)
        loop.run(runtime.ensure_installed(60), 90)
        loop.run(runtime.pull(cell.model, 60), 90)
        with pytest.raises(StageError) as info:
            loop.run(runtime.warm_up(cell.model, 60), 90)
        assert info.value.stage is Stage.MODEL_PULL
        assert str(info.value) == ("the worker did not start: it exited with status 125 before its first event; "
                                   "its stderr ends: unknown flag: --no-such-flag")
        loop.run(conn.close(), 15)
    finally:
        loop.close()
        api.post(f"/api/v1/sessions/{session['id']}/done")
