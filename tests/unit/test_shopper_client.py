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


@pytest.mark.parametrize("bad_id", ["../../admin/users", "vastai/1", "..", ".x", "a b"])
def test_a_session_id_the_api_answers_with_must_be_an_id(bad_id):
    # Issue 21 item 8: the id names the key file and later URLs (../../admin/users became
    # DELETE /admin/users with the token). A clear error at the call's stage, never a crash.
    from pytest_gpubench.errors import Stage

    bad = {**SESSION, "id": bad_id}

    def handler(request):
        if request.method == "POST":
            return httpx.Response(201, json={"session": bad, "ssh_private_key": "k"})
        if request.url.path == "/api/v1/sessions":
            return httpx.Response(200, json={"sessions": [SESSION, bad]})
        return httpx.Response(200, json=bad)

    async def go():
        client = client_for(handler, token="tok")
        errors = []
        for call in (client.create_session(SessionRequest(consumer_id="c", offer_id="o", reservation_hours=1)),
                     client.get_session(SESSION["id"], Stage.SSH_WAIT), client.list_sessions()):
            with pytest.raises(StageError) as info:
                await call
            errors.append(info.value)
        await client.aclose()
        return errors

    created, got, listed = run(go())
    assert [e.stage for e in (created, got, listed)] == [Stage.PROVISION, Stage.SSH_WAIT, Stage.CLEANUP]
    for error in (created, got, listed):
        assert "session id" in error.message and "is not a valid id" in error.message
    assert "provider's console" in created.hint


@pytest.mark.parametrize("bad_id", ["../../admin/users", "..", "x/../../admin"])
def test_a_bad_session_id_is_never_sent_and_good_ones_are_one_quoted_segment(bad_id):
    seen = []

    def handler(request):
        seen.append((request.method, request.url.raw_path.decode()))
        return httpx.Response(200, json=SESSION)

    async def go():
        client = client_for(handler, token="tok")
        for call in (client.get_session(bad_id), client.release(bad_id), client.destroy(bad_id)):
            with pytest.raises(StageError, match="is not a valid id: .*not sent to the API"):
                await call
        await client.get_session(SESSION["id"])
        await client.aclose()

    run(go())
    assert seen == [("GET", f"/api/v1/sessions/{SESSION['id']}")]


def test_messages_name_the_api_without_its_password():
    # Issue 21 item 9: https://user:pass@... reached error messages, the store and the terminal.
    async def go():
        client = ShopperClient("http://alice:s3cret@127.0.0.1:9", timeout=2)
        try:
            with pytest.raises(ApiUnreachable) as unreachable:
                await client.wait_ready(attempts=1)
            with pytest.raises(StageError) as failed:
                await client.inventory()
        finally:
            await client.aclose()
        return unreachable.value, failed.value

    unreachable, failed = run(go())
    for text in (str(unreachable), unreachable.url, failed.message):
        assert "s3cret" not in text and "alice:***@127.0.0.1:9" in text
