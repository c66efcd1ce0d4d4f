"""The sandbox's emulated GPU Shopper API, checked with httpx against a running sandbox.

Expected shapes, codes and words come from the real server's handlers (see
pytest_gpubench/sandbox/api.py). One sandbox at time scale 0.01 serves most tests;
tests that move the clock get their own. No fixed sleeps: waits poll with bounds.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_for
from e2e_helpers import SANDBOX_AUTH

from pytest_gpubench.sandbox import CatalogError, SandboxThread, load_catalog
from pytest_gpubench.sandbox.catalog import availability_confidence, offer_vram_gb
from pytest_gpubench.sandbox.server import main

TIME_SCALE = 0.01
OHIO_4090 = "vastai-18430201"  # 0.16 $/h, reliability 0.992
RENTED_4090 = "vastai-18430206"  # available: false
TD_4090 = "tensordock-4c4c246a-5a67-41ee-8fbc-0893fe52c652-geforcertx4090-pcie-24gb"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
SEED_MATRIX = [
    (gpu, provider, model)
    for gpu, providers, models in [
        ("RTX 3090", ("vastai", "tensordock"), ("qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b")),
        ("RTX 4090", ("vastai", "tensordock"), ("qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b")),
        ("RTX 5090", ("vastai",), ("qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b")),
        ("A100 80GB", ("vastai",), ("qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b")),
        ("H200 NVL", ("vastai",), ("deepseek-r1:70b",)),
        ("RTX 5060 Ti", ("vastai",), ("qwen2:1.5b",)),
        ("RTX 5070", ("vastai",), ("qwen2:1.5b",)),
    ]
    for provider in providers
    for model in models
]




def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def clean_faults(api):
    yield
    api.delete("/sandbox/faults")


def create(api: httpx.Client, offer_id: str = OHIO_4090, **extra: Any) -> httpx.Response:
    body = {
        "consumer_id": f"test-{uuid.uuid4().hex[:8]}",
        "offer_id": offer_id,
        "workload_type": "interactive",
        "reservation_hours": 2,
        **extra,
    }
    return api.post("/api/v1/sessions", json=body)


def status_of(api: httpx.Client, session_id: str) -> dict[str, Any]:
    response = api.get(f"/api/v1/sessions/{session_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_status(api: httpx.Client, session_id: str, wanted: str, timeout: float = 20.0) -> dict[str, Any]:
    return wait_for(
        lambda: (s := status_of(api, session_id))["status"] == wanted and s,
        timeout,
        f"session {session_id} to be {wanted}",
    )


# -- health and inventory -------------------------------------------------------------


def test_health_and_ready(api):
    health = api.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["services"]["ready"] == "true"
    assert api.get("/ready").json()["ready"] is True


def test_not_ready_fault_answers_503_until_cleared(api, clean_faults):
    assert api.post("/sandbox/faults", json={"fault": "not_ready", "seconds": 60}).status_code == 200
    assert api.get("/health").status_code == 503
    assert api.get("/ready").json()["ready"] is False
    api.delete("/sandbox/faults")
    assert api.get("/health").status_code == 200


def test_inventory_shape_and_order(api):
    body = api.get("/api/v1/inventory").json()
    assert set(body) == {"offers", "count", "total"}
    assert body["count"] == body["total"] == len(body["offers"]) > 20
    first = body["offers"][0]
    for key in ("id", "provider", "provider_id", "gpu_type", "gpu_count", "vram_gb", "price_per_hour", "location",
                "reliability", "available", "availability_confidence", "fetched_at"):
        assert key in first
    keys = [(-o["availability_confidence"], o["price_per_hour"]) for o in body["offers"]]
    assert keys == sorted(keys)  # most confident first, then cheapest, as the server sorts
    assert all(o["available"] for o in body["offers"])
    assert RENTED_4090 not in {o["id"] for o in body["offers"]}


def test_inventory_reports_vram_and_confidence_like_the_server(api):
    offers = {o["id"]: o for o in api.get("/api/v1/inventory").json()["offers"]}
    assert offers[OHIO_4090]["vram_gb"] == 23  # 24564 MiB // 1024
    assert offers["vastai-18430301"]["vram_gb"] == 31  # RTX 5090
    assert offers[TD_4090]["vram_gb"] == 24  # TensorDock parses "24GB" from the name
    assert offers[OHIO_4090]["availability_confidence"] == pytest.approx(0.6 * 0.992 + 0.4)
    assert offers[TD_4090]["availability_confidence"] == 0.3
    assert "cuda_version" not in offers[TD_4090] and "machine_id" not in offers[TD_4090]
    spot = offers["vastai-18430205"]
    assert spot["interruptible"] is True
    assert spot["availability_confidence"] == pytest.approx(0.6 * 0.97 + 0.4 * 0.06 / 0.11)


def test_inventory_filters(api):
    def ids(**params: Any) -> set[str]:
        response = api.get("/api/v1/inventory", params=params)
        assert response.status_code == 200, response.text
        return {o["id"] for o in response.json()["offers"]}

    rtx4090 = ids(gpu_type="RTX 4090")
    assert OHIO_4090 in rtx4090 and TD_4090 in rtx4090
    assert ids(gpu_type="RTX4090") == set() and ids(gpu_type="4090") == set()  # exact match only
    assert ids(gpu_type="A100") == set() and ids(gpu_type="A100 80GB")
    assert {o.split("-")[0] for o in ids(provider="tensordock")} == {"tensordock"}
    assert ids(gpu_type="RTX 4090", min_vram=24) == {o for o in rtx4090 if o.startswith("tensordock")}
    assert all(api.get(f"/api/v1/inventory/{o}").json()["price_per_hour"] <= 0.15 for o in ids(max_price=0.15))
    assert not {o for o in ids(min_availability_confidence=0.5) if o.startswith("tensordock")}
    assert "vastai-18430204" in ids(gpu_count=2) and OHIO_4090 not in ids(gpu_count=2)
    page = api.get("/api/v1/inventory", params={"gpu_type": "RTX 4090", "limit": 2, "offset": 1}).json()
    assert page["count"] == 2 and page["total"] == len(rtx4090)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"min_vram": "big"}, 'invalid min_vram: must be a valid integer, got "big"'),
        ({"max_price": "-1"}, "invalid max_price: must be non-negative, got -1"),
        ({"min_availability_confidence": "2"}, "invalid min_availability_confidence: must be between 0 and 1, got 2"),
        ({"limit": "0"}, "invalid limit: must be positive, got 0"),
        ({"provider": "lambda"}, "provider not found: lambda"),
    ],
)
def test_inventory_rejects_bad_parameters(api, params, message):
    response = api.get("/api/v1/inventory", params=params)
    assert response.status_code == 400
    assert response.json()["error"] == message
    assert response.json()["request_id"]


def test_offer_by_id(api):
    assert api.get(f"/api/v1/inventory/{OHIO_4090}").json()["gpu_type"] == "RTX 4090"
    rented = api.get(f"/api/v1/inventory/{RENTED_4090}")  # still in the server's cache
    assert rented.status_code == 200 and rented.json()["available"] is False
    missing = api.get("/api/v1/inventory/vastai-1")
    assert missing.status_code == 404 and missing.json()["error"] == "offer not found: vastai-1"


def test_request_id_is_echoed(api):
    response = api.get("/api/v1/inventory/nope", headers={"X-Request-ID": "trace-42"})
    assert response.headers["X-Request-ID"] == "trace-42" and response.json()["request_id"] == "trace-42"


# -- sessions -------------------------------------------------------------------------


def test_session_lifecycle(api):
    consumer = f"lifecycle-{uuid.uuid4().hex[:8]}"
    response = create(api, consumer_id=consumer, idle_threshold_minutes=30)
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"session", "ssh_private_key"}  # retries_attempted is omitempty
    assert body["ssh_private_key"].startswith("-----BEGIN " "RSA PRIVATE KEY-----")
    session = body["session"]
    assert UUID.match(session["id"])
    assert session["status"] == "provisioning" and session["ssh_port"] == 22 and "ssh_host" not in session
    assert session["ssh_user"] == "root" and session["price_per_hour"] == 0.16 and session["gpu_type"] == "RTX 4090"
    assert parse_time(session["expires_at"]) - parse_time(session["created_at"]) == timedelta(hours=2)
    assert "ssh_private_key" not in status_of(api, session["id"])  # returned once only

    running = wait_status(api, session["id"], "running")
    assert running["ssh_host"] == "127.0.0.1" and running["ssh_port"] != 22
    listed = api.get("/api/v1/sessions", params={"consumer_id": consumer}).json()
    assert listed["count"] == 1 and listed["sessions"][0]["id"] == session["id"]
    state = next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session["id"])
    assert state["idle_threshold_minutes"] == 30 and state["offer_id"] == OHIO_4090

    costs = api.get("/api/v1/costs", params={"session_id": session["id"]}).json()
    assert costs == {"session_id": session["id"], "total_cost": 0, "currency": "USD"}  # first clock hour

    extended = api.post(f"/api/v1/sessions/{session['id']}/extend", json={"additional_hours": 1})
    assert extended.status_code == 200
    assert parse_time(extended.json()["new_expires_at"]) == parse_time(session["expires_at"]) + timedelta(hours=1)
    assert status_of(api, session["id"])["reservation_hours"] == 3

    done = api.post(f"/api/v1/sessions/{session['id']}/done")
    assert done.status_code == 200 and done.json()["session_id"] == session["id"]
    assert status_of(api, session["id"])["status"] == "stopped"  # done returns once stopped
    again = api.post(f"/api/v1/sessions/{session['id']}/done")
    assert again.status_code == 409
    assert again.json()["error"] == f"session {session['id']} is in terminal state: stopped"
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 200
    assert api.post(f"/api/v1/sessions/{session['id']}/extend", json={"additional_hours": 1}).status_code == 409


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "consumer_id is required; offer_id is required; workload_type is required; reservation_hours is required"),
        ({"consumer_id": "c", "offer_id": OHIO_4090, "workload_type": "llm", "reservation_hours": 13},
         "reservation_hours must be at most 12"),
        ({"consumer_id": "c", "offer_id": OHIO_4090, "workload_type": "llm", "reservation_hours": "2"},
         "json: cannot unmarshal string into Go struct field CreateSessionRequest.reservation_hours of type int"),
        ({"consumer_id": "c", "offer_id": OHIO_4090, "workload_type": "gaming", "reservation_hours": 1},
         "invalid workload_type: must be one of: llm, llm_vllm, llm_tgi, training, batch, interactive, inference, "
         "ssh, benchmark"),
    ],
)
def test_create_rejects_bad_bodies(api, body, message):
    response = api.post("/api/v1/sessions", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == message


def test_create_on_unknown_offer_is_404(api):
    response = create(api, offer_id="vastai-404")
    assert response.status_code == 404 and response.json()["error"] == "offer not found: vastai-404"


def test_second_active_session_for_consumer_and_offer_is_409(api):
    consumer = f"dup-{uuid.uuid4().hex[:8]}"
    first = create(api, consumer_id=consumer).json()["session"]
    second = create(api, consumer_id=consumer)
    assert second.status_code == 409
    assert f"consumer {consumer} already has active session {first['id']}" in second.json()["error"]
    # DELETE while provisioning stops it at once; the pair is free again.
    assert api.delete(f"/api/v1/sessions/{first['id']}").status_code == 200
    assert status_of(api, first["id"])["status"] == "stopped"
    third = create(api, consumer_id=consumer)
    assert third.status_code == 201
    api.delete(f"/api/v1/sessions/{third.json()['session']['id']}")


def test_list_filters_by_status_and_provider(api):
    session = create(api, offer_id=TD_4090).json()["session"]
    assert session["provider"] == "tensordock"
    provisioning = api.get("/api/v1/sessions", params={"status": "provisioning", "provider": "tensordock"}).json()
    assert session["id"] in {s["id"] for s in provisioning["sessions"]}
    vastai = api.get("/api/v1/sessions", params={"provider": "vastai"}).json()["sessions"]
    assert session["id"] not in {s["id"] for s in vastai}
    api.delete(f"/api/v1/sessions/{session['id']}")
    stopped = api.get("/api/v1/sessions", params={"status": "stopped"}).json()
    assert session["id"] in {s["id"] for s in stopped["sessions"]}


def test_unknown_session_is_404_everywhere(api):
    missing = str(uuid.uuid4())
    assert api.get(f"/api/v1/sessions/{missing}").status_code == 404
    assert api.post(f"/api/v1/sessions/{missing}/done").status_code == 404
    assert api.post(f"/api/v1/sessions/{missing}/extend", json={"additional_hours": 1}).status_code == 404
    assert api.delete(f"/api/v1/sessions/{missing}").json()["error"] == f"session not found: {missing}"
    assert api.get("/api/v1/costs", params={"session_id": missing}).status_code == 404


# -- faults ---------------------------------------------------------------------------


def test_fault_stale_inventory(api, clean_faults):
    armed = api.post("/sandbox/faults", json={"fault": "stale_inventory", "offer_id": "vastai-18430102", "times": 1})
    assert armed.status_code == 201
    response = create(api, offer_id="vastai-18430102")
    assert response.status_code == 503
    body = response.json()
    assert body["error_type"] == "stale_inventory" and body["retry_suggested"] is True and body["request_id"]
    # The server evicts the offer from its cache; it comes back after the provider's TTL.
    listed = {o["id"] for o in api.get("/api/v1/inventory", params={"gpu_type": "RTX 3090"}).json()["offers"]}
    assert "vastai-18430102" not in listed
    wait_for(
        lambda: "vastai-18430102" in {o["id"] for o in api.get("/api/v1/inventory").json()["offers"]},
        what="the evicted offer to come back",
    )
    # A rented offer is stale too.
    assert create(api, offer_id=RENTED_4090).status_code == 503


def test_fault_provision_error_at_boot(api, clean_faults):
    fault = {"fault": "provision_error", "offer_id": TD_4090, "message": "No available public IPs"}
    assert api.post("/sandbox/faults", json=fault).status_code == 201
    session = create(api, offer_id=TD_4090).json()["session"]
    assert session["status"] == "provisioning"
    failed = wait_status(api, session["id"], "failed")
    assert failed["error"] == "No available public IPs"
    cost = api.get("/api/v1/costs", params={"session_id": session["id"]}).json()["total_cost"]
    assert cost >= 0.44  # a failed session is billed every clock hour it touched
    stopped = wait_status(api, session["id"], "stopped")  # the lifecycle tick releases it
    assert stopped["error"] == "No available public IPs"


def test_fault_provision_error_at_create(api, clean_faults):
    api.post("/sandbox/faults", json={"fault": "provision_error", "offer_id": TD_4090, "when": "create", "times": 1})
    response = create(api, offer_id=TD_4090)
    assert response.status_code == 500
    assert response.json()["error"] == "failed to create instance: No available public IPs"
    assert response.json()["error_type"] == "provision_failed" and response.json()["retry_suggested"] is True


def test_fault_no_ssh_stays_provisioning_then_fails(api, clean_faults):
    api.post("/sandbox/faults", json={"fault": "no_ssh", "offer_id": "vastai-18430103"})
    session = create(api, offer_id="vastai-18430103", ssh_timeout_minutes=1).json()["session"]
    booted = wait_for(lambda: (s := status_of(api, session["id"])).get("ssh_host") and s, what="a reported host")
    assert booted["status"] == "provisioning"  # host known, SSH not answering
    failed = wait_status(api, session["id"], "failed")
    assert failed["error"] == "SSH verification timeout"


def test_fault_kill_instance(api):
    session = create(api).json()["session"]
    wait_status(api, session["id"], "running")
    killed = api.post("/sandbox/faults", json={"fault": "kill_instance", "session_id": session["id"]})
    assert killed.status_code == 200
    stopped = status_of(api, session["id"])
    assert stopped["status"] == "stopped"
    assert stopped["error"] == "Instance not found on provider during reconciliation"
    assert api.post(f"/api/v1/sessions/{session['id']}/done").status_code == 409
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 200


def test_bad_fault_requests(api):
    assert api.post("/sandbox/faults", json={"fault": "meteor"}).status_code == 400
    assert api.post("/sandbox/faults", json={"fault": "no_ssh"}).status_code == 400
    assert api.post("/sandbox/faults", json={"fault": "no_ssh", "offer_id": "vastai-1"}).status_code == 404


# -- benchmarks and state -------------------------------------------------------------


def test_benchmarks_round_trip(api):
    model = f"qwen2:7b-{uuid.uuid4().hex[:6]}"
    posted = api.post(
        "/api/v1/benchmarks",
        json={
            "hardware": {"gpu_name": "NVIDIA GeForce RTX 4090", "gpu_memory_mib": 24564, "gpu_count": 1},
            "model": {"name": model, "runtime": "ollama"},
            "results": {"total_requests": 10, "total_tokens": 2000, "avg_tokens_per_second": 195.3},
            "provider": "vastai",
            "price_per_hour": 0.16,
            "unknown_key": "ignored like Go does",
        },
    )
    assert posted.status_code == 201, posted.text
    stored = posted.json()["benchmark"]
    assert stored["id"] and stored["timestamp"] and stored["results"]["total_tokens"] == 2000
    analysis = posted.json()["cost_analysis"]
    assert analysis["cost_per_million_tokens"] == pytest.approx(0.16 / (195.3 * 3600) * 1e6)
    by_model = api.get("/api/v1/benchmarks", params={"model": model}).json()
    assert by_model["count"] == 1 and by_model["benchmarks"][0]["id"] == stored["id"]
    by_gpu = api.get("/api/v1/benchmarks", params={"gpu": "rtx 4090"}).json()["benchmarks"]
    assert stored["id"] in {b["id"] for b in by_gpu}
    assert api.get(f"/api/v1/benchmarks/{stored['id']}").json()["benchmark"]["model"]["name"] == model
    assert api.get("/api/v1/benchmarks/nope").status_code == 404
    bad = api.post("/api/v1/benchmarks", json={"results": {"total_tokens": "many"}})
    assert bad.status_code == 400 and bad.json()["error"].startswith("invalid benchmark data")


def test_sandbox_state_counts(api):
    state = api.get("/sandbox/state").json()
    counts = state["counts"]
    assert counts["created"] == len(state["sessions"]) > 0
    assert counts["created"] >= counts["running"] + counts["stopped"] + counts["failed"]
    assert state["time_scale"] == TIME_SCALE


# -- clock: billing, expiry, hard cap (own sandbox, the clock moves) -------------------


def test_billing_by_clock_hour_and_expiry():
    with SandboxThread(time_scale=TIME_SCALE) as own, httpx.Client(base_url=own.url, headers=SANDBOX_AUTH,
                                                                   timeout=30) as api:
        session = create(api, reservation_hours=2).json()["session"]
        wait_status(api, session["id"], "running")

        def cost() -> float:
            return api.get("/api/v1/costs", params={"session_id": session["id"]}).json()["total_cost"]

        assert cost() == 0
        api.post("/sandbox/clock", json={"advance_seconds": 3600})
        assert cost() == pytest.approx(0.16)  # one hourly tick while running
        too_long = api.post(f"/api/v1/sessions/{session['id']}/extend", json={"additional_hours": 12})
        assert too_long.status_code == 400 and "12-hour hard max" in too_long.json()["error"]
        api.post("/sandbox/clock", json={"advance_seconds": 3700})
        assert cost() == pytest.approx(0.32)
        wait_status(api, session["id"], "stopped")  # past expires_at: the lifecycle stops it
        summary = api.get("/api/v1/costs").json()
        assert summary["total_cost"] == pytest.approx(0.32) and summary["session_count"] == 1


# -- catalog and program ----------------------------------------------------------------


def test_catalog_covers_the_seed_matrix():
    catalog = load_catalog()
    for gpu, provider, model in SEED_MATRIX:
        tps, ttft, origin = catalog.rate(gpu, provider, model)
        assert origin == "measured" and tps > 0 and ttft > 0, (gpu, provider, model)
        offers = [o for o in catalog.offers if o.gpu_type == gpu and o.provider == provider and o.available]
        assert len(offers) >= 2, (gpu, provider)
        assert len({o.price_per_hour for o in offers}) >= 2 and len({o.location for o in offers}) >= 2
    flags = {o.ollama_preinstalled for o in catalog.offers}
    assert flags == {True, False}
    h200 = next(o for o in catalog.offers if o.gpu_type == "H200 NVL")
    assert offer_vram_gb(catalog, h200) == 140 and availability_confidence(h200) > 0.9


@pytest.mark.parametrize(
    ("mutation", "field"),
    [
        (lambda text: text.replace("price_per_hour: 0.080", "price_per_hour: free", 1), "offers.0.price_per_hour"),
        (lambda text: text.replace('"RTX 3090", price_per_hour: 0.080', '"RTX 9090", price_per_hour: 0.080'),
         "offers.0.gpu_type"),
        (lambda text: text.replace("ollama_version:", "olama_version:"), "olama_version"),
    ],
)
def test_bad_catalog_is_one_line_naming_file_and_field(tmp_path, mutation, field):
    source = Path(__file__).parents[2] / "pytest_gpubench" / "sandbox" / "catalog.yaml"
    bad = tmp_path / "catalog.yaml"
    bad.write_text(mutation(source.read_text()))
    with pytest.raises(CatalogError) as caught:
        load_catalog(bad)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{bad}: {field}: ")


def test_main_with_bad_catalog_exits_2(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("offers: [")
    assert main(["--catalog", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err


def test_program_prints_url_and_stops_sessions_on_sigterm():
    program = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.sandbox", "--time-scale", str(TIME_SCALE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        line = program.stdout.readline()
        assert line.startswith("GPUBENCH_SANDBOX_URL=http://127.0.0.1:")
        with httpx.Client(base_url=line.strip().split("=", 1)[1], headers=SANDBOX_AUTH, timeout=30) as api:
            session = create(api).json()["session"]
            wait_status(api, session["id"], "running")
            sessions = api.get("/sandbox/state").json()["sessions"]
            workdir = Path(next(s for s in sessions if s["id"] == session["id"])["instance_dir"]).parents[1]
        program.send_signal(signal.SIGTERM)
        out, err = program.communicate(timeout=30)
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    assert program.returncode == 0
    assert out == ""  # exactly one line on stdout, already read
    assert "1 session(s) created, 1 left running before shutdown" in err
    assert not workdir.exists()


def test_fault_pull_error_is_armed_on_the_running_instance(api, clean_faults):
    session = create(api).json()["session"]
    wait_status(api, session["id"], "running")
    armed = api.post("/sandbox/faults", json={"fault": "pull_error", "session_id": session["id"], "times": 1})
    assert armed.status_code == 200
    assert armed.json()["pull_fault"]["message"] == "max retries exceeded: unexpected EOF"
    mine = next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session["id"])
    state_dir = Path(mine["instance_dir"]) / "state"
    assert json.loads((state_dir / "ollama_pull_faults.json").read_text())["faults"][0]["times"] == 1
    state = api.get("/sandbox/state").json()
    mine = next(s for s in state["sessions"] if s["id"] == session["id"])
    assert mine["served_requests"] == 0 and mine["served_whole_answers"] == 0  # nothing generated yet
    assert state["served_requests"] >= 0 and state["served_whole_answers"] >= 0
    assert api.delete("/sandbox/faults").json()["cleared"] >= 1
    assert json.loads((state_dir / "ollama_pull_faults.json").read_text())["faults"] == []
    api.delete(f"/api/v1/sessions/{session['id']}")
