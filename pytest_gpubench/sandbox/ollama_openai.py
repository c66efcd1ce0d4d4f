"""The OpenAI-compatible endpoints of the Ollama stand-in (``/v1/...``).

As in Ollama: ``POST /v1/chat/completions`` and ``POST /v1/completions`` with
``stream: true`` answer Server-Sent Events (``data: {chunk}`` per token, a final
chunk with ``finish_reason``, an optional usage chunk when
``stream_options.include_usage`` is set, then ``data: [DONE]``); without it one
``chat.completion`` / ``text_completion`` object with ``usage``. Errors use
OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.

A thinking model's reasoning streams as Ollama's ``openai`` package writes it:
``delta.reasoning`` (``message.reasoning`` when not streamed) on the chat
endpoint, with an empty ``content``; the text completion endpoint has no field
for it and streams empty ``text`` while the model thinks. ``reasoning_effort``
(or ``reasoning.effort``) sets ``think``: ``"none"`` turns it off, a level turns
it on, absent leaves the model's default.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from aiohttp import web

from .ollama_common import Thought, count_prompt_tokens
from .ollama_engine import EngineError, Generation, Job
from .ollama_http import ENGINE, BadRequest, dumps, json_response, read_json, resolve_think, serve_generation

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
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

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
    arrived = asyncio.get_running_loop().time()
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
