"""One real inference server: llama.cpp's OpenAI-compatible server (llama-cpp-python), serving
a tiny random-weight llama model the test writes itself, measured through the whole plugin path
with ``runtime: openai``: what a rented GPU's cell records, from a server we did not write.

Skipped where ``llama_cpp`` is not installed, except in CI (``CI=true``, or
``GPUBENCH_REQUIRE_LLAMA_CPP=1``), where that fails: .ci/run installs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from e2e_helpers import manifest_rows, run_pytest
from polling import wait_for

from pytest_gpubench.sandbox.instances import free_port

pytestmark = pytest.mark.slow
TOKEN = "llama-cpp-s3cret-51c2"
USER_ENV = "LLAMA_CPP_TEST_TOKEN"
ALIAS = "tiny-llama"


def _require_llama_cpp() -> None:
    missing = [name for name in ("llama_cpp", "gguf") if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (pip install 'llama-cpp-python[server]' gguf)"
    if os.environ.get("CI") == "true" or os.environ.get("GPUBENCH_REQUIRE_LLAMA_CPP") == "1":
        pytest.fail(f"CI must run the real llama.cpp server test, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port with the tiny model; its base URL."""
    _require_llama_cpp()
    from tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("llama_cpp")
    model = write_tiny_llama(folder / "tiny-llama.gguf")
    port = free_port()
    log_path = folder / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", ALIAS,
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
             "--api_key", TOKEN],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            answer = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5,
                               trust_env=False)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    try:
        wait_for(ready, 120, "llama.cpp's server to list its model", interval=0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def test_the_real_llama_cpp_server_measured_through_the_plugin(llama_server, tmp_path, monkeypatch):
    monkeypatch.setenv(USER_ENV, TOKEN)
    matrix = tmp_path / "gpubench_llama_cpp.yaml"
    matrix.write_text(f"""
workload: {{duration: 3s, max_tokens: 16, warmup_requests: 1, concurrency: 1}}
runtime: {{name: openai, endpoint: '{llama_server}/v1', api_key_env: {USER_ENV}, price_per_hour: 0.5}}
matrix:
  - {{gpu: CPU, model: {ALIAS}}}
""")
    junit = tmp_path / "junit.xml"
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", "http://127.0.0.1:9", "--junitxml", str(junit))
    assert done.returncode == 0, done.stdout[-4000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["provider"], row["cell_id"]) == (
        "success", "endpoint", f"CPU-endpoint-{ALIAS}-runtime_openai")
    assert row["ttft_p50_ms"] > 0 and row["decode_tokens_per_second"] > 0 and row["total_requests"] >= 2
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    measured = [r for r in db["requests"].rows if not r["warmup"]]
    assert measured and all(r["error"] is None and r["output_tokens"] > 0 and r["ttft_ms"] > 0 for r in measured)
    # llama-cpp-python's server (0.3.36) ignores stream_options.include_usage: its streams carry no
    # usage, so the server's own count stays empty beside the client's. A version that sends it
    # fails this line: then assert eval_count and prompt_tokens as the vllm stand-in's test does.
    assert {r["eval_count"] for r in measured} == {None}, measured[:2]
    (result,) = list(db["benchmarks"].rows)
    model = json.loads(result["result_json"])["model"]
    assert (model["name"], model["runtime"]) == (ALIAS, "openai")
    progress = Path(row["progress_file"]).read_text()
    for line in ("SYSTEM_INFO", "declared=true", "OLLAMA_INSTALLED", "MODEL_READY", "BENCHMARK_COMPLETE",
                 "COMPLETED"):
        assert line in progress, progress
    report = junit.read_text()
    assert f"CPU-endpoint-{ALIAS}-runtime_openai" in report and "<failure" not in report and "<error" not in report
    for path in [p for p in (tmp_path / "reports").rglob("*") if p.is_file()] + [junit]:
        assert TOKEN.encode() not in path.read_bytes(), path
