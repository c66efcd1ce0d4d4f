"""The GPU Shopper client against httpx.MockTransport answers shaped like the server's."""

import asyncio
import json

import httpx
import pytest

from pytest_gpubench.errors import ApiError, ApiUnreachable, StageError
from pytest_gpubench.cloud.shopper_client import SessionRequest, ShopperClient

SESSION = {"id": "3f6c1a52-0000-4000-8000-000000000001", "consumer_id": "c", "provider": "vastai",
           "gpu_type": "RTX 4090", "status": "running", "ssh_host": "127.0.0.1", "ssh_port": 2222,
           "ssh_user": "root", "price_per_hour": 0.4, "reservation_hours": 1}


def client_for(handler, token=None):
    return ShopperClient("http://shopper.test", token=token, transport=httpx.MockTransport(handler))


def run(coro):
    return asyncio.run(coro)


def test_get_session_accepts_both_shapes():
    answers = iter([SESSION, {"session": SESSION}])

    async def go():
        client = client_for(lambda request: httpx.Response(200, json=next(answers)))
        first = await client.get_session(SESSION["id"])
        second = await client.get_session(SESSION["id"])
        await client.aclose()
        return first, second

    first, second = run(go())
    assert first.status == second.status == "running"
    assert second.ssh_port == 2222


def test_create_sends_body_and_bearer_and_keeps_key_out_of_repr():
    seen = {}

    def handler(request):
        seen["auth"] = request.headers.get("authorization")
        seen["body"] = json.loads(request.content)
        return httpx.Response(201, json={"session": SESSION, "ssh_private_key": "-----BEGIN " "RSA PRIVATE KEY-----x",
                                         "retries_attempted": 0})

    async def go():
        client = client_for(handler, token="tok")
        created = await client.create_session(SessionRequest(consumer_id="c", offer_id="vastai-1", reservation_hours=1))
        await client.aclose()
        return created

    created = run(go())
    assert seen["auth"] == "Bearer tok"
    assert seen["body"] == {"consumer_id": "c", "offer_id": "vastai-1", "workload_type": "interactive",
                            "reservation_hours": 1}
    assert "PRIVATE KEY" not in repr(created)


def test_errors_carry_status_type_and_stage():
    def handler(request):
        return httpx.Response(503, json={"error": "offer no longer available", "error_type": "stale_inventory",
                                         "retry_suggested": True, "request_id": "r1"})

    async def go():
        client = client_for(handler)
        try:
            await client.create_session(SessionRequest(consumer_id="c", offer_id="o", reservation_hours=1))
        finally:
            await client.aclose()

    with pytest.raises(ApiError) as info:
        run(go())
    assert info.value.status == 503
    assert info.value.error_type == "stale_inventory"
    assert info.value.retry_suggested
    assert str(info.value.stage) == "provision"
    assert "offer no longer available" in str(info.value)


def test_release_treats_409_as_already_done():
    answers = iter([httpx.Response(200, json={"status": "stopped"}), httpx.Response(409, json={"error": "stopped"})])

    async def go():
        client = client_for(lambda request: next(answers))
        results = [await client.release("s"), await client.release("s")]
        await client.aclose()
        return results

    assert run(go()) == [True, False]


def test_invalid_json_and_wrong_types_are_stage_errors():
    async def go(answer):
        client = client_for(lambda request: answer)
        try:
            return await client.inventory(provider="vastai")
        finally:
            await client.aclose()

    with pytest.raises(StageError, match="invalid JSON"):
        run(go(httpx.Response(200, content=b"<html>")))
    with pytest.raises(StageError, match="unexpected offers entry: 0.price_per_hour"):
        run(go(httpx.Response(200, json={"offers": [{"id": "a", "provider": "v", "gpu_type": "g",
                                                      "price_per_hour": "lots"}]})))


def test_ready_retries_through_startup_sweep_then_succeeds():
    answers = iter([httpx.Response(503), httpx.Response(503), httpx.Response(200, json={"status": "ok"})])

    async def go():
        client = client_for(lambda request: next(answers))
        await client.wait_ready(attempts=5, interval=0)
        await client.aclose()

    run(go())


def test_nothing_listening_is_api_unreachable_naming_the_url():
    async def go():
        client = ShopperClient("http://127.0.0.1:9")  # discard port: nothing answers
        try:
            await client.wait_ready()
        finally:
            await client.aclose()

    with pytest.raises(ApiUnreachable) as info:
        run(go())
    assert "http://127.0.0.1:9" in str(info.value)
    assert "--gpubench-sandbox" in str(info.value)
