"""Issue 4, bad input: a clear error for every kind, and nothing else lost.

Matrix files and options that are malformed, contradictory or absurd; a GPU
Shopper API that answers 500, hangs, or sends invalid JSON or wrong types (a real
HTTP server on loopback); instances without nvidia-smi, python3 or curl (the
sandbox's ``missing_tools`` fault). The end-to-end test runs all of it in one
pytest subprocess against a misbehaving proxy in front of a sandbox.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpcore  # noqa: F401 - imported before pytester's in-process run, which would drop a first import
import httpx
import pytest
import sqlite_utils
from aiohttp import ClientSession, web

from pytest_gpubench.errors import ApiError, MatrixError, Stage, StageError, UsageProblem
from pytest_gpubench.matrix.cells import load_matrix
from pytest_gpubench.runtime_facts import runtime_names
from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from e2e_helpers import SANDBOX_AUTH, pytest_env
from pytest_gpubench.sandbox import SandboxThread
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.faults import FaultRequest
from pytest_gpubench.sandbox.instances import link_system_programs
from pytest_gpubench.settings import resolve
from pytest_gpubench.cloud.shopper_client import SessionRequest, ShopperClient

REPO = Path(__file__).resolve().parents[2]
ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"
KNOWN_RUNTIMES = ", ".join(runtime_names())

# ------------------------------------------------------------------ matrix files

BAD_MATRICES = [
    ("offer: {max_price: 500}\n" + ROW,
     "offer.max_price: must be a price in dollars per hour, more than 0 and at most 100", "got 500 (line 1)"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, offer: {max_price: -1}}\n",
     "matrix[0].offer.max_price: must be a price in dollars per hour", "got -1 (line 2)"),
    ("workload: {duration: -5}\n" + ROW, "workload.duration: must be a number of seconds", "at most 24h; got -5"),
    ("workload: {duration: 25h}\n" + ROW, "workload.duration:", "at most 24h; got '25h'"),
    ("workload: {duration: 0}\n" + ROW, "workload.duration:", "more than 0"),
    ("workload: {duration: forever}\n" + ROW, "workload.duration:", "got 'forever'"),
    ("matrix:\n  - {gpu: RTX 4090, provider: aws, model: qwen2:7b}\n",
     "matrix[0].provider: unknown provider 'aws'", "known providers: vastai, tensordock"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastia, model: qwen2:7b}\n", "matrix[0].provider:",
     "did you mean 'vastai'"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastai, providers: [vastai], model: qwen2:7b}\n",
     "matrix[0]: give either `provider` or `providers`, not both", "(line 2)"),
    ("workload: {concurrency: [1, 4], rate: 2}\n" + ROW, "workload:", "cannot be combined"),
    ("workload: {runs: {until_cv: 2%, min: 8, max: 3}}\n" + ROW, "workload.runs: `min` (8) is more than `max` (3)",
     "(line 1)"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: [qwen2:7b}\n", "line 2: invalid YAML", "column"),
    ("matrix:\n\t- gpu: x\n", "line 2: invalid YAML", "'\\t'"),
    (ROW + "matrix: []\n", "line 3: invalid YAML: duplicate key 'matrix' (first at line 1)", ""),
    ("- gpu: RTX 4090\n", "the top level must be a mapping", "got a list"),
    ("", "the file is empty", "at least `matrix:`"),
    ("workload: {max_tokens: 0}\n" + ROW, "workload.max_tokens: must be a whole number from 1 to 131072", "got 0"),
    ("workload: {concurrency: 100000}\n" + ROW, "workload.concurrency:", "from 1 to 1024"),
    ("workload: {concurrency: sweep, sweep: {max_concurrency: 5000}}\n" + ROW,
     "workload.sweep.max_concurrency: must be a whole number from 2 to 1024", "got 5000 (line 1)"),
    ("workload: {concurrency: sweep, sweep: {min_rate: 1}}\n" + ROW,
     "matrix[0].workload: `sweep.min_rate` does not apply to `concurrency: sweep`; its keys are", "(line 3)"),
    ("runtime: {name: vllm, batch_limit: many}\n" + ROW, "runtime.batch_limit: must be a whole number from 1 to 1024",
     "got 'many' (line 1)"),
    ("runtime: {ollama_install: '  '}\n" + ROW, "runtime.ollama_install: must be a non-empty shell command", ""),
    ("runtime: triton\n" + ROW, f"runtime: unknown runtime 'triton'; known runtimes: {KNOWN_RUNTIMES}", "(line 1)"),
    ("runtime: {name: triton}\n" + ROW, f"runtime.name: unknown runtime 'triton'; known runtimes: {KNOWN_RUNTIMES}",
     "(line 1)"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, runtime: olama}\n",
     f"matrix[0].runtime: unknown runtime 'olama' (did you mean 'ollama'?); known runtimes: {KNOWN_RUNTIMES}",
     "(line 2)"),
    ("runtime: [ollama]\n" + ROW, "runtime: must be a runtime name such as 'ollama', or a mapping", "got a list"),
    ("matrix:\n  - {gpu: 'RTX 4090; rm -rf /', provider: vastai, model: qwen2:7b}\n", "matrix[0].gpu:",
     "got 'RTX 4090; rm -rf /'"),
    ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n  - {gpu: RTX 4090, provider: vastai, "
     "model: 'qwen2:7b'}\n", "matrix[1]: duplicate cell RTX_4090-vastai-qwen2:7b", "already in matrix[0]"),
    ("wokload: {duration: 5s}\n" + ROW, "wokload: unknown key (did you mean 'workload'?)", "allowed keys"),
]


@pytest.mark.parametrize(("text", "field_and_rule", "detail"), BAD_MATRICES)
def test_bad_matrix_is_one_line_naming_file_field_and_what_is_allowed(tmp_path, text, field_and_rule, detail):
    path = tmp_path / "gpubench_bad.yaml"
    path.write_text(text)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert field_and_rule in message and detail in message, message
    assert "\n" not in message


def test_unreadable_matrix_files_say_why(tmp_path):
    binary = tmp_path / "gpubench_bin.yaml"
    binary.write_bytes(b"matrix:\n  - {gpu: RTX 4090, provider: vastai, model: \xff\xfe}\n")
    with pytest.raises(MatrixError, match=r"gpubench_bin.yaml: the file is not UTF-8 text \(byte 53 is invalid\); "
                                          r"save it as UTF-8$"):
        load_matrix(binary)
    with pytest.raises(MatrixError, match=r"gpubench_none.yaml: cannot read the file: No such file or directory$"):
        load_matrix(tmp_path / "gpubench_none.yaml")


def test_a_bad_matrix_stops_collection_with_one_line_and_rents_nothing(pytester, monkeypatch, bad_api):
    bad_api.answers[("GET", "/health")] = (200, "application/json", b'{"status": "ok"}')
    bad_api.answers[("GET", "/api/v1/sessions")] = (200, "application/json", b'{"sessions": [], "count": 0}')
    pytester.makefile(".yaml", gpubench_good=ROW, gpubench_bad="workload: {duration: 2d}\n" + ROW)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    monkeypatch.setenv("GPUBENCH_API_BASE", bad_api.url)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*gpubench_bad.yaml: workload.duration: must be a number of seconds*got '2d'*"])
    assert "Traceback" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED  # collection errors: nothing runs
    assert not [call for call in bad_api.calls if call[0] == "POST"]  # nothing was rented


@pytest.mark.parametrize(("cli", "expect"), [
    ({"max_price": "500"}, "--gpubench-max-price: '500' must be at most 100 dollars per hour"),
    ({"max_price": "-1"}, "--gpubench-max-price: '-1' must be a positive number"),
    ({"duration": "100000"}, "--gpubench-duration: '100000' must be a number of seconds or a duration such as "
                             "'90s', '5m', '1h30m' (more than 0, at most 24h)"),
    ({"duration": "-3"}, "--gpubench-duration: '-3' must be a number of seconds or a duration such as "
                         "'90s', '5m', '1h30m' (more than 0, at most 24h)"),
    ({"duration": "soon"}, "--gpubench-duration: 'soon' must be a number of seconds or a duration such as "
                           "'90s', '5m', '1h30m' (more than 0, at most 24h)"),
])
def test_absurd_options_are_usage_errors_naming_the_flag(cli, expect):
    with pytest.raises(UsageProblem) as info:
        resolve(cli, {}, lambda key: None)
    assert str(info.value) == expect


def test_absurd_environment_values_name_the_variable():
    with pytest.raises(UsageProblem, match=r"^environment variable GPUBENCH_MAX_PRICE: '1e9' must be at most 100"):
        resolve({}, {"GPUBENCH_MAX_PRICE": "1e9"}, lambda key: None)


# ----------------------------------------------------- a misbehaving API (real HTTP)

Answer = tuple[int, str, bytes]  # status, content type, body
SESSION = {"id": "3f6c1a52-0000-4000-8000-000000000001", "status": "running", "ssh_host": "127.0.0.1",
           "ssh_port": 2222}


class MisbehavingApi:
    """A real HTTP server on loopback; ``answers[(method, path)]`` says what each call gets."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Answer | Callable[[], Answer]] = {}
        self.release = threading.Event()
        self.calls: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                api.calls.append((self.command, path))
                answer = api.answers.get((self.command, path), (404, "application/json", b'{"error": "not found"}'))
                if callable(answer):
                    answer = answer()
                if answer is None:  # close the connection without an answer
                    self.close_connection = True
                    return
                status, kind, body = answer
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def hang(self) -> Answer:
        self.release.wait(30)  # longer than any client timeout in these tests
        return 200, "application/json", b"{}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bad_api() -> Iterator[MisbehavingApi]:
    api = MisbehavingApi()
    yield api
    api.close()


def call(api: MisbehavingApi, method: str, *args, timeout: float = 5.0):
    async def go():
        client = ShopperClient(api.url, timeout=timeout)
        try:
            return await getattr(client, method)(*args)
        finally:
            await client.aclose()

    return asyncio.run(go())


CREATE = SessionRequest(consumer_id="c", offer_id="vastai-1", reservation_hours=1)
SESSION_PATH = f"/api/v1/sessions/{SESSION['id']}"


def test_500_with_an_html_body(bad_api):
    bad_api.answers[("POST", "/api/v1/sessions")] = (500, "text/html", b"<html><body>Bad gateway</body></html>")
    with pytest.raises(ApiError) as info:
        call(bad_api, "create_session", CREATE)
    error = info.value
    assert error.status == 500 and error.stage is Stage.PROVISION
    text = str(error)
    assert text.startswith("API answered 500 to POST /api/v1/sessions: Internal Server Error; the body is not "
                           "the API's JSON: '<html><body>Bad gateway</body></html>'"), text
    assert text.endswith("(the GPU Shopper server failed: check its logs, then rerun the cell)")


def test_500_with_the_servers_own_error_suggesting_a_retry(bad_api):
    body = {"error": "failed to create instance: No available public IPs", "error_type": "provision_failed",
            "retry_suggested": True, "request_id": "req-42"}
    bad_api.answers[("POST", "/api/v1/sessions")] = (500, "application/json", json.dumps(body).encode())
    with pytest.raises(ApiError) as info:
        call(bad_api, "create_session", CREATE)
    assert info.value.retry_suggested and info.value.error_type == "provision_failed"
    assert str(info.value) == ("API answered 500 provision_failed to POST /api/v1/sessions: failed to create "
                               "instance: No available public IPs (request_id req-42) (the server suggests "
                               "retrying: rerun the cell)")


def test_refused_credentials_point_at_the_token(bad_api):
    bad_api.answers[("GET", "/api/v1/inventory")] = (401, "application/json", b'{"error": "unauthorized"}')
    with pytest.raises(ApiError, match=r"API answered 401 to GET /api/v1/inventory: unauthorized \(the server "
                                       r"refused the credentials: set GPUBENCH_API_TOKEN"):
        call(bad_api, "inventory")


def test_a_hanging_api_times_out_at_the_calls_stage(bad_api):
    bad_api.answers[("GET", "/api/v1/inventory")] = bad_api.hang
    started = time.monotonic()
    with pytest.raises(StageError) as info:
        call(bad_api, "inventory", timeout=0.5)
    assert time.monotonic() - started < 20  # the client's timeout ended it, not the server
    assert info.value.stage is Stage.INVENTORY
    assert str(info.value) == (f"the GPU Shopper API at {bad_api.url} did not answer GET /api/v1/inventory within "
                               "0.5 s (ReadTimeout) (the server is stuck or overloaded: check its /health and logs, "
                               "then rerun the cell)")


def test_a_hanging_inventory_fails_the_inventory_stage_at_its_own_timeout(bad_api):
    bad_api.answers[("GET", "/api/v1/inventory")] = bad_api.hang
    settings = SimpleNamespace(stage_timeout=lambda stage, duration=0.0: 0.3)

    async def go():
        client = ShopperClient(bad_api.url, timeout=30)
        try:
            return await ShopperProvider(client, settings).choose_offer(Constraints(gpu="RTX 4090", provider="vastai",
                                                                                    vram_gb=8))
        finally:
            await client.aclose()

    with pytest.raises(StageError, match=r"did not answer GET /api/v1/inventory within the inventory stage's 0.3 s") \
            as info:
        asyncio.run(go())
    assert info.value.stage is Stage.INVENTORY and "rerun the cell" in str(info.value)


def test_a_connection_closed_without_an_answer(bad_api):
    bad_api.answers[("GET", SESSION_PATH)] = lambda: None
    with pytest.raises(StageError) as info:
        call(bad_api, "get_session", SESSION["id"])
    assert info.value.stage is Stage.SSH_WAIT
    assert str(info.value).startswith(f"GET {SESSION_PATH} to the GPU Shopper API at {bad_api.url} failed: ")
    assert str(info.value).endswith("(check that the server is running and reachable, then rerun the cell)")


def test_invalid_json(bad_api):
    bad_api.answers[("GET", SESSION_PATH)] = (200, "application/json", b'{"id": "3f6c", "status": "runn')
    with pytest.raises(StageError) as info:
        call(bad_api, "get_session", SESSION["id"])
    assert info.value.stage is Stage.SSH_WAIT
    assert str(info.value) == (f"GET {SESSION_PATH} answered 200 with invalid JSON: '{{\"id\": \"3f6c\", \"status\": "
                               f"\"runn' ({bad_api.url} does not answer like a GPU Shopper API (a proxy or a web "
                               "page?): check --gpubench-api / GPUBENCH_API_BASE)")


@pytest.mark.parametrize(("method", "path", "body", "expect", "stage"), [
    ("inventory", "/api/v1/inventory", {"offers": [{"id": "a", "provider": "vastai", "gpu_type": "RTX 4090",
                                                    "price_per_hour": "lots"}]},
     "unexpected offers entry: 0.price_per_hour: Input should be a valid number", Stage.INVENTORY),
    ("inventory", "/api/v1/inventory", {"offers": {"a": 1}}, "unexpected answer: no 'offers' list", Stage.INVENTORY),
    ("inventory", "/api/v1/inventory", [1, 2], "unexpected answer: no 'offers' list", Stage.INVENTORY),
    ("get_session", SESSION_PATH, {**SESSION, "ssh_port": "twenty-two"}, "unexpected session answer: ssh_port:",
     Stage.SSH_WAIT),
])
def test_wrong_types(bad_api, method, path, body, expect, stage):
    bad_api.answers[("GET", path)] = (200, "application/json", json.dumps(body).encode())
    args = (SESSION["id"],) if method == "get_session" else ()
    with pytest.raises(StageError) as info:
        call(bad_api, method, *args)
    assert info.value.stage is stage
    assert str(info.value).startswith(expect), str(info.value)
    assert "check that --gpubench-api points at a compatible GPU Shopper server" in str(info.value)


def test_a_malformed_create_answer_does_not_echo_the_key(bad_api):
    key = "-----" "BEGIN RSA PRIVATE" " KEY-----\nMIIEsecretsecretsecret\n-----END RSA PRIVATE" " KEY-----\n"
    body = {"session": {"id": 17, "status": None}, "ssh_private_key": key}
    bad_api.answers[("POST", "/api/v1/sessions")] = (201, "application/json", json.dumps(body).encode())
    with pytest.raises(StageError) as info:
        call(bad_api, "create_session", CREATE)
    assert info.value.stage is Stage.PROVISION
    assert str(info.value).startswith("unexpected session answer: session.id: Input should be a valid string")
    assert "secretsecret" not in str(info.value) and "PRIVATE" not in str(info.value)


# ----------------------------------------------- the sandbox's missing_tools fault


def test_missing_tools_hides_the_tool_and_its_versioned_names(tmp_path):
    system = tmp_path / "usr-bin"
    system.mkdir()
    for name in ("python3", "python3.11", "curl", "bash", "pythonista"):
        (system / name).write_text("#!/bin/sh\n")
        (system / name).chmod(0o755)
    (system / "README").write_text("not a program")
    target = tmp_path / "sysbin"
    assert link_system_programs(target, f"{system}:{tmp_path / 'absent'}", frozenset({"python3", "curl"})) == 2
    assert sorted(path.name for path in target.iterdir()) == ["bash", "pythonista"]
    assert (target / "bash").resolve() == system / "bash"


@pytest.mark.parametrize(("body", "error"), [
    ({"fault": "missing_tools", "offer_id": "o"}, "needs tools"),
    ({"fault": "missing_tools", "offer_id": "o", "tools": ["gcc"]}, "tools.0"),
    ({"fault": "missing_tools", "tools": ["curl"]}, "needs offer_id"),
])
def test_missing_tools_fault_requests_are_checked(body, error):
    with pytest.raises(ValueError, match=error):
        FaultRequest.model_validate(body)


# ------------------------------------------------- end to end: one run, every failure


class MisbehavingProxy:
    """An HTTP proxy in front of the sandbox that breaks some calls, chosen by cell.

    - creates for ``A100`` cells answer 500 with an HTML page;
    - sessions created for ``RTX_4090-vastai-qwen2:7b`` answer polls with invalid JSON;
    - the ``tensordock`` inventory has wrong types.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.garbled: set[str] = set()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._client: ClientSession | None = None

    async def start(self) -> str:
        self._client = ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        assert self._runner is not None and self._client is not None
        await self._runner.cleanup()
        await self._client.close()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        path = request.path
        if request.method == "POST" and path == "/api/v1/sessions" and "A100" in body.decode():
            return web.Response(status=500, text="<html><h1>500 Internal Server Error</h1></html>",
                                content_type="text/html")
        if path == "/api/v1/inventory" and request.query.get("provider") == "tensordock":
            return web.json_response({"offers": [{"id": 7, "provider": "tensordock", "gpu_type": "RTX 3090",
                                                  "price_per_hour": "cheap"}], "count": 1})
        if request.method == "GET" and path.rsplit("/", 1)[-1] in self.garbled:
            return web.Response(status=200, text='{"status": "runn', content_type="application/json")
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with self._client.request(request.method, self.upstream + request.path_qs, data=body,
                                        headers=headers) as upstream:
            data = await upstream.read()
            if request.method == "POST" and path == "/api/v1/sessions" and upstream.status == 201 \
                    and "RTX_4090-vastai-qwen2:7b" in body.decode():
                self.garbled.add(json.loads(data)["session"]["id"])
            return web.Response(status=upstream.status, body=data, content_type="application/json")


E2E_MATRIX = """
reuse: cell                  # each cell meets its own fault on its own session
workload:
  duration: 2s
  max_tokens: 24
  warmup_requests: 1
  progress_interval: 1s
matrix:
  - gpu: RTX 4090            # no python3 on the instance: the load generator runs here
    provider: vastai
    model: qwen2:1.5b
    offer: {max_price: 0.115}
  - gpu: RTX 4090            # the API garbles the session polls
    provider: vastai
    model: qwen2:7b
  - gpu: RTX 3090            # no curl: the default Ollama install cannot download
    provider: vastai
    model: qwen2:7b
    offer: {max_price: 0.081}
  - gpu: A100 80GB           # the API answers the create with a 500 HTML page
    provider: vastai
    model: qwen2:7b
  - gpu: RTX 3090            # the API's inventory has wrong types
    provider: tensordock
    model: qwen2:7b
"""


@pytest.mark.slow
def test_every_kind_of_bad_answer_fails_its_cell_clearly_and_loses_nothing(tmp_path):
    matrix = tmp_path / "gpubench_bad_input.yaml"
    matrix.write_text(E2E_MATRIX)
    with SandboxThread(time_scale=0.02) as sandbox:
        for offer_id, tools in (("vastai-18430205", ["python3"]), ("vastai-18430101", ["curl"])):
            httpx.post(f"{sandbox.url}/sandbox/faults", headers=SANDBOX_AUTH,
                       json={"fault": "missing_tools", "offer_id": offer_id, "tools": tools}).raise_for_status()
        proxy = MisbehavingProxy(sandbox.url)
        url = sandbox.run(proxy.start())
        try:
            env = pytest_env()  # the sandbox's token, through the proxy
            command = [sys.executable, "-m", "pytest", str(matrix), "--rootdir", str(tmp_path),
                       "-p", "no:cacheprovider", "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                       "--gpubench-reports", str(tmp_path / "reports"), "--gpubench-live", "false"]
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            state = httpx.get(f"{sandbox.url}/sandbox/state", headers=SANDBOX_AUTH).json()
        finally:
            sandbox.run(proxy.stop())

    out = done.stdout
    assert done.returncode == 1, out[-4000:] + done.stderr[-2000:]
    assert "4 failed, 1 passed" in out, out[-4000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out + done.stderr

    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    rows = {row["cell_id"]: row for row in db["benchmark_manifest"].rows}
    assert len(rows) == 5 and {row["status"] for row in rows.values()} <= {"success", "failed"}  # all final
    expected = {
        "RTX_4090-vastai-qwen2:1.5b": ("success", None, ""),
        "RTX_4090-vastai-qwen2:7b": ("failed", "ssh_wait", "answered 200 with invalid JSON"),
        "RTX_3090-vastai-qwen2:7b": ("failed", "runtime_setup", "curl is not installed on the instance"),
        "A100_80GB-vastai-qwen2:7b": ("failed", "provision", "API answered 500 to POST /api/v1/sessions"),
        "RTX_3090-tensordock-qwen2:7b": ("failed", "inventory", "unexpected offers entry: 0.id"),
    }
    for cell, (status, stage, words) in expected.items():
        row = rows[cell]
        assert (row["status"], row["failure_stage"]) == (status, stage), row
        assert words in (row["error_message"] or ""), row
        if stage is not None:
            assert f"[{stage}] " in out and words in out  # the failure report says it too
    hints = {cell: rows[cell]["error_message"] for cell in expected if rows[cell]["status"] == "failed"}
    assert "apt-get install -y curl" in hints["RTX_3090-vastai-qwen2:7b"]
    # Both A100 offers were tried (failover); the message says what the API did each time.
    assert hints["A100_80GB-vastai-qwen2:7b"].count("the body is not the API's JSON: '<html>") == 2
    assert """answered 200 with invalid JSON: '{"status": "runn'""" in hints["RTX_4090-vastai-qwen2:7b"]
    assert "--gpubench-api" in hints["RTX_3090-tensordock-qwen2:7b"]

    # Without python3 on the instance the benchmark still measured, from here, at the true rate.
    (bench,) = list(db["benchmarks"].rows)
    details = json.loads(bench["details_json"])
    assert details["loadgen_where"] == ["local"]
    assert bench["total_requests"] > 0 and bench["total_errors"] == 0
    truth, _, _ = load_catalog().rate("RTX 4090", "vastai", "qwen2:1.5b")
    # 10%, not the 5% of the instance-side tests: from here the tokens come through the SSH forward,
    # and on a loaded 2-core machine (the suite's own -n 6) a late first token shortens the decode
    # span it is timed over (seen: 330-354 tok/s for 320 under load, 320-325 on a quiet machine).
    assert bench["p50_tokens_per_second"] == pytest.approx(truth, rel=0.10)

    # Every session the run created is over: none left running, none lost.
    assert state["sessions"] and all(s["status"] in ("stopped", "failed") for s in state["sessions"]), state
    assert "[provision]" in out and "<html>" in out  # what the API did, in its own words
