"""HTTP plumbing shared by the stand-in's native and OpenAI-compatible endpoints.

``serve_generation`` turns one engine generation into a response: a stream of
chunks written on the engine's schedule, or one object at the end. The wire format
(NDJSON for ``/api/*``, SSE for ``/v1/*``) is a ``ResponseFormat`` supplied by the
caller. Errors found before the first byte become plain HTTP errors, as Ollama's
are; after that they can only be reported in the stream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from aiohttp import web

from .ollama_common import Thought
from .ollama_engine import Engine, EngineError, Generation, Job
from .served import record_served

ENGINE = web.AppKey("engine", Engine)


class BadRequest(EngineError):
    status = 400


def dumps(data: Any) -> str:
    """Compact JSON, as Go's encoder writes it."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(data), status=status, content_type="application/json", charset="utf-8")


def error_response(message: str, status: int) -> web.Response:
    """Ollama's native error shape: ``{"error": "..."}``."""
    return json_response({"error": message}, status)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or ``BadRequest`` with Ollama-like wording."""
    raw = await request.read()
    if not raw.strip():
        raise BadRequest("missing request body")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid character in request body: {exc.msg}") from exc
    if not isinstance(body, dict):
        raise BadRequest("json: cannot unmarshal non-object into request")
    return body


def option_int(options: Any, name: str) -> int | None:
    """An integer model option such as ``num_predict``, or None when absent."""
    if not isinstance(options, dict) or options.get(name) is None:
        return None
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"option {name!r} must be a number")
    return int(value)


THINK_LEVELS = ("high", "medium", "low", "max")


def resolve_think(engine: Engine, model: str, think: Any) -> bool:
    """Whether ``model`` reasons on this request, as Ollama (0.12.4 and later) decides.

    ``think`` is the request's value: absent (``None``) means the model's default,
    which is to think for a thinking-capable model; ``false`` turns it off; ``true``
    or a level (``"low"`` ...) asks for it, and a model without the capability
    answers 400 ``"<model>" does not support thinking``. A model that is not pulled
    is left to the engine's 404.
    """
    if think is not None and not isinstance(think, bool):
        if not isinstance(think, str):
            raise BadRequest('think must be a boolean or string ("high", "medium", "low", "max", true, or false)')
        if think not in THINK_LEVELS:
            raise BadRequest(f'invalid think value: {dumps(think)} '
                             '(must be "high", "medium", "low", "max", true, or false)')
    found = engine.find_pulled(model)
    if found is None:
        return False
    if found[1].thinking:
        return think is not False
    if think is not None and think is not False:
        raise BadRequest(f"{dumps(model)} does not support thinking")
    return False


def split_thinking(tokens: list[str]) -> tuple[str, str]:
    """``(thinking, answer)`` texts of a whole (non-streamed) generation."""
    thinking = "".join(t for t in tokens if isinstance(t, Thought))
    return thinking, "".join(t for t in tokens if not isinstance(t, Thought))


class ResponseFormat(Protocol):
    """How one API family writes a generation."""

    content_type: str

    def token(self, text: str) -> bytes:
        """One streamed chunk carrying ``text`` (reasoning when it is a ``Thought``)."""

    def done(self, gen: Generation, now: float) -> bytes:
        """The closing bytes of a stream (final chunk, terminator)."""

    def whole(self, text: str, gen: Generation, now: float, thinking: str = "") -> Any:
        """The single object of a non-streamed answer (``thinking``: its reasoning, if any)."""

    def stream_error(self, message: str) -> bytes:
        """An error reported inside an already started stream."""

    def error(self, message: str, status: int) -> web.Response:
        """An error answered before anything was streamed."""


async def serve_generation(request: web.Request, job: Job, fmt: ResponseFormat, *, stream: bool) -> web.StreamResponse:
    """Run ``job`` on the engine and write it to the client in ``fmt``."""
    engine = request.app[ENGINE]
    loop = asyncio.get_running_loop()
    response: web.StreamResponse | None = None
    try:
        async with engine.generation(job) as gen:
            def client_gone() -> bool:
                transport = request.transport
                return transport is None or transport.is_closing()

            if not stream:
                thinking, text = split_thinking([token async for token in gen.tokens(client_gone)])
                if not client_gone():
                    record_served(engine.store.state_dir, "whole", job.model)
                return json_response(fmt.whole(text, gen, loop.time(), thinking))
            response = web.StreamResponse(headers={"Content-Type": fmt.content_type})
            await response.prepare(request)
            async for token in gen.tokens(client_gone):
                await response.write(fmt.token(token))
            await response.write(fmt.done(gen, loop.time()))
            await response.write_eof()
            if not client_gone():  # a stream the client gave up on (a stall) was not served
                record_served(engine.store.state_dir, "stream", job.model)
            return response
    except EngineError as exc:
        if response is None:
            return fmt.error(str(exc), exc.status)
        await _write_quietly(response, fmt.stream_error(str(exc)))
        return response
    except ConnectionResetError:
        # The client went away: the engine has released the slot on the way out.
        if response is None:
            raise
        return response


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except ConnectionResetError:
        pass
