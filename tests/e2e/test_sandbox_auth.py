"""Issue 21 item 3: the sandbox's API is its user's alone.

Any local user could rent a session (and its private key, which runs commands as the
user running the sandbox) or reset the sandbox: every route now needs the token the
sandbox drew at start, as ``Authorization: Bearer``, and the token goes only where its
user sees it (the program's standard output, the plugin's memory), never to a command
line, a log or a file others can read.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from e2e_helpers import SANDBOX_AUTH, SANDBOX_TOKEN

from pytest_gpubench.cloud.shopper_client import ShopperClient
from pytest_gpubench.errors import ApiUnreachable
from pytest_gpubench.sandbox.process import SandboxProcess
from pytest_gpubench.sandbox.api import make_app
from pytest_gpubench.sandbox.auth import TOKEN_ENV, authorized, bearer, token_from_line
from pytest_gpubench.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _routes() -> list[tuple[str, str]]:
    """Every (method, path) the API serves, path parameters filled in."""
    app = make_app(object(), "t")  # type: ignore[arg-type] - only the router is read
    found = []
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.resource.canonical)
        found.append((route.method, path))
    return found


def test_every_route_answers_401_without_the_token(api: httpx.Client):
    routes = _routes()
    assert ("POST", "/sandbox/reset") in routes and ("POST", "/api/v1/sessions") in routes and len(routes) >= 20
    base = str(api.base_url).rstrip("/")
    wrong = [{}, bearer("not-the-token"), {"Authorization": SANDBOX_TOKEN},  # no scheme
             {"Authorization": f"Basic {SANDBOX_TOKEN}"}, bearer(SANDBOX_TOKEN[:-1])]
    with httpx.Client(timeout=30) as anonymous:
        for n, (method, path) in enumerate(routes):
            for headers in (wrong[0], wrong[1 + n % (len(wrong) - 1)]):  # none, and each kind of wrong one
                answer = anonymous.request(method, f"{base}{path}", headers=headers, json={})
                assert answer.status_code == 401, (method, path, headers, answer.text)
                assert answer.json()["error"].startswith("unauthorized"), answer.text
                assert answer.headers["X-Request-ID"]
    # With the token the same routes answer as before (a 404 for a session "x", never 401).
    assert api.get("/health").status_code == 200 and api.get("/api/v1/sessions/x").status_code == 404


def test_an_unauthenticated_rent_or_reset_changes_nothing(api: httpx.Client, tmp_path):
    before = api.get("/sandbox/state").json()
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("offers: []\n")
    url = str(api.base_url).rstrip("/")
    rent = httpx.post(f"{url}/api/v1/sessions", json={"consumer_id": "intruder", "offer_id": "vastai-18430201",
                                                       "workload_type": "interactive", "reservation_hours": 1})
    reset = httpx.post(f"{url}/sandbox/reset", json={"catalog": str(catalog), "time_scale": 5})
    assert (rent.status_code, reset.status_code) == (401, 401)
    assert "ssh_private_key" not in rent.text
    after = api.get("/sandbox/state").json()
    assert after["sessions"] == before["sessions"] and after["time_scale"] == before["time_scale"]
    assert api.get("/api/v1/inventory").json()["total"] > 0  # the catalog was not replaced


def test_the_token_check_is_exact():
    assert authorized("Bearer abc", "abc") and authorized("bearer abc", "abc")
    assert not authorized("Bearer abcd", "abc") and not authorized("Bearer ab", "abc")
    assert not authorized("Bearer ", "abc") and not authorized(None, "abc") and not authorized("abc", "abc")
    assert not authorized("Bearer ", "")  # a sandbox never runs without a token


def test_the_program_draws_a_token_prints_it_on_stdout_only_and_needs_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    err_path = tmp_path / "sandbox.err"
    with open(err_path, "w") as err:
        program = subprocess.Popen(
            [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--time-scale", "0.01", "--verbose"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in program.stdout], daemon=True).start()
    try:
        url = lines.get(timeout=120).strip().split("=", 1)[1]
        export = lines.get(timeout=30)  # printed with the URL line
        token = token_from_line(export)
        assert token and len(token) >= 40 and token != SANDBOX_TOKEN, export
        assert export.startswith("export GPUBENCH_API_TOKEN=")
        assert token.encode() not in Path(f"/proc/{program.pid}/cmdline").read_bytes()
        assert httpx.get(f"{url}/health", timeout=30).status_code == 401
        assert httpx.get(f"{url}/health", headers=bearer(token), timeout=30).status_code == 200
        assert httpx.get(f"{url}/sandbox/state", headers=bearer(token), timeout=30).status_code == 200
    finally:
        program.send_signal(signal.SIGTERM)
        program.wait(60)
    log = err_path.read_text()
    assert "GET /sandbox/state" in log and "stopped" in log  # the access log ran
    assert token not in log


def test_the_program_refuses_to_print_its_token_into_a_file_others_can_read(tmp_path):
    out = tmp_path / "sandbox.out"
    out.touch(mode=0o644)
    out.chmod(0o644)  # whatever the umask: what `gpubench sandbox > out` gives under umask 022
    with open(out, "w") as stdout:
        done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "--time-scale", "0.01"],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpubench sandbox: standard output is a file other users can read (mode 0644), and the sandbox prints "
        "its API token there: write it to a private file (umask 077) or a pipe")
    assert out.read_text() == ""


def test_the_plugins_sandbox_gets_its_token_through_the_environment_only(tmp_path):
    process = SandboxProcess.start(Settings(reports=tmp_path, time_scale=0.01))
    try:
        token = process.token
        assert token and token != SANDBOX_TOKEN and token not in repr(process)
        assert token.encode() not in Path(f"/proc/{process.process.pid}/cmdline").read_bytes()
        assert httpx.get(f"{process.url}/sandbox/state", timeout=30).status_code == 401
        assert httpx.get(f"{process.url}/sandbox/state", headers=SANDBOX_AUTH, timeout=30).status_code == 401
        assert httpx.get(f"{process.url}/sandbox/state", headers=bearer(token), timeout=30).status_code == 200
        assert process.running_sessions() == []
    finally:
        process.stop()
    assert token not in process.log_path.read_text()



def test_a_client_without_the_token_is_told_to_set_it(sandbox):
    async def ready(token):
        client = ShopperClient(sandbox.url, token=token)
        try:
            await client.wait_ready(attempts=1)
        finally:
            await client.aclose()

    for token in (None, "not-the-token"):
        with pytest.raises(ApiUnreachable, match=r"/health answered 401: the server refused the credentials: "
                                                 r"set GPUBENCH_API_TOKEN to its token"):
            asyncio.run(ready(token))
    asyncio.run(ready(SANDBOX_TOKEN))
