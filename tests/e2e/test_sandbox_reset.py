"""``POST /sandbox/reset``: a used sandbox is as a new one again, on the same address.

A sandbox gets every kind of state a test can leave (a running session with a
process started over SSH, a failed create that evicted its offer, an armed fault, a
moved clock, a stored benchmark, counted bearer tokens), is reset, and must then
answer exactly as a sandbox started fresh does, with no process, port or directory
of the old instance left. The tests' shared sandboxes (tests/e2e/conftest.py) rely on it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from polling import wait_for
from sandbox_session import connect, new_session
from e2e_helpers import SANDBOX_AUTH

from pytest_gpubench.errors import Stage
from pytest_gpubench.sandbox import SandboxThread

TIME_SCALE = 0.01
#: What a fresh sandbox is judged by: its answers, minus the wall-clock time they carry.
VIEWS = ("/sandbox/state", "/sandbox/faults", "/api/v1/sessions", "/api/v1/benchmarks",
         "/api/v1/costs/summary", "/api/v1/inventory", "/health")
CLOCK_KEYS = {"clock", "timestamp", "fetched_at", "period_start", "period_end", "start_date", "end_date"}


def without_clock(value: Any) -> Any:
    """``value`` without the wall-clock readings two sandboxes never share."""
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def views(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, headers=SANDBOX_AUTH, timeout=30) as client:
        return {path: without_clock(client.get(path).json()) for path in VIEWS}


def pid_alive(pid: int) -> bool:
    """Running: a zombie (ended, not yet reaped by whichever process its parent is now) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def port_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def dirty(api: httpx.Client) -> dict[str, Any]:
    """Leave every kind of state in the sandbox behind ``api``; returns what the instance holds."""
    session, key = new_session(api)

    async def start_a_process() -> int:
        connection = await connect(session, key)
        try:
            result = await connection.run("nohup sleep 600 > /dev/null 2>&1 & echo $!", stage=Stage.BENCHMARK,
                                          what="a process of the instance", timeout=30)
        finally:
            await connection.close()
        return int(result.stdout.strip())

    pid = asyncio.run(start_a_process())
    offers = api.get("/api/v1/inventory", params={"provider": "vastai"}).json()["offers"]
    refused, faulty = offers[0]["id"], offers[1]["id"]
    api.post("/sandbox/faults", json={"offer_id": refused, "fault": "stale_inventory", "times": 1})
    api.post("/api/v1/sessions", json={"consumer_id": "reset-test", "offer_id": refused,
                                       "workload_type": "interactive", "reservation_hours": 1})
    assert refused not in {o["id"] for o in api.get("/api/v1/inventory").json()["offers"]}  # evicted
    api.post("/sandbox/faults", json={"offer_id": faulty, "fault": "provision_error", "times": 1})
    api.post("/sandbox/clock", json={"advance_seconds": 1800})
    api.post("/api/v1/benchmarks", json={"model": {"name": "qwen2:7b"}})
    api.get("/api/v1/sessions", headers={"Authorization": "Bearer not-a-real-token"})
    state = api.get("/sandbox/state").json()
    entry = next(s for s in state["sessions"] if s["id"] == session["id"])
    assert state["faults"] and state["benchmarks"] and state["clock_offset_seconds"] == 1800
    return {"pid": pid, "ssh_port": session["ssh_port"], "instance_dir": Path(entry["instance_dir"])}


def test_a_reset_sandbox_answers_as_a_fresh_one_and_leaves_nothing_running(tmp_path):
    with SandboxThread(time_scale=TIME_SCALE) as used, httpx.Client(base_url=used.url, headers=SANDBOX_AUTH,
                                                                    timeout=60) as api:
        left = dirty(api)
        assert pid_alive(left["pid"]) and port_answers(left["ssh_port"]) and left["instance_dir"].is_dir()

        answer = api.post("/sandbox/reset", json={"time_scale": 0.02})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"stopped_sessions": 1, "time_scale": 0.02}
        wait_for(lambda: not pid_alive(left["pid"]), 30, "the instance's process to end")
        assert not port_answers(left["ssh_port"])
        assert not left["instance_dir"].exists()
        assert not (used.sandbox.cloud.workdir / "instances").exists()
        with SandboxThread(time_scale=0.02) as fresh:
            assert views(used.url) == views(fresh.url)

        # No body: back to the time scale it started with, and still fresh after use.
        dirty(api)
        assert api.post("/sandbox/reset").json() == {"stopped_sessions": 1, "time_scale": TIME_SCALE}
        with SandboxThread(time_scale=TIME_SCALE) as fresh:
            assert views(used.url) == views(fresh.url)


def test_a_reset_takes_a_catalog_file_until_the_next_reset(tmp_path, sandbox, api):
    shipped = Path(__file__).parents[2] / "pytest_gpubench" / "sandbox" / "catalog.yaml"
    catalog = yaml.safe_load(shipped.read_text())
    catalog["offers"] = catalog["offers"][:3]
    smaller = tmp_path / "catalog.yaml"
    smaller.write_text(yaml.safe_dump(catalog))
    assert api.post("/sandbox/reset", json={"catalog": str(smaller)}).status_code == 200
    with SandboxThread(time_scale=TIME_SCALE, catalog=smaller) as fresh:
        assert views(sandbox.url) == views(fresh.url)
    assert api.get("/api/v1/inventory").json()["total"] == 3

    api.post("/sandbox/reset")
    assert api.get("/api/v1/inventory").json()["total"] > 3


@pytest.mark.parametrize(("body", "error"), [
    ({"time_scale": -1}, "invalid reset: time_scale: Input should be greater than or equal to 0"),
    ({"catalog": "/no/such/catalog.yaml"}, "invalid reset: "),
    ({"scale": 1}, "invalid reset: scale: Extra inputs are not permitted"),
], ids=["negative-time-scale", "missing-catalog", "unknown-field"])
def test_a_bad_reset_is_refused_and_changes_nothing(api, body, error):
    moved = api.post("/sandbox/clock", json={"advance_seconds": 60}).json()["offset_seconds"]
    answer = api.post("/sandbox/reset", json=body)
    assert answer.status_code == 400 and answer.json()["error"].startswith(error), answer.text
    assert api.get("/sandbox/state").json()["clock_offset_seconds"] == moved >= 60
