"""Cloud GPU Shopper REST API client (httpx.AsyncClient) and its typed models.

Shapes follow CONTRACTS.md, checked against the server's handlers: sessions are
returned unwrapped by ``GET /sessions/{id}`` (seed 000 assumed ``.session``: both
are accepted), ``done`` on a stopped session answers 409, and errors come as
``{"error", "request_id"}`` with ``error_type``/``retry_suggested`` on
provisioning failures.

A session id becomes a key file's name and a segment of later URLs: one the API answers
with must be an id (:mod:`pytest_gpubench.ids`), else the answer is a ``StageError`` at
its stage (``../../admin/users`` never becomes ``DELETE /admin/users``); every id put in
a URL is quoted as one segment too. Messages name the API without its credentials.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..aio import tls_context
from ..errors import ApiError, ApiUnreachable, Stage, StageError
from ..ids import InvalidId, check_id
from ..errors import redact
from .provider import CreatedSession, Offer, Session


class SessionRequest(BaseModel):
    """The body of ``POST /api/v1/sessions``."""

    consumer_id: str
    offer_id: str
    workload_type: str = "interactive"
    reservation_hours: int = Field(ge=1, le=12)
    idle_threshold_minutes: int | None = None
    disk_gb: int | None = None
    template_hash_id: str | None = None
    #: The server's SSH verification timeout (1-30 minutes); None: its own default.
    ssh_timeout_minutes: int | None = Field(default=None, ge=1, le=30)
    #: ``ssh`` or ``entrypoint`` (the image's entrypoint serves ``model_id`` on ``exposed_ports[0]``);
    #: the fields of ``CreateSessionRequest`` in the server's ``internal/api/handlers.go``.
    launch_mode: str | None = None
    docker_image: str | None = None
    model_id: str | None = None
    exposed_ports: list[int] | None = None


class Template(BaseModel):
    """A provider template (``GET /api/v1/templates/{hash_id}``, Vast.ai only)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hash_id: str
    name: str = ""
    image: str = ""
    tag: str = ""


class ShopperClient:
    """Async client for one GPU Shopper server."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: The URL as messages show it: ``user:***@`` (see :func:`~pytest_gpubench.errors.redact`).
        self.where = redact(self.base_url)
        self.timeout = timeout
        # The token lives in the client's headers only: no message or log line shows them.
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport, verify=tls_context()
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, stage: Stage, method: str, path: str, **kwargs: Any) -> Any:
        """One call; every way it can go wrong is a ``StageError`` saying what the API did."""
        call = f"{method} {path}"
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise StageError(
                stage, f"the GPU Shopper API at {self.where} did not answer {call} within "
                f"{self.timeout:g} s ({type(exc).__name__})",
                hint="the server is stuck or overloaded: check its /health and logs, then rerun the cell",
            ) from None
        except httpx.TransportError as exc:
            raise StageError(
                stage, f"{call} to the GPU Shopper API at {self.where} failed: {exc or type(exc).__name__}",
                hint="check that the server is running and reachable, then rerun the cell",
            ) from None
        if response.status_code >= 400:
            raise _api_error(stage, response, call)
        if not response.content:
            return None
        try:
            return response.json()
        except (ValueError, RecursionError):  # RecursionError: JSON nested past the interpreter's limit
            raise StageError(
                stage, f"{call} answered {response.status_code} with invalid JSON: {_snippet(response)}",
                hint=f"{self.where} does not answer like a GPU Shopper API (a proxy or a web page?): "
                "check --gpubench-api / GPUBENCH_API_BASE",
            ) from None

    async def wait_ready(self, attempts: int = 10, interval: float = 1.0) -> None:
        """Check that a server answers; retry through its 503 start-up sweep.

        Raises ``ApiUnreachable`` at once when nothing listens at the URL.
        """
        for attempt in range(attempts):
            try:
                response = await self._http.get("/health")
            except httpx.TransportError as exc:
                raise ApiUnreachable(self.where, type(exc).__name__) from None
            if response.status_code != 503:
                if response.status_code in (401, 403):  # it answers, and wants a token (the sandbox does)
                    raise ApiUnreachable(self.base_url, f"/health answered {response.status_code}: the server "
                                                        "refused the credentials: set GPUBENCH_API_TOKEN to its "
                                                        "token (`gpubench sandbox` prints its own)")
                if response.status_code >= 400:
                    raise ApiUnreachable(self.where, f"/health answered {response.status_code}")
                return
            if attempt < attempts - 1:
                await asyncio.sleep(interval)
        raise ApiUnreachable(self.where, "still starting up (503) after retries")

    async def inventory(self, **filters: Any) -> list[Offer]:
        params = {k: v for k, v in filters.items() if v is not None}
        data = await self._request(Stage.INVENTORY, "GET", "/api/v1/inventory", params=params)
        return _parse_list(Stage.INVENTORY, data, "offers", Offer)

    async def template(self, hash_id: str) -> Template:
        """One template by hash id; a 404 (or a server without templates) is an ``ApiError``."""
        path = f"/api/v1/templates/{quote(hash_id, safe='')}"
        data = await self._request(Stage.PROVISION, "GET", path)
        try:
            return Template.model_validate(data)
        except ValidationError as exc:
            raise StageError(Stage.PROVISION, f"unexpected template answer: {_first(exc)}") from None

    async def create_session(self, request: SessionRequest) -> CreatedSession:
        body = request.model_dump(exclude_none=True)
        data = await self._request(Stage.PROVISION, "POST", "/api/v1/sessions", json=body)
        try:
            created = CreatedSession.model_validate(data)
        except ValidationError as exc:
            raise StageError(Stage.PROVISION, f"unexpected session answer: {_first(exc)}",
                             hint=SHAPE_HINT) from None
        _check_session_id(Stage.PROVISION, created.session.id,
                          "nothing can address it safely: if it holds an instance, end it on the provider's console")
        return created

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        data = await self._request(stage, "GET", _session_path(stage, session_id))
        if isinstance(data, dict) and isinstance(data.get("session"), dict):
            data = data["session"]  # seed 000's wrapped shape
        try:
            session = Session.model_validate(data)
        except ValidationError as exc:
            raise StageError(stage, f"unexpected session answer: {_first(exc)}",
                             hint=SHAPE_HINT) from None
        _check_session_id(stage, session.id)
        return session

    async def list_sessions(self, **filters: Any) -> list[Session]:
        params = {k: v for k, v in filters.items() if v is not None}
        data = await self._request(Stage.CLEANUP, "GET", "/api/v1/sessions", params=params)
        sessions = _parse_list(Stage.CLEANUP, data, "sessions", Session)
        for session in sessions:
            _check_session_id(Stage.CLEANUP, session.id)
        return sessions

    async def release(self, session_id: str) -> bool:
        """Ask the server to shut a session down (``done``); 409 means already done.

        Returns True when this call stopped it, False when it was already stopped.
        """
        try:
            await self._request(Stage.CLEANUP, "POST", _session_path(Stage.CLEANUP, session_id, "done"))
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def destroy(self, session_id: str) -> None:
        """Force-destroy a session (``DELETE``); safe to repeat."""
        try:
            await self._request(Stage.CLEANUP, "DELETE", _session_path(Stage.CLEANUP, session_id))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def session_cost(self, session_id: str) -> float | None:
        """The API's own cost figure (billed by the clock hour; may be 0)."""
        data = await self._request(Stage.CLEANUP, "GET", "/api/v1/costs", params={"session_id": session_id})
        try:
            cost = float(data["total_cost"])
        except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: an integer past a float
            return None
        return cost if math.isfinite(cost) else None

    async def post_benchmark(self, result: dict[str, Any]) -> dict[str, Any]:
        return await self._request(Stage.RESULTS, "POST", "/api/v1/benchmarks", json=result)


def _check_session_id(stage: Stage, session_id: str, hint: str = "") -> None:
    """A session id the API answered with must be an id: it names a key file and later URLs."""
    try:
        check_id(session_id, "session id")
    except InvalidId as exc:
        raise StageError(stage, f"the API answered with {exc}", hint=hint or SHAPE_HINT) from None


def _session_path(stage: Stage, session_id: str, action: str = "") -> str:
    """``/api/v1/sessions/{id}[/action]``: the id checked (a ``StageError`` at ``stage`` otherwise)
    and quoted as one segment, whoever passed it."""
    try:
        check_id(session_id, "session id")
    except InvalidId as exc:
        raise StageError(stage, f"{exc}: not sent to the API") from None
    return f"/api/v1/sessions/{quote(session_id, safe='')}" + (f"/{action}" if action else "")


def _api_error(stage: Stage, response: httpx.Response, call: str = "") -> ApiError:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    status = response.status_code
    if isinstance(body, dict):
        message = _line(body.get("error") or response.reason_phrase or "error")
        if body.get("request_id"):
            message += f" (request_id {_line(body['request_id'], 80)})"
    else:
        # Not the server's own error shape: a proxy, a crash page, a load balancer.
        message = f"{response.reason_phrase or 'error'}; the body is not the API's JSON: {_snippet(response)}"
        body = {}
    retry = bool(body.get("retry_suggested", False))
    if status in (401, 403):
        hint = "the server refused the credentials: set GPUBENCH_API_TOKEN to a valid token"
    elif retry:
        hint = "the server suggests retrying: rerun the cell"
    elif status >= 500:
        hint = "the GPU Shopper server failed: check its logs, then rerun the cell"
    else:
        hint = ""
    return ApiError(
        stage,
        status,
        message,
        error_type=_line(body.get("error_type") or "", 80),
        retry_suggested=retry,
        call=call,
        hint=hint,
    )


def _line(value: Any, limit: int = 500) -> str:
    """A value from the server's answer as message text: one line (line breaks and other control
    characters become spaces) of at most ``limit`` characters. The server's text is data: it must
    not turn an error into many lines, or a megabyte of them."""
    text = " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", " ", str(value)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _snippet(response: httpx.Response) -> str:
    """The start of a body, on one line, for an error message."""
    text = " ".join(response.text.split())
    if not text:
        return "(empty)"
    return repr(text if len(text) <= 80 else text[:77] + "...")


#: Said of any answer that does not have the shape the GPU Shopper server gives.
SHAPE_HINT = "the API's answer does not have the GPU Shopper shape: check that --gpubench-api points at a " \
    "compatible GPU Shopper server"


def _parse_list(stage: Stage, data: Any, key: str, model: type[BaseModel]) -> list[Any]:
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise StageError(stage, f"unexpected answer: no '{key}' list", hint=SHAPE_HINT)
    parsed = []
    for index, item in enumerate(items):
        try:
            parsed.append(model.model_validate(item))
        except ValidationError as exc:
            raise StageError(stage, f"unexpected {key} entry: {index}.{_first(exc)}", hint=SHAPE_HINT) from None
    return parsed


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    return f"{loc}: {err['msg']}"
