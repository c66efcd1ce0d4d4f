"""Property-based tests of the GPU Shopper client's parsing of API answers (issue 21):
offers, sessions, a created session, a template and costs, with fields missing, extra,
null, of the wrong type or oversized, bodies that are not JSON or not the API's shape,
and any status. Each call returns a clean result or raises a StageError (an ApiError for
an error status) whose message is one bounded line; never another exception type. An
offer the client accepts is one the offer rules can judge: a price that is not a number
(NaN) must not slip past a price cap."""

from __future__ import annotations

import asyncio
import copy
import json
import math

import httpx
from hypothesis import example, given, strategies as st

from parser_properties import PARSER_SETTINGS, assert_one_line, within
from pytest_gpubench.cloud.offers import select_offer
from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.cloud.shopper_client import SessionRequest, ShopperClient
from pytest_gpubench.errors import NoEligibleOffer, StageError

OFFER = {"id": "vastai-1", "provider": "vastai", "provider_id": "1", "gpu_type": "RTX 4090", "gpu_count": 1,
         "vram_gb": 24, "price_per_hour": 0.4, "location": "US", "reliability": 0.99, "available": True,
         "availability_confidence": 0.9, "cuda_version": "12.4", "machine_id": 7, "interruptible": False,
         "fetched_at": "2026-02-07T10:00:05Z"}
SESSION = {"id": "3f6c1a52-0000-4000-8000-000000000001", "consumer_id": "c", "provider": "vastai",
           "gpu_type": "RTX 4090", "status": "running", "ssh_host": "127.0.0.1", "ssh_port": 2222,
           "ssh_user": "root", "price_per_hour": 0.4, "reservation_hours": 1, "created_at": "2026-02-07T10:00:05Z"}
#: The longest error message the client passes on: an oversized answer is cut, not dumped.
MESSAGE_MAX = 2000

odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**20, max_value=10**400), st.floats(),
    st.text(max_size=12), st.just("x" * 100_000), st.just("line one\nline two\r\n\x1b[31mred"),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
MISSING = object()


@st.composite
def changed(draw: st.DrawFn, base: dict) -> dict:
    """``base`` with a few fields missing, null, of another type or oversized, and extra ones."""
    item = copy.deepcopy(base)
    for key in draw(st.lists(st.sampled_from(sorted(base)), max_size=3, unique=True)):
        value = draw(st.one_of(st.just(MISSING), odd_values))
        if value is MISSING:
            del item[key]
        else:
            item[key] = value
    item.update(draw(st.dictionaries(st.text(max_size=8), odd_values, max_size=2)))
    return item


def body_of(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def answers(shape) -> st.SearchStrategy[tuple[int, bytes]]:
    """(status, body): the API's shape with its items changed, any JSON, or bytes that are not JSON."""
    return st.tuples(
        st.one_of(st.just(200), st.sampled_from([201, 204, 400, 401, 403, 404, 409, 422, 500, 502, 503])),
        st.one_of(shape.map(body_of),
                  st.dictionaries(st.sampled_from(["error", "request_id", "error_type", "retry_suggested"]),
                                  odd_values, max_size=4).map(body_of),
                  st.recursive(st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=5)),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                           inner, max_size=3),
                               max_leaves=6).map(body_of),
                  st.binary(max_size=60),
                  st.sampled_from([b"[" * 100_000, b"<html>502 Bad Gateway</html>", b"", b"\xff\xfe{}"])),
    )


offers_bodies = st.lists(changed(OFFER), max_size=3).map(lambda items: {"offers": items})
session_bodies = st.one_of(changed(SESSION), changed(SESSION).map(lambda s: {"session": s}))
created_bodies = st.fixed_dictionaries({"session": changed(SESSION), "ssh_private_key": odd_values})
sessions_bodies = st.lists(changed(SESSION), max_size=3).map(lambda items: {"sessions": items})
template_bodies = changed({"hash_id": "abc", "name": "n", "image": "img", "tag": "t"})
cost_bodies = changed({"total_cost": 1.25})


def call(answer: tuple[int, bytes], method: str, *args):
    """``client.method(*args)`` against a server that gives ``answer``: its result, or the
    StageError it raised (any other exception fails the test)."""
    status, body = answer

    async def go():
        client = ShopperClient("http://shopper.test", token="secret-token", transport=httpx.MockTransport(
            lambda request: httpx.Response(status, content=body, headers={"content-type": "application/json"})))
        try:
            return await getattr(client, method)(*args)
        finally:
            await client.aclose()

    try:
        with within():
            return asyncio.run(go())
    except StageError as exc:
        message = str(exc)
        assert_one_line(message)
        assert len(message) <= MESSAGE_MAX, f"a message of {len(message)} characters"
        assert "secret-token" not in message
        return exc


#: An error body of another shape: multi-line and oversized text from the server.
NOISY_ERROR = (500, body_of({"error": "boom\n" * 50_000, "request_id": "r\nq", "error_type": "x" * 10_000}))
DEEP = (200, b"[" * 100_000)


@PARSER_SETTINGS
@given(answer=answers(offers_bodies), cap=st.one_of(st.none(), st.floats(0.01, 10)))
# A price that is not a number: every comparison with the cap is false, so it passed any cap.
@example(answer=(200, body_of({"offers": [{**OFFER, "price_per_hour": float("nan")}]})), cap=1.0)
@example(answer=NOISY_ERROR, cap=None)
@example(answer=DEEP, cap=None)  # nested past json's recursion limit: RecursionError
def test_any_inventory_answer_gives_offers_or_a_stage_error(answer, cap):
    offers = call(answer, "inventory")
    if isinstance(offers, StageError):
        return
    wanted = Constraints(gpu="RTX 4090", provider="vastai", vram_gb=8, max_price=cap)
    try:
        with within():
            chosen, eligible = select_offer(offers, wanted)
    except NoEligibleOffer as exc:
        assert_one_line(str(exc))
        return
    for offer in eligible:
        assert math.isfinite(offer.price_per_hour) and (cap is None or offer.price_per_hour <= cap)


@PARSER_SETTINGS
@given(answer=answers(session_bodies))
@example(answer=NOISY_ERROR)
@example(answer=DEEP)
def test_any_session_answer_gives_a_session_or_a_stage_error(answer):
    call(answer, "get_session", SESSION["id"])


@PARSER_SETTINGS
@given(answer=answers(sessions_bodies))
def test_any_session_list_gives_sessions_or_a_stage_error(answer):
    call(answer, "list_sessions")


@PARSER_SETTINGS
@given(answer=answers(created_bodies))
def test_any_created_session_answer_gives_a_session_or_a_stage_error(answer):
    request = SessionRequest(consumer_id="c", offer_id="vastai-1", reservation_hours=1)
    created = call(answer, "create_session", request)
    if not isinstance(created, StageError):
        assert created.ssh_private_key not in repr(created)


@PARSER_SETTINGS
@given(answer=answers(template_bodies), cost=answers(cost_bodies), done=answers(st.just({})))
# A cost past what a float holds: float() raised OverflowError.
@example(answer=(200, body_of({"hash_id": "a"})), cost=(200, b'{"total_cost": 1' + b"0" * 400 + b"}"),
         done=(204, b""))
def test_templates_costs_and_releases_give_a_result_or_a_stage_error(answer, cost, done):
    call(answer, "template", "abc")
    figure = call(cost, "session_cost", SESSION["id"])
    assert figure is None or isinstance(figure, StageError) or math.isfinite(figure)
    call(done, "release", SESSION["id"])
    call(done, "destroy", SESSION["id"])
