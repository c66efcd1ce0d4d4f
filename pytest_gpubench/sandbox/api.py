"""The emulated GPU Shopper REST API (aiohttp), plus the sandbox's own ``/sandbox/`` calls.

Routes, status codes and bodies follow the server's gin handlers
(``internal/api/handlers.go``, ``benchmark_handlers.go``); error bodies are
``{"error": ..., "request_id": ...}`` with extra keys where the server adds them.
``X-Request-ID`` is honoured when valid and echoed, as the server's middleware does.

Every route, ``/health`` and ``/ready`` included, needs the sandbox's bearer token
(``Authorization: Bearer <token>``, :mod:`.auth`) and answers 401 without it: the API hands
out private keys that run commands as the user running the sandbox. Nothing needs an open
route: the sandbox's own start-up check takes any HTTP answer (a 401 too) as "listening".

Sandbox-only routes (not part of the real API):

``GET /sandbox/state``
    every session with its final status and sandbox details (offer, instance
    directory, Ollama address, cost), counts by status, armed faults, clock, and
    ``bearer_sha256``: how many API requests came with each bearer token, by the
    token's SHA-256 hex digest (``""`` for none; the tokens themselves are not kept);
    ``served_requests``: the streamed generations the instances' stand-ins delivered
    whole (what a load generator sends), in all and per session (:mod:`.standin_state`), to
    check a store's request rows against; ``served_whole_answers``: the non-streamed
    ones (warm-ups, probes).
``GET /sandbox/sessions/{id}/requests``
    the session's request log (:mod:`.standin_state`, "the request log"): every generation
    request its stand-in servers received, oldest first, with its arrival time on the host's
    clock and what was asked; kept after the session stops, until a reset.
``POST /sandbox/faults`` / ``GET`` / ``DELETE``
    arm, list, clear faults (see :mod:`.faults`).
``POST /sandbox/clock`` ``{"advance_seconds": s}``
    move the server's clock forward (billing by the hour, expiry, 12-hour cap) and
    run one lifecycle tick at once.
``POST /sandbox/reset`` ``{"time_scale": s, "catalog": "FILE"}`` (both optional)
    back to a new sandbox's state on the same address: every instance stopped, no
    session, fault, benchmark or bill, the clock unmoved; the time scale and catalog
    file given replace the starting ones (omitted: the ones it started with). Tests
    share one sandbox this way instead of starting one each.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .auth import authorized
from .catalog import CatalogError, format_time, load_catalog, offer_json
from .cloud import ApiFailure, EmulatedCloud, OfferFilter, month_bounds
from .faults import OFFER_FAULTS, SESSION_FAULTS, FaultRequest
from .schemas import (
    CREATE_SESSION_FIELDS,
    EXTEND_SESSION_FIELDS,
    BindError,
    benchmark_json,
    bind,
    cost_analysis,
    parse_benchmark,
)
from .standin_state import read_requests

log = logging.getLogger("pytest_gpubench.sandbox")
CLOUD = web.AppKey("cloud", EmulatedCloud)
TOKEN = web.AppKey("token", str)
_REQUEST_ID = re.compile(r"^[a-zA-Z0-9._-]{1,128}$")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(body: Any) -> str:
    return json.dumps(body, default=lambda v: format_time(v) if isinstance(v, datetime) else str(v))


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


@web.middleware
async def _request_id_and_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    wanted = request.headers.get("X-Request-ID", "")
    request_id = wanted if _REQUEST_ID.match(wanted) else str(uuid.uuid4())
    if request.path.startswith("/api/"):
        _count_bearer(request)
    try:
        if not authorized(request.headers.get("Authorization"), request.app[TOKEN]):
            raise ApiFailure(401, "unauthorized: this sandbox needs its token as Authorization: Bearer "
                                  "(gpubench sandbox prints it; the plugin reads GPUBENCH_API_TOKEN)")
        response = await handler(request)
    except ApiFailure as failure:
        response = _json({**failure.body, "request_id": request_id}, failure.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _json({"error": exc.reason.lower(), "request_id": request_id}, exc.status)
    except Exception:  # the server's recovery middleware: a bug answers 500, not a dropped socket
        log.exception("handler failed: %s %s", request.method, request.path)
        response = _json({"error": "internal server error", "request_id": request_id}, 500)
    response.headers["X-Request-ID"] = request_id
    return response


def _count_bearer(request: web.Request) -> None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    digest = hashlib.sha256(token.strip().encode()).hexdigest() if scheme.lower() == "bearer" else ""
    counts = request.app[CLOUD].bearer_digests
    counts[digest] = counts.get(digest, 0) + 1


def make_app(cloud: EmulatedCloud, token: str) -> web.Application:
    """The aiohttp application serving ``cloud`` to requests that carry ``token``."""
    if not token:
        raise ValueError("the sandbox API needs a token")
    app = web.Application(middlewares=[_request_id_and_errors], client_max_size=1 << 20)
    app[CLOUD] = cloud
    app[TOKEN] = token
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/api/v1/inventory", list_inventory)
    app.router.add_get("/api/v1/inventory/{id}", get_offer)
    app.router.add_post("/api/v1/sessions", create_session)
    app.router.add_get("/api/v1/sessions", list_sessions)
    app.router.add_get("/api/v1/sessions/{id}", get_session)
    app.router.add_post("/api/v1/sessions/{id}/done", session_done)
    app.router.add_post("/api/v1/sessions/{id}/extend", extend_session)
    app.router.add_delete("/api/v1/sessions/{id}", delete_session)
    app.router.add_get("/api/v1/costs", get_costs)
    app.router.add_get("/api/v1/costs/summary", get_cost_summary)
    app.router.add_get("/api/v1/benchmarks", list_benchmarks)
    app.router.add_post("/api/v1/benchmarks", create_benchmark)
    app.router.add_get("/api/v1/benchmarks/{id}", get_benchmark)
    app.router.add_get("/api/v1/templates/{hash_id}", get_template)
    app.router.add_get("/sandbox/state", sandbox_state)
    app.router.add_get("/sandbox/sessions/{id}/requests", session_requests)
    app.router.add_get("/sandbox/faults", list_faults)
    app.router.add_post("/sandbox/faults", add_fault)
    app.router.add_delete("/sandbox/faults", clear_faults)
    app.router.add_post("/sandbox/clock", advance_clock)
    app.router.add_post("/sandbox/reset", reset_sandbox)
    return app


# -- health -------------------------------------------------------------------------


def _ready(cloud: EmulatedCloud) -> bool:
    return asyncio.get_running_loop().time() >= cloud.not_ready_until


async def health(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    ok = _ready(cloud)
    body = {
        "status": "ok" if ok else "unavailable",
        "timestamp": cloud.clock.now(),
        "services": {"lifecycle": "running", "inventory": "ok", "ready": "true" if ok else "false"},
    }
    return _json(body, 200 if ok else 503)


async def ready(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    ok = _ready(cloud)
    return _json({"ready": ok, "timestamp": cloud.clock.now()}, 200 if ok else 503)


# -- inventory ----------------------------------------------------------------------


def _int_param(request: web.Request, name: str, *, positive: bool = False) -> int | None:
    raw = request.query.get(name, "")
    if raw == "":
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise ApiFailure(400, f"invalid {name}: must be a valid integer, got {json.dumps(raw)}") from None
    if positive and value <= 0:
        raise ApiFailure(400, f"invalid {name}: must be positive, got {value}")
    if value < 0:
        raise ApiFailure(400, f"invalid {name}: must be non-negative, got {value}")
    return value


def _float_param(request: web.Request, name: str, *, unit: bool = False) -> float | None:
    raw = request.query.get(name, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiFailure(400, f"invalid {name}: must be a valid number, got {json.dumps(raw)}") from None
    if unit and not 0 <= value <= 1:
        raise ApiFailure(400, f"invalid {name}: must be between 0 and 1, got {_go_float(value)}")
    if value < 0:
        raise ApiFailure(400, f"invalid {name}: must be non-negative, got {_go_float(value)}")
    return value


def _go_float(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value == int(value) else str(value)


async def list_inventory(request: web.Request) -> web.Response:
    q = request.query
    query = OfferFilter(provider=q.get("provider", ""), gpu_type=q.get("gpu_type", ""), location=q.get("location", ""))
    query.min_vram = _int_param(request, "min_vram") or 0
    query.max_price = _float_param(request, "max_price") or 0.0
    query.min_gpu_count = _int_param(request, "gpu_count") or 0
    query.min_gpu_count = _int_param(request, "min_gpu_count") or query.min_gpu_count
    query.min_reliability = _float_param(request, "min_reliability", unit=True) or 0.0
    query.min_availability_confidence = _float_param(request, "min_availability_confidence", unit=True) or 0.0
    query.min_cuda = _float_param(request, "min_cuda") or 0.0
    limit = _int_param(request, "limit", positive=True) or 0
    offset = _int_param(request, "offset") or 0
    cloud = request.app[CLOUD]
    offers = cloud.inventory.list_offers(query, cloud.clock.now())
    total = len(offers)
    page = offers[offset:]
    if limit:
        page = page[:limit]
    return _json({"offers": page, "count": len(page), "total": total})


async def get_offer(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    offer = cloud.inventory.get_offer(request.match_info["id"])
    return _json(offer_json(cloud.catalog, offer, cloud.clock.now()))


# -- sessions -----------------------------------------------------------------------


def _bind(body: bytes, struct: str, fields: list[tuple[str, str, str]]) -> dict[str, Any]:
    try:
        return bind(body, struct, fields)
    except BindError as exc:
        raise ApiFailure(400, str(exc)) from None


async def create_session(request: web.Request) -> web.Response:
    req = _bind(await request.read(), "CreateSessionRequest", CREATE_SESSION_FIELDS)
    record, private_key = await request.app[CLOUD].create_session(req)
    body: dict[str, Any] = {"session": record.response(), "ssh_private_key": private_key}
    if record.retry_count:  # omitempty in the server's response
        body["retries_attempted"] = record.retry_count
    return _json(body, 201)


async def list_sessions(request: web.Request) -> web.Response:
    q = request.query
    limit_raw = q.get("limit", "")
    try:
        limit = int(limit_raw) if limit_raw else 0
    except ValueError:
        raise ApiFailure(400, f'strconv.ParseInt: parsing "{limit_raw}": invalid syntax') from None
    records = request.app[CLOUD].list_sessions(
        q.get("consumer_id", ""), q.get("status", ""), q.get("provider", ""), limit
    )
    return _json({"sessions": [r.response() for r in records], "count": len(records)})


async def get_session(request: web.Request) -> web.Response:
    return _json(request.app[CLOUD].get_session(request.match_info["id"]).response())


async def session_done(request: web.Request) -> web.Response:
    session_id = request.match_info["id"]
    await request.app[CLOUD].signal_done(session_id)
    return _json({"message": "session shutdown initiated", "session_id": session_id})


async def extend_session(request: web.Request) -> web.Response:
    session_id = request.match_info["id"]
    req = _bind(await request.read(), "ExtendSessionRequest", EXTEND_SESSION_FIELDS)
    record = request.app[CLOUD].extend_session(session_id, req["additional_hours"])
    return _json({"message": "session extended", "session_id": session_id, "new_expires_at": record.expires_at})


async def delete_session(request: web.Request) -> web.Response:
    session_id = request.match_info["id"]
    await request.app[CLOUD].destroy_session(session_id)
    return _json({"message": "session destroyed", "session_id": session_id})


# -- costs --------------------------------------------------------------------------


async def get_costs(request: web.Request) -> web.Response:
    cloud, q = request.app[CLOUD], request.query
    session_id = q.get("session_id", "")
    if session_id:
        if session_id not in cloud.sessions:
            raise ApiFailure(404, f"session not found: {session_id[:128]}")
        return _json({"session_id": session_id, "total_cost": cloud.ledger.session_cost(session_id), "currency": "USD"})
    now = cloud.clock.now()
    period = q.get("period", "")
    if period == "daily":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + timedelta(days=1)
    elif period == "monthly":
        start, end = month_bounds(now)
    else:
        start, end = _date_range(q.get("start_date", ""), q.get("end_date", ""), now)
    return _json(cloud.ledger.summary(q.get("consumer_id", ""), start, end))


def _date_range(start_raw: str, end_raw: str, now: datetime) -> tuple[datetime, datetime]:
    def parse(raw: str, name: str) -> datetime:
        try:
            return datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=now.tzinfo)
        except ValueError:
            raise ApiFailure(400, f"invalid {name} format, expected YYYY-MM-DD: {raw}") from None

    if not start_raw and not end_raw:
        return month_bounds(now)
    if not start_raw:
        end = parse(end_raw, "end_date")
        return end.replace(day=1), end
    start = parse(start_raw, "start_date")
    return start, parse(end_raw, "end_date") if end_raw else month_bounds(start)[1]


async def get_cost_summary(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    start, end = month_bounds(cloud.clock.now())
    return _json(cloud.ledger.summary(request.query.get("consumer_id", ""), start, end))


# -- benchmarks ---------------------------------------------------------------------


async def list_benchmarks(request: web.Request) -> web.Response:
    cloud, q = request.app[CLOUD], request.query
    limit_raw = q.get("limit", "")
    try:
        limit = int(limit_raw) if limit_raw else 0
    except ValueError:
        message = f'invalid query parameters: strconv.ParseInt: parsing "{limit_raw}": invalid syntax'
        raise ApiFailure(400, message) from None
    limit = 50 if limit <= 0 else min(limit, 200)
    results = sorted(cloud.benchmarks, key=lambda r: r.timestamp, reverse=True)
    # The server filters by model, else by GPU (a LIKE match), never both.
    if q.get("model"):
        results = [r for r in results if r.model.name == q["model"]]
    elif q.get("gpu"):
        results = [r for r in results if q["gpu"].lower() in r.hardware.gpu_name.lower()]
    results = results[:limit]
    return _json({"benchmarks": [benchmark_json(r) for r in results], "count": len(results)})


async def create_benchmark(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    try:
        result = parse_benchmark(await request.read())
    except BindError as exc:
        raise ApiFailure(400, str(exc)) from None
    stamped = {"id": result.id or str(uuid.uuid4())}
    if "timestamp" not in result.model_fields_set or result.timestamp.year <= 1:  # none, or Go's zero time
        stamped["timestamp"] = cloud.clock.now()
    result = result.model_copy(update=stamped)
    cloud.benchmarks.append(result)
    return _json({"benchmark": benchmark_json(result), "cost_analysis": cost_analysis(result)}, 201)


async def get_benchmark(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    wanted = request.match_info["id"]
    result = next((r for r in cloud.benchmarks if r.id == wanted), None)
    if result is None:
        raise ApiFailure(404, "benchmark not found")
    return _json({"benchmark": benchmark_json(result), "cost_analysis": cost_analysis(result)})


async def get_template(request: web.Request) -> web.Response:
    """The server's ``VastTemplate`` for a catalog template (what its SSH timeout rule reads)."""
    hash_id = request.match_info["hash_id"]
    template = request.app[CLOUD].catalog.template(hash_id)
    if template is None:
        raise ApiFailure(404, "template not found")
    image, sep, tag = template.image.rpartition(":")
    if not sep or "/" in tag:  # no tag (a registry port is not one)
        image, tag = template.image, ""
    return _json({"id": 0, "hash_id": template.hash_id, "name": template.name, "image": image,
                  "tag": tag or "latest", "runtype": "ssh", "use_ssh": True, "ssh_direct": True,
                  "recommended": True})


# -- sandbox only -------------------------------------------------------------------


async def sandbox_state(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    sessions = [r.state(cloud.ledger.session_cost(r.id)) for r in cloud.sessions.values()]
    return _json(
        {
            "sessions": sessions,
            "served_requests": sum(s["served_requests"] for s in sessions),
            "served_whole_answers": sum(s["served_whole_answers"] for s in sessions),
            "counts": cloud.counts(),
            "time_scale": cloud.time_scale,
            "clock": cloud.clock.now(),
            "clock_offset_seconds": cloud.clock.offset,
            "faults": [f.model_dump() for f in cloud.faults.list()],
            "benchmarks": len(cloud.benchmarks),
            "bearer_sha256": dict(cloud.bearer_digests),
        }
    )


async def session_requests(request: web.Request) -> web.Response:
    session_id = request.match_info["id"]
    record = request.app[CLOUD].sessions.get(session_id)
    if record is None:
        raise ApiFailure(404, f"session not found: {session_id[:128]}")
    entries = read_requests(record.instance.request_log) if record.instance is not None else []
    return _json({"session_id": session_id, "requests": entries})


async def list_faults(request: web.Request) -> web.Response:
    return _json({"faults": [f.model_dump() for f in request.app[CLOUD].faults.list()]})


async def add_fault(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    try:
        fault = FaultRequest.model_validate_json(await request.read() or b"null")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiFailure(400, f"invalid fault: {where + ': ' if where else ''}{first['msg']}") from None
    if fault.fault in OFFER_FAULTS:
        assert fault.offer_id is not None
        if cloud.catalog.offer(fault.offer_id) is None:
            raise ApiFailure(404, f"offer not found: {fault.offer_id}")
        return _json({"fault": cloud.faults.add(fault).model_dump()}, 201)
    if fault.fault == "kill_instance":
        assert fault.session_id is not None
        record = await cloud.kill_instance(fault.session_id, silent=fault.silent)
        return _json({"session": record.response()})
    if fault.fault in SESSION_FAULTS:
        return _json(await cloud.instance_fault(fault))
    cloud.not_ready_until = asyncio.get_running_loop().time() + fault.seconds
    return _json({"not_ready_seconds": fault.seconds})


async def clear_faults(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    cloud.not_ready_until = 0.0
    return _json({"cleared": cloud.faults.clear() + cloud.clear_stream_faults()})


async def advance_clock(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    try:
        body = json.loads(await request.read() or b"{}")
        seconds = float(body["advance_seconds"])
        cloud.clock.advance(seconds)
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiFailure(400, f"invalid clock request: {exc}") from None
    cloud.lifecycle_step()
    return _json({"now": cloud.clock.now(), "offset_seconds": cloud.clock.offset})


class ResetRequest(BaseModel):
    """The body of ``POST /sandbox/reset``."""

    model_config = ConfigDict(extra="forbid")

    time_scale: float | None = Field(default=None, ge=0)
    catalog: str | None = None


async def reset_sandbox(request: web.Request) -> web.Response:
    cloud = request.app[CLOUD]
    try:
        wanted = ResetRequest.model_validate_json(await request.read() or b"{}")
        catalog = load_catalog(wanted.catalog) if wanted.catalog else None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiFailure(400, f"invalid reset: {where + ': ' if where else ''}{first['msg']}") from None
    except CatalogError as exc:
        raise ApiFailure(400, f"invalid reset: {exc}") from None
    stopped = await cloud.reset(catalog=catalog, time_scale=wanted.time_scale)
    return _json({"stopped_sessions": stopped, "time_scale": cloud.time_scale})
