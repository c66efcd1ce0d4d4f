"""``ollama serve`` of the stand-in: Ollama's native HTTP API on aiohttp.

Endpoints, shapes, status codes and error wordings follow Ollama's ``docs/api.md``
and its server's visible behaviour (0.5.x): see ``ollama_standin`` for the list.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import signal
import sys
import time
from collections.abc import Coroutine
from datetime import datetime, timedelta, timezone
from typing import Any

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
from .ollama_http import (
    ENGINE,
    BadRequest,
    dumps,
    error_response,
    json_response,
    option_int,
    read_json,
    resolve_think,
    serve_generation,
)
from .ollama_openai import add_openai_routes
from .standin_state import RuntimeState, StateStore

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
    arrived = asyncio.get_running_loop().time()
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
    )
    return await serve_generation(request, job, NativeFormat(name, chat=False), stream=body.get("stream") is not False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    arrived = asyncio.get_running_loop().time()
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
