"""A running session of the in-process sandbox (``sandbox`` and ``api`` in conftest.py)
and a real SSH connection to it, for tests that drive an instance directly.

A plain module, not a test module: test modules import from here.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from polling import wait_for

from pytest_gpubench.remote.ssh import Connection


def new_session(api: httpx.Client, fault: dict[str, Any] | None = None,
                offer_id: str | None = None) -> tuple[dict[str, Any], str]:
    """A running sandbox session on ``offer_id`` (default: the cheapest RTX 4090 offer), and its private key.

    ``fault``: an offer fault (``/sandbox/faults`` body without ``offer_id``) armed first, once.
    """
    offers = api.get("/api/v1/inventory", params={"provider": "vastai", "gpu_type": "RTX 4090"}).json()["offers"]
    offer = next((o for o in offers if o["id"] == offer_id), None) if offer_id else min(
        (o for o in offers if o["available"]), key=lambda o: o["price_per_hour"])
    assert offer is not None, f"no offer {offer_id} among the RTX 4090 offers"
    if fault is not None:
        armed = api.post("/sandbox/faults", json={**fault, "offer_id": offer["id"], "times": 1})
        assert armed.status_code in (200, 201), armed.text
    created = api.post("/api/v1/sessions", json={"consumer_id": f"issue4-{uuid.uuid4().hex[:8]}",
                                                 "offer_id": offer["id"], "workload_type": "interactive",
                                                 "reservation_hours": 1})
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]
    running = wait_for(lambda: (s := api.get(f"/api/v1/sessions/{session_id}").json())["status"] == "running" and s,
                       30, "the session to run")
    return running, created.json()["ssh_private_key"]


async def connect(session: dict[str, Any], key: str) -> Connection:
    """An SSH connection to ``session`` as root (on the loop that awaits it)."""
    return await Connection.open(session["ssh_host"], session["ssh_port"], "root", key, timeout=30)
