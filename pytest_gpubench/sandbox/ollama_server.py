"""``ollama serve`` of the stand-in: Ollama's native HTTP API and its OpenAI-compatible
endpoints on aiohttp (the only part of the Ollama stand-in that loads aiohttp).

First the HTTP plumbing both kinds of endpoint share, then the OpenAI-compatible
endpoints (``/v1/...``, also served by the OpenAI launchers' stand-ins), then the
server itself.

HTTP plumbing shared by the stand-in's native and OpenAI-compatible endpoints.

``serve_generation`` turns one engine generation into a response: a stream of
chunks written on the engine's schedule, or one object at the end. The wire format
(NDJSON for ``/api/*``, SSE for ``/v1/*``) is a ``ResponseFormat`` supplied by the
caller. Errors found before the first byte become plain HTTP errors, as Ollama's
are; after that they can only be reported in the stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import selectors
import signal
import sys
import time
from collections.abc import Coroutine
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from aiohttp import web

from .instance_spec import InstanceSpec, ModelSpec
from .lifeline import watch_owner
from .ollama_common import (
    LISTEN_BACKLOG,
    OllamaHost,
    Thought,
    bind_host,
    count_prompt_tokens,
    parse_keep_alive,
    rfc3339,
)
from .ollama_engine import Engine, EngineError, EngineSettings, Generation, Job, PullError, log, pull_progress
from .standin_state import RuntimeState, StateStore, record_request, record_served

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


# ----------------------------------------------------------------------
#
# The OpenAI-compatible endpoints of the Ollama stand-in (``/v1/...``).
#
# As in Ollama: ``POST /v1/chat/completions`` and ``POST /v1/completions`` with
# ``stream: true`` answer Server-Sent Events (``data: {chunk}`` per token, a final
# chunk with ``finish_reason``, an optional usage chunk when
# ``stream_options.include_usage`` is set, then ``data: [DONE]``); without it one
# ``chat.completion`` / ``text_completion`` object with ``usage``. Errors use
# OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
#
# A thinking model's reasoning streams as Ollama's ``openai`` package writes it:
# ``delta.reasoning`` (``message.reasoning`` when not streamed) on the chat
# endpoint, with an empty ``content``; the text completion endpoint has no field
# for it and streams empty ``text`` while the model thinks. ``reasoning_effort``
# (or ``reasoning.effort``) sets ``think``: ``"none"`` turns it off, a level turns
# it on, absent leaves the model's default.


SSE = "text/event-stream"


def openai_error(message: str, status: int) -> web.Response:
    """Ollama's mapping of status codes to OpenAI error types."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    return json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


class OpenAIFormat:
    """SSE chunks and whole answers of the chat or text completion endpoints."""

    content_type = SSE

    def __init__(self, model: str, chat: bool, include_usage: bool) -> None:
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{random.randint(0, 999)}"
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        thought = isinstance(text, Thought)
        if self.chat:
            delta = {"role": "assistant", "content": "", "reasoning": text} if thought else {
                "role": "assistant", "content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"text": "" if thought else text, "index": 0, "finish_reason": finish}
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_ollama",
            "choices": [choice],
        }

    @staticmethod
    def _event(data: Any) -> bytes:
        return f"data: {dumps(data)}\n\n".encode()

    @staticmethod
    def _usage(gen: Generation) -> dict[str, int]:
        prompt, completion = gen.job.prompt_eval_count, gen.emitted
        # vLLM's (and SGLang's) count of the prompt tokens its prefix cache served.
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": gen.job.cached_tokens}}

    def token(self, text: str) -> bytes:
        return self._event(self._chunk(text, None))

    def done(self, gen: Generation, now: float) -> bytes:
        out = self._event(self._chunk("", gen.done_reason))
        if self.include_usage:
            usage = {**self._chunk("", None), "choices": [], "usage": self._usage(gen)}
            out += self._event(usage)
        return out + b"data: [DONE]\n\n"

    def whole(self, text: str, gen: Generation, now: float, thinking: str = "") -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": text}
            if thinking:
                message["reasoning"] = thinking
            choice = {"index": 0, "message": message, "finish_reason": gen.done_reason}
            kind = "chat.completion"
        else:
            choice = {"text": text, "index": 0, "finish_reason": gen.done_reason}
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_ollama",
            "choices": [choice],
            "usage": self._usage(gen),
        }

    def stream_error(self, message: str) -> bytes:
        return self._event({"error": {"message": message, "type": "api_error", "param": None, "code": None}})

    def error(self, message: str, status: int) -> web.Response:
        return openai_error(message, status)


def _think(body: dict[str, Any]) -> bool | str | None:
    """``think`` from ``reasoning.effort`` or ``reasoning_effort``, as Ollama maps them."""
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else body.get("reasoning_effort")
    if effort is None or effort == "":
        return None
    mapped = {"none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high", "max": "max",
              "xhigh": "max", "ultra": "max"}
    if not isinstance(effort, str) or effort not in mapped:
        raise BadRequest(f'invalid reasoning value: {dumps(effort)} (must be "minimal", "low", "medium", '
                         '"high", "xhigh", "ultra", "max", or "none")')
    return mapped[effort]


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("max_tokens must be an integer")
    return value


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    arrived, received_at = asyncio.get_running_loop().time(), time.time()
    engine = request.app[ENGINE]
    try:
        body = await read_json(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model is required")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("[] is too short - 'messages'")
            contents = [str(m.get("content") or "") if isinstance(m, dict) else "" for m in messages]
            prompt = "\n".join(contents)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise BadRequest("invalid type for 'prompt' field: only string is supported")
        options = body.get("stream_options") or {}
        fmt = OpenAIFormat(model, chat, include_usage=bool(isinstance(options, dict) and options.get("include_usage")))
        job = Job(
            model=model,
            prompt=prompt,
            prompt_eval_count=count_prompt_tokens(prompt),
            num_predict=_max_tokens(body),
            keep_alive=engine.settings.default_keep_alive,
            arrived=arrived,
            # /v1/completions has no reasoning field: the model's default applies there.
            think=resolve_think(engine, model, _think(body) if chat else None),
        )
        record_request(engine.store.state_dir, received_at, request.path, body,
                       prompt_tokens=job.prompt_eval_count)
    except EngineError as exc:
        return openai_error(str(exc), exc.status)
    return await serve_generation(request, job, fmt, stream=body.get("stream") is True)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def handle_models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    data = [
        {"id": m.name, "object": "model", "created": int(m.modified_at.timestamp()), "owned_by": "library"}
        for m in engine.pulled.values()
    ]
    return json_response({"object": "list", "data": data})


def add_openai_routes(app: web.Application) -> None:
    """Register the ``/v1`` endpoints on the stand-in's application."""
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_get("/v1/models", handle_models)


# ----------------------------------------------------------------------
#
# ``ollama serve`` of the stand-in: Ollama's native HTTP API on aiohttp.
#
# Endpoints, shapes, status codes and error wordings follow Ollama's ``docs/api.md``
# and its server's visible behaviour (0.5.x): see ``ollama_standin`` for the list.


NDJSON = "application/x-ndjson"


def model_details(model: ModelSpec) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": model.family,
        "families": [model.family],
        "parameter_size": model.parameter_size,
        "quantization_level": model.quantization_level,
    }


def _model_name(body: dict[str, Any]) -> str:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("model is required")
    return name


def _not_found(name: str) -> web.Response:
    # /api/show and /api/delete quote the name with single quotes.
    return error_response(f"model '{name}' not found", 404)


# -- native generation formats -------------------------------------------------


class NativeFormat:
    """NDJSON chunks of ``/api/generate`` (``response``) or ``/api/chat`` (``message``).

    Reasoning goes in ``thinking`` (``message.thinking``) beside an empty answer,
    compact as Go writes it: ``{..,"response":"","thinking":"Okay","done":false}``.
    """

    content_type = NDJSON

    def __init__(self, model: str, chat: bool) -> None:
        self.model = model
        self.chat = chat
        self._head = '{"model":' + dumps(model) + ',"created_at":"'

    def _content(self, text: str) -> str:
        if isinstance(text, Thought):
            if self.chat:
                return '"message":{"role":"assistant","content":"","thinking":' + dumps(text) + "}"
            return '"response":"","thinking":' + dumps(text)
        if self.chat:
            return '"message":{"role":"assistant","content":' + dumps(text) + "}"
        return '"response":' + dumps(text)

    def token(self, text: str) -> bytes:
        return (self._head + rfc3339() + '",' + self._content(text) + ',"done":false}\n').encode()

    def _final(self, text: str, gen: Generation, now: float, thinking: str = "") -> dict[str, Any]:
        final: dict[str, Any] = {"model": self.model, "created_at": rfc3339()}
        if self.chat:
            final["message"] = {"role": "assistant", "content": text}
            if thinking:
                final["message"]["thinking"] = thinking
        else:
            final["response"] = text
            if thinking:
                final["thinking"] = thinking
        final.update(done=True, done_reason=gen.done_reason, **gen.stats(now))
        return final

    def done(self, gen: Generation, now: float) -> bytes:
        return (dumps(self._final("", gen, now)) + "\n").encode()

    def whole(self, text: str, gen: Generation, now: float, thinking: str = "") -> dict[str, Any]:
        return self._final(text, gen, now, thinking)

    def stream_error(self, message: str) -> bytes:
        return (dumps({"error": message}) + "\n").encode()

    def error(self, message: str, status: int) -> web.Response:
        return error_response(message, status)


async def _load_or_unload(request: web.Request, name: str, keep_alive: float, chat: bool) -> web.Response:
    """An empty prompt (or message list) loads the model, or unloads it with keep_alive 0."""
    engine = request.app[ENGINE]
    if keep_alive == 0:
        if engine.find_pulled(name) is None:
            return error_response(f'model "{name}" not found, try pulling it first', 404)
        engine.unload(name)
        reason = "unload"
    else:
        await engine.load_only(name, keep_alive)
        reason = "load"
    answer: dict[str, Any] = {"model": name, "created_at": rfc3339()}
    answer["message" if chat else "response"] = {"role": "assistant", "content": ""} if chat else ""
    answer.update(done_reason=reason, done=True)
    return json_response(answer)


async def handle_generate(request: web.Request) -> web.StreamResponse:
    arrived, received_at = asyncio.get_running_loop().time(), time.time()
    engine = request.app[ENGINE]
    body = await read_json(request)
    name = _model_name(body)
    keep_alive = _keep_alive(body, engine)
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string")
    if not prompt:
        return await _load_or_unload(request, name, keep_alive, chat=False)
    system = body.get("system") if isinstance(body.get("system"), str) else ""
    job = Job(
        model=name,
        prompt=prompt,
        prompt_eval_count=count_prompt_tokens(f"{system} {prompt}"),
        num_predict=option_int(body.get("options"), "num_predict"),
        keep_alive=keep_alive,
        arrived=arrived,
        think=resolve_think(engine, name, body.get("think")),
        context=system,
    )
    record_request(engine.store.state_dir, received_at, request.path, body, prompt_tokens=job.prompt_eval_count)
    return await serve_generation(request, job, NativeFormat(name, chat=False), stream=body.get("stream") is not False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    arrived, received_at = asyncio.get_running_loop().time(), time.time()
    engine = request.app[ENGINE]
    body = await read_json(request)
    name = _model_name(body)
    keep_alive = _keep_alive(body, engine)
    messages = body.get("messages") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a list of objects")
    if not messages:
        return await _load_or_unload(request, name, keep_alive, chat=True)
    contents = [str(m.get("content") or "") for m in messages]
    job = Job(
        model=name,
        prompt="\n".join(contents),
        prompt_eval_count=count_prompt_tokens(" ".join(contents)),
        num_predict=option_int(body.get("options"), "num_predict"),
        keep_alive=keep_alive,
        arrived=arrived,
        think=resolve_think(engine, name, body.get("think")),
    )
    record_request(engine.store.state_dir, received_at, request.path, body, prompt_tokens=job.prompt_eval_count)
    return await serve_generation(request, job, NativeFormat(name, chat=True), stream=body.get("stream") is not False)


def _keep_alive(body: dict[str, Any], engine: Engine) -> float:
    try:
        return parse_keep_alive(body.get("keep_alive"), engine.settings.default_keep_alive)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


# -- model management ------------------------------------------------------------


async def handle_pull(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await read_json(request)
    name = _model_name(body)
    progress = pull_progress(engine, name)
    if body.get("stream") is False:
        last: dict[str, Any] = {}
        try:
            async for update in progress:
                last = update
        except PullError as exc:
            return error_response(str(exc), 500)
        return json_response(last)
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    try:
        async for update in progress:
            await response.write((dumps(update) + "\n").encode())
    except PullError as exc:
        await response.write((dumps({"error": str(exc)}) + "\n").encode())
    await response.write_eof()
    return response


async def handle_tags(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    models = []
    for pulled in sorted(engine.pulled.values(), key=lambda m: m.modified_at, reverse=True):
        found = engine.spec.find_model(pulled.name)
        if found is None:
            continue
        models.append(
            {
                "name": pulled.name,
                "model": pulled.name,
                "modified_at": rfc3339(pulled.modified_at),
                "size": pulled.size,
                "digest": pulled.digest,
                "details": model_details(found[1]),
            }
        )
    return json_response({"models": models})


async def handle_ps(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    forever = datetime.now(timezone.utc) + timedelta(days=292 * 365)
    models = []
    for loaded in engine.loaded_models():
        found = engine.spec.find_model(loaded.name)
        if found is None:
            continue
        models.append(
            {
                "name": loaded.name,
                "model": loaded.name,
                "size": loaded.size,
                "digest": loaded.digest,
                "details": model_details(found[1]),
                "expires_at": rfc3339(loaded.expires_at or forever),
                "size_vram": loaded.size_vram,
            }
        )
    return json_response({"models": models})


async def handle_show(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    name = _model_name(await read_json(request))
    found = engine.find_pulled(name)
    if found is None:
        return _not_found(name)
    pulled, model = found
    parameters = float(model.parameter_size.rstrip("BbMm") or 0) * (1e9 if model.parameter_size[-1:] in "Bb" else 1e6)
    return json_response(
        {
            "license": "Emulated model: no weights, no license.",
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {pulled.name}\nTEMPLATE "{{{{ .Prompt }}}}"\n',
            "parameters": 'stop                           "<|im_end|>"',
            "template": "{{ .Prompt }}",
            "details": model_details(model),
            "model_info": {
                "general.architecture": model.family,
                "general.file_type": 2,
                "general.parameter_count": int(parameters),
                "general.quantization_version": 2,
                f"{model.family}.context_length": 32768,
            },
            "modified_at": rfc3339(pulled.modified_at),
        }
    )


async def handle_delete(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    name = _model_name(await read_json(request))
    if not engine.delete(name):
        return _not_found(name)
    return web.Response(status=200)


async def handle_root(_: web.Request) -> web.Response:
    return web.Response(text="Ollama is running", content_type="text/plain")


async def handle_version(request: web.Request) -> web.Response:
    return json_response({"version": request.app[ENGINE].spec.ollama.version})


# -- application --------------------------------------------------------------


@web.middleware
async def _errors_and_log(request: web.Request, handler: Any) -> web.StreamResponse:
    """Ollama-like errors for bad requests and unknown routes, and a GIN-like log line."""
    started = time.perf_counter()
    try:
        response = await handler(request)
    except EngineError as exc:
        response = error_response(str(exc), exc.status)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        response = web.Response(status=404, text="404 page not found", content_type="text/plain")
    elapsed = (time.perf_counter() - started) * 1e3
    log.info(
        "[GIN] %s | %3d | %10.3fms | %15s | %-7s %s",
        datetime.now().strftime("%Y/%m/%d - %H:%M:%S"),
        response.status,
        elapsed,
        request.remote or "",
        request.method,
        f'"{request.path}"',
    )
    return response


def create_app(engine: Engine) -> web.Application:
    """The aiohttp application of one stand-in server."""
    app = web.Application(middlewares=[_errors_and_log], client_max_size=64 * 1024 * 1024)
    app[ENGINE] = engine
    app.router.add_get("/", handle_root)
    app.router.add_get("/api/version", handle_version)
    app.router.add_post("/api/pull", handle_pull)
    app.router.add_get("/api/tags", handle_tags)
    app.router.add_get("/api/ps", handle_ps)
    app.router.add_post("/api/show", handle_show)
    app.router.add_delete("/api/delete", handle_delete)
    app.router.add_post("/api/generate", handle_generate)
    app.router.add_post("/api/chat", handle_chat)
    add_openai_routes(app)
    return app


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter('time=%(asctime)s level=%(levelname)s source=standin msg="%(message)s"', "%Y-%m-%dT%H:%M:%S")
    )
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def run_with_fine_timers(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on an event loop whose timers fire to the microsecond.

    The default selector (epoll) rounds every timeout up to a whole millisecond, so
    each token would leave up to 1 ms after its scheduled time and every TTFT would
    read ~0.5 ms long; ``select()`` takes microseconds. Its limit of 1,024 file
    descriptors is far beyond what one stand-in serves. Python 3.10 has no loop
    factory for ``asyncio.run`` and keeps the default loop.

    Only with ``GPUBENCH_SANDBOX_FINE_TIMERS=1`` (``bench/fidelity.py`` sets it): a
    stand-in died mid-stream once in CI while running on this loop, cause unknown
    (``select()``, unlike epoll, fails the whole loop on a descriptor closed while
    registered), so the sandbox keeps the default loop, whose lateness the
    generation's learned wake-up latency compensates anyway.
    """
    if sys.version_info < (3, 11):
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())) as runner:
        return runner.run(main)


async def serve(spec: InstanceSpec, host: OllamaHost, settings: EngineSettings) -> int:
    """Serve until SIGTERM or SIGINT; returns the process exit status."""
    _configure_logging()
    store = StateStore(spec.state_dir)
    engine = Engine(spec, store, settings)
    runner = web.AppRunner(create_app(engine), access_log=None)
    await runner.setup()
    address = bind_host(host)
    site = web.TCPSite(runner, address, host.port, shutdown_timeout=1.0, backlog=LISTEN_BACKLOG)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        print(f"Error: listen tcp {address}:{host.port}: bind: {reason}", file=sys.stderr)
        return 1
    pid = os.getpid()
    store.write_pid(pid)
    # After the bind, as Ollama: a second `ollama serve` that cannot listen prunes nothing.
    if settings.prune and engine.downloads.prune():
        log.info("pruned unfinished downloads")
    engine.flush()
    log.info("Listening on %s:%d (version %s)", address, host.port, spec.ollama.version)
    log.info(
        "sandbox GPU %s x%d, OLLAMA_NUM_PARALLEL=%d",
        spec.gpu.name,
        spec.gpu.count,
        settings.num_parallel,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Daemonized by `nohup ... &`: no death signal reaches it, so it watches the sandbox.
    owner = asyncio.create_task(watch_owner(stop.set))
    await stop.wait()
    owner.cancel()
    log.info("shutting down: %s", engine.lag.summary())
    await runner.cleanup()
    store.write_runtime(RuntimeState(idle_since=time.time()))
    store.remove_pid(pid)
    return 0
