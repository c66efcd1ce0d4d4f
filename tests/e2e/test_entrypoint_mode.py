"""GPU Shopper's entrypoint mode on the sandbox: the image serves the model, the cell benchmarks it.

The sandbox's API port is chosen free per test (entrypoint mode lets the matrix name it),
so these tests need not hold vLLM's fixed port 8000.
"""

from __future__ import annotations

import httpx
import pytest
from e2e_helpers import SANDBOX_AUTH, manifest_rows, only_result, run_pytest, sandbox_sessions
from polling import wait_for

from pytest_gpubench.sandbox.instances import free_port

ENTRYPOINT_MATRIX = """
runtime: {{name: {runtime}, launch: {{mode: entrypoint, image: {image}, api_port: {port}}}}}
workload: {{duration: 5s, max_tokens: 32, concurrency: 2}}
offer: {{max_attempts: 1}}
matrix:
  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}}
"""
SCALE = "0.02"  # the standalone sandbox's


def _run(tmp_path, url: str, image: str, port: int, runtime: str = "vllm"):
    matrix = tmp_path / "gpubench_entry.yaml"
    matrix.write_text(ENTRYPOINT_MATRIX.format(runtime=runtime, image=image, port=port))
    return run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", SCALE,
                      "--rootdir", str(tmp_path), "-rs")


def _progress(tmp_path) -> str:
    (path,) = (tmp_path / "reports" / "progress").rglob("*.log")
    return path.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "image", "budgets"), [
    # A heavy image: longer provision, ssh_wait and runtime_setup budgets (the server's table, time-scaled:
    # vLLM 15 min, TGI 12 min; the floor of a scaled timeout is 15 s).
    ("vllm", "vllm/vllm-openai:v0.10.1", "provision_s=18.0 ssh_wait_s=20.4 runtime_setup_s=18.0"),
    ("tgi", "ghcr.io/huggingface/text-generation-inference:3.3.4", "provision_s=15.0 ssh_wait_s=16.8 runtime_setup_s=15.0"),
])
def test_an_entrypoint_cell_benchmarks_the_images_server_and_records_the_launch(tmp_path, standalone_sandbox,
                                                                                runtime, image, budgets):
    url, port = standalone_sandbox, free_port()
    done = _run(tmp_path, url, image, port, runtime)
    assert done.returncode == 0, done.stdout[-3000:]
    result, details = only_result(tmp_path)
    assert result["model"]["runtime"] == runtime and result["model"]["runtime_version"]
    if runtime == "vllm":
        assert result["model"]["runtime_version"] == "0.10.1.1"
    # Found running, not started (nor stopped) by the plugin; the launch as asked, recorded.
    assert details["runtime"]["started_here"] is False
    assert details["runtime"]["launch"] == {"mode": "entrypoint", "image": image, "api_port": port,
                                            "exposed_ports": []}
    metrics = details["metrics"]
    assert metrics["errors"] == 0 and metrics["output_tokens_server"] == metrics["output_tokens_client"] > 0
    progress = _progress(tmp_path)
    assert f"API_READY endpoint=http://127.0.0.1:{port} api_port={port}" in progress
    assert f"HEAVY_IMAGE image={image} {budgets}" in progress, progress
    # The server's session says how it was launched, and was released.
    (session,) = sandbox_sessions(url)
    assert (session["launch_mode"], session["api_port"], session["status"]) == ("entrypoint", port, "stopped")
    assert session["docker_image"] == image and session["model_id"] == "qwen2:1.5b"


@pytest.mark.slow
def test_an_image_whose_server_never_answers_fails_the_cell_at_provision_with_the_servers_words(
        tmp_path, standalone_sandbox):
    url = standalone_sandbox
    done = _run(tmp_path, url, "example/no-model-server:1", free_port())
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "provision"), row
    assert "API verification timeout" in row["error_message"]
    # The server destroyed the instance; the plugin's release ended the session: nothing left running.
    wait_for(lambda: all(s["status"] == "stopped" for s in sandbox_sessions(url)), timeout=30,
               what="every session stopped")
    (session,) = sandbox_sessions(url)
    assert session["error"] == "API verification timeout" and not session.get("instance_dir")
    assert "HEAVY_IMAGE" not in _progress(tmp_path)  # a light image keeps the seed's budgets


def test_the_sandbox_refuses_nothing_it_cannot_serve_and_reports_the_api_port(standalone_sandbox):
    """The create answer of an entrypoint session: still provisioning, its API port the first exposed one."""
    url = standalone_sandbox
    offers = httpx.get(f"{url}/api/v1/inventory", headers=SANDBOX_AUTH,
                       params={"gpu_type": "RTX 4090", "provider": "vastai"}).json()
    body = {"consumer_id": "gpubench-test-entry", "offer_id": offers["offers"][0]["id"],
            "workload_type": "llm_vllm", "reservation_hours": 1, "launch_mode": "entrypoint",
            "docker_image": "example/no-model-server:1", "model_id": "qwen2:1.5b", "exposed_ports": [18123, 9000]}
    created = httpx.post(f"{url}/api/v1/sessions", headers=SANDBOX_AUTH, json=body)
    assert created.status_code == 201, created.text
    session = created.json()["session"]
    assert (session["status"], session["launch_mode"], session["api_port"]) == ("provisioning", "entrypoint", 18123)
    assert "api_endpoint" not in session  # set only once /health answered
    httpx.delete(f"{url}/api/v1/sessions/{session['id']}", headers=SANDBOX_AUTH, timeout=60).raise_for_status()
