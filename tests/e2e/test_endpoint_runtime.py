"""``runtime: openai``: a server that is already up, measured through the whole plugin path.

The sandbox's ``vllm`` stand-in is started directly on loopback (no instance, no SSH)
with ``--api-key``, as a user's own server would be. The runtime's part of the contract
that applies to a server it does not own (readiness with the token, version, the served
model, warm-up, the load generator through the ``LocalShell``, nothing stopped), then
pytest runs a matrix of endpoint cells: one that measures, one with a wrong token, one
whose server is not there; the token appears in no manifest, progress file or JUnit XML.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from e2e_helpers import REPO, manifest_rows, run_pytest
from polling import wait_for
from standin_helpers import write_instance

from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import SEED_PROMPTS, expand, parse_matrix
from pytest_gpubench.measure.benchmark import BenchmarkPlan
from pytest_gpubench.measure.repeats import measure_once
from pytest_gpubench.remote.local import LocalShell
from pytest_gpubench.runtimes.registry import runtime_for
from pytest_gpubench.sandbox.instances import free_port
from pytest_gpubench.sandbox.openai_launchers import VLLM_VERSION

MODEL = "qwen2:7b"  # in the stand-in catalog (standin_helpers.CATALOG)
TOKEN = "endpoint-s3cret-7f3a"
TOKEN_ENV = "GPUBENCH_TEST_ENDPOINT_TOKEN"  # run_pytest drops GPUBENCH_* variables: see `token_env`
USER_ENV = "ENDPOINT_TEST_TOKEN"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve MODEL --port P --api-key TOKEN`` (the stand-in) on loopback; its base URL."""
    folder = tmp_path_factory.mktemp("endpoint")
    instance = write_instance(folder)
    port = free_port()
    env = {**os.environ, "GPUBENCH_SANDBOX_INSTANCE": str(instance),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(folder / "vllm.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "pytest_gpubench.sandbox.openai_launchers", "vllm",
                                    "serve", MODEL, "--port", str(port), "--api-key", TOKEN],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, (folder / "vllm.log").read_text()
        try:
            return httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 60, "the vllm stand-in to answer /health")
    yield url
    process.terminate()
    process.wait(30)


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(USER_ENV, TOKEN)


def endpoint_cell(url: str, env: str = USER_ENV, api: str = "chat"):
    text = (f"runtime: {{name: openai, endpoint: '{url}/v1', api_key_env: {env}, api: {api}, price_per_hour: 2}}\n"
            f"matrix:\n  - {{gpu: RTX 4090, model: '{MODEL}'}}\n")
    (cell,) = expand(parse_matrix(text, "gpubench_endpoint.yaml"))
    return cell


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_runtime_checks_serves_measures_and_leaves_the_server_running(server, token_env, api):
    async def scenario():
        shell = LocalShell.open(hide_gpu=True)
        runtime = runtime_for(endpoint_cell(server, api=api), shell)
        try:
            assert await runtime.ensure_installed(30) is False
            await runtime.locate(30)
            assert await runtime.ensure_serving(30) == VLLM_VERSION == runtime.version
            assert not runtime.started_here and await runtime.ensure_healthy(30) is False
            progress: list[dict] = []
            await runtime.pull(MODEL, 30, progress.append)
            assert progress and (await runtime.model_info(MODEL)).name == MODEL
            assert await runtime.loaded_models() == [MODEL]
            assert await runtime.warm_up(MODEL, 60) == 0.0 and runtime.cold_first_token_ms > 0
            endpoint = runtime.endpoint
            assert (str(endpoint.api), endpoint.api_key_env) == (f"openai-{api}", USER_ENV)
            plan = BenchmarkPlan(model=MODEL, duration=1.0, max_tokens=8, prompts=list(SEED_PROMPTS[:2]),
                                 warmup_requests=0, progress_interval=0.5, checkpoint_every=5,
                                 checkpoint_path=".gpubench/endpoint.checkpoint.json", request_timeout=30,
                                 concurrency=2, protocol=str(endpoint.api), api_key_env=endpoint.api_key_env)
            outcome, samples = await measure_once(runtime, plan, timeout=60, telemetry_interval=0.5,
                                                  on_event=lambda event: None)
            assert outcome.where == "instance"  # the LocalShell has python3: the generator ran as on an instance
            assert samples == []  # this machine's GPU (if any) is not the endpoint's
            measured = [r for r in outcome.records if not r.warmup]
            assert measured and all(r.ok and r.eval_count == r.output_tokens > 0 and r.prompt_tokens
                                    for r in measured), measured[:3]
            assert (shell.home / ".gpubench" / "endpoint.checkpoint.json").is_file()
            for step in (runtime.unload(MODEL), runtime.remove(MODEL), runtime.stop(30)):
                await step
            assert await runtime.ensure_healthy(30) is False  # not ours: still up
        finally:
            await shell.close()

    run(scenario())


def test_a_model_the_server_does_not_serve_fails_at_model_pull(server, token_env):
    runtime = runtime_for(endpoint_cell(server), LocalShell.open())
    with pytest.raises(StageError) as info:
        run(runtime.pull("no-such-model:7b", 30))
    assert info.value.stage is Stage.MODEL_PULL and "'no-such-model:7b'" in str(info.value) and MODEL in str(info.value)
    run(runtime.conn.close())


def test_a_wrong_or_missing_token_fails_at_runtime_setup_naming_the_variable_never_the_value(server, monkeypatch):
    runtime = runtime_for(endpoint_cell(server), LocalShell.open())
    monkeypatch.setenv(USER_ENV, "not-the-token")
    with pytest.raises(StageError) as wrong:
        run(runtime.ensure_serving(30))
    assert wrong.value.stage is Stage.RUNTIME_SETUP
    assert f"{server}/v1 refused the token from ${USER_ENV}: HTTP 401 Unauthorized" == wrong.value.message
    monkeypatch.delenv(USER_ENV)
    with pytest.raises(StageError) as unset:
        run(runtime.ensure_serving(30))
    assert unset.value.stage is Stage.RUNTIME_SETUP and f"${USER_ENV}, which is not set" in unset.value.message
    run(runtime.conn.close())


def test_an_unreachable_endpoint_fails_at_runtime_setup_with_its_url(token_env):
    url = f"http://127.0.0.1:{free_port()}"
    runtime = runtime_for(endpoint_cell(url), LocalShell.open())
    with pytest.raises(StageError) as info:
        run(runtime.ensure_serving(1.5))
    assert info.value.stage is Stage.RUNTIME_SETUP
    assert info.value.message.startswith(f"no OpenAI-compatible server answers at {url}/v1: ")
    assert TOKEN not in str(info.value)
    run(runtime.conn.close())


@pytest.mark.slow
def test_pytest_measures_an_endpoint_and_fails_bad_ones_at_the_right_stage(server, token_env, tmp_path, monkeypatch):
    monkeypatch.setenv("ENDPOINT_TEST_WRONG_TOKEN", "wrong-" + TOKEN[::-1])
    nowhere = f"http://127.0.0.1:{free_port()}"
    matrix = tmp_path / "gpubench_endpoints.yaml"
    matrix.write_text(f"""
workload: {{duration: 2s, max_tokens: 16, warmup_requests: 1, concurrency: 2}}
matrix:
  - {{gpu: RTX 4090, model: '{MODEL}',
      runtime: {{name: openai, endpoint: '{server}/v1', api_key_env: {USER_ENV}, price_per_hour: 2}}}}
  - {{gpu: H100, model: '{MODEL}',
      runtime: {{name: openai, endpoint: '{server}', api_key_env: ENDPOINT_TEST_WRONG_TOKEN}}}}
  - {{gpu: A100, model: '{MODEL}', runtime: {{name: openai, endpoint: '{nowhere}'}}}}
""")
    junit = tmp_path / "junit.xml"
    # The GPU Shopper API is nowhere: a run of endpoints only must not need it.
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", "http://127.0.0.1:9", "--junitxml", str(junit),
                      "-o", "gpubench_files=gpubench_*.yaml", "--gpubench-time-scale", "0.05")
    rows = {row["gpu_type"]: row for row in manifest_rows(tmp_path)}
    assert set(rows) == {"RTX 4090", "H100", "A100"}, done.stdout[-3000:]
    good, refused, absent = rows["RTX 4090"], rows["H100"], rows["A100"]
    assert good["status"] == "success", (good, done.stdout[-3000:])
    assert (good["provider"], good["price_per_hour"], good["session_status"]) == ("endpoint", 2.0, "stopped")
    assert good["ttft_p50_ms"] > 0 and good["decode_tokens_per_second"] > 0 and good["cost_per_million_tokens"] > 0
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    requests = [r for r in db["requests"].rows if r["manifest_id"] == good["id"] and not r["warmup"]]
    assert requests and all(r["eval_count"] == r["output_tokens"] > 0 and r["prompt_tokens"] for r in requests)
    (result,) = [b for b in db["benchmarks"].rows if b["manifest_id"] == good["id"]]
    model = json.loads(result["result_json"])["model"]
    assert (model["runtime"], model["runtime_version"]) == ("openai", VLLM_VERSION)
    assert json.loads(result["details_json"])["hardware_declared"] is True
    progress = Path(good["progress_file"]).read_text()
    assert "SYSTEM_INFO" in progress and "declared=true" in progress and "COMPLETED" in progress
    assert (refused["status"], refused["failure_stage"]) == ("failed", "runtime_setup")
    assert f"{server} refused the token from $ENDPOINT_TEST_WRONG_TOKEN" in refused["error_message"]
    assert (absent["status"], absent["failure_stage"]) == ("failed", "runtime_setup")
    assert f"no OpenAI-compatible server answers at {nowhere}" in absent["error_message"]
    # The token, right or wrong, is in no file the run wrote, nor in what it printed.
    written = [p for p in (tmp_path / "reports").rglob("*") if p.is_file()] + [junit]
    for secret in (TOKEN, os.environ["ENDPOINT_TEST_WRONG_TOKEN"]):
        assert secret not in done.stdout + done.stderr
        for path in written:
            assert secret.encode() not in path.read_bytes(), path
