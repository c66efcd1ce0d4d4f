"""Stand-ins for the launchers of OpenAI-compatible servers: ``vllm``, ``llama-server``,
SGLang's ``python3 -m sglang.launch_server`` and TGI's ``text-generation-launcher``.

Run as ``python -m pytest_gpubench.sandbox.openai_launchers PROGRAM ARGS`` (the
instance's wrappers in ``bin/``, and the ``sglang`` package on its ``PYTHONPATH``, do
that). Each start is one long-running server, built on the Ollama stand-in's engine
(:mod:`.ollama_engine`: the catalog model's load time, TTFT, decode rate, batching
model and stream faults) and its OpenAI endpoints (:mod:`.ollama_server`); only the
launcher's flags, logs, readiness, ``/v1/models`` and failure wording are its own
(:mod:`.launcher_programs`):

- vLLM, SGLang and TGI load first, then listen: ``GET /health`` answers an empty 200
  once anything answers. llama.cpp listens first; ``GET /health`` is 503
  ``{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}``
  while loading, then 200 ``{"status": "ok"}``.
- vLLM checks a request's ``model`` against its served names (404 ``The model `x`
  does not exist.``); the others serve their one model whatever the name.
- TGI refuses requests over ``--max-concurrent-requests`` with 429 ``Model is
  overloaded``; the others queue without a limit.
- Memory: vLLM, SGLang and TGI take their memory fraction of every card of the
  tensor-parallel group up front and fail (exit 1, the server's words) when the
  weights do not fit it; llama.cpp needs weights, KV cache for ``-np`` slots and graph.
- GPUs: each sees those ``CUDA_VISIBLE_DEVICES`` names (all without it). A
  tensor-parallel size (``-tp``, ``--tp-size``, ``--num-shard``) larger than that is
  refused in the server's words; the group is the first N of them, where nvidia-smi
  shows the model's memory, split evenly; llama.cpp spreads layers over all it sees.
  Tensor parallelism decodes faster by :func:`tensor_parallel_speedup`.
- ``--api-key KEY`` (vLLM, SGLang, llama-server): ``/v1/*`` answers 401 without
  ``Authorization: Bearer KEY``; ``/health`` and vLLM's ``/version`` stay open.

All: ``--version``; exit 1 with a message for an unknown model, one that does not
fit, or a port in use; stop cleanly on SIGTERM/SIGINT (exit 0), or when the sandbox dies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from . import launcher_programs as programs
from .instance_spec import BASELINE_MIB, MIB, InstanceSpec, ModelSpec, load_instance_spec, normalize_model_name
from .launcher_programs import PROGRAMS, VLLM_VERSION, Launch, LaunchError
from .lifeline import watch_owner
from .ollama_common import FOREVER, LISTEN_BACKLOG
from .ollama_engine import Engine, EngineSettings
from .standin_state import PulledModel, StateStore

__all__ = ["LaunchError", "Launch", "LauncherEngine", "PROGRAMS", "main", "serve"]


def tensor_parallel_speedup(size: int) -> float:
    """How much faster a model decodes spread over ``size`` GPUs by tensor parallelism: ``size ** 0.5``.

    At 2 this is 1.41x, within the 1.38-1.47x of output tokens/s that a vLLM benchmark
    measured for 7-8B models on 2x RTX 4090 (TP 2) against one (databasemart.com,
    "vLLM Distributed Inference Optimization", 300 requests): each GPU reads half the
    weights per token, and the all-reduce of every layer over PCIe takes much of the
    gain back. 2.0x at 4 and 2.83x at 8 extend that trend: an estimate, not a measurement.
    """
    return max(1, size) ** 0.5


class LauncherEngine(Engine):
    """The Ollama engine with one model, loaded at start, under the launcher's names.

    Nothing is pulled: the model is the launcher's argument. Its names live in memory
    only, so Ollama's model store on the instance is left as it was.
    """

    def __init__(self, spec: InstanceSpec, launch: Launch, model: ModelSpec) -> None:
        settings = dataclasses.replace(
            EngineSettings.from_env(),
            num_parallel=launch.parallel,
            max_queue=1 << 30,  # these servers queue without a limit (TGI refuses over its cap first)
            default_keep_alive=FOREVER,
            prune=False,
        )
        super().__init__(spec, StateStore(spec.state_dir), settings)
        self.launch = launch
        if launch.tensor_parallel > 1:  # the catalog's rate is one GPU's
            model = model.model_copy(update={
                "tokens_per_second": model.tokens_per_second * tensor_parallel_speedup(launch.tensor_parallel)})
        self.model_spec = model
        self.key = normalize_model_name(launch.model)
        pulled = PulledModel(name=self.key, size=model.size_bytes, digest=model.digest_hex,
                             modified_at=datetime.now(timezone.utc))
        self.pulled = {self.key: pulled}
        self._served = {normalize_model_name(name) for name in launch.served_names}

    def serves(self, name: str) -> bool:
        """Whether a request's ``model`` reaches this server's model."""
        return self.launch.program not in programs.CHECKS_MODEL_NAME or normalize_model_name(name) in self._served

    def find_pulled(self, name: str) -> tuple[PulledModel, ModelSpec] | None:
        if not self.serves(name):
            return None
        return self.pulled[self.key], self.model_spec

    def vram_bytes(self, model: ModelSpec) -> int:
        if self.launch.memory_fraction is not None:
            # The server takes its share of every card of the group up front; the KV cache fills it.
            return int(self._group_bytes() * self.launch.memory_fraction)
        return super().vram_bytes(model)

    def _group_bytes(self) -> int:
        gpu = self.spec.gpu
        return (gpu.memory_mib - BASELINE_MIB) * MIB * len(self.model_gpus())

    def model_gpus(self) -> tuple[int, ...]:
        """The tensor-parallel group, the first GPUs seen; llama.cpp spreads layers over all it sees."""
        if self.launch.program == "llama-server":
            return self.devices
        return self.devices[:max(1, self.launch.tensor_parallel)]

    def check_fits(self) -> None:
        """Raise :class:`LaunchError` with the server's own wording when the model does not fit."""
        model, launch, gpu = self.model_spec, self.launch, self.spec.gpu
        if not self.devices and launch.program != "llama-server":
            raise LaunchError(programs.no_gpu(launch))
        if launch.tensor_parallel > len(self.devices):
            raise LaunchError(programs.too_many_gpus(launch, len(self.devices)))
        if launch.memory_fraction is not None:
            budget = self.vram_bytes(model)
            weights = model.size_bytes + max(256 * MIB, model.size_bytes // 20)
            if weights > budget:
                raise LaunchError(programs.out_of_memory(
                    launch, short_mib=(weights - budget) / MIB, total_mib=gpu.memory_mib,
                    free_mib=max(0, budget - model.size_bytes) / MIB))
            return
        needed, available = self.vram_bytes(model), self.available_vram()
        if needed > available:
            raise LaunchError(programs.out_of_memory(launch, short_mib=needed / MIB, total_mib=gpu.memory_mib,
                                                     free_mib=available / MIB))

    async def load(self) -> None:
        """Load the model now, as the launcher does before serving."""
        await self.load_only(self.key, FOREVER)


def find_catalog_model(spec: InstanceSpec, launch: Launch) -> ModelSpec:
    """The catalog entry the launcher's model argument names, or the server's own error."""
    found = spec.find_model(launch.model)
    if found is None:
        raise LaunchError(programs.unknown_model(launch))
    return found[1]


def _log(launch: Launch, message: str) -> None:
    print(programs.log_line(launch, message), file=sys.stderr, flush=True)


# -- HTTP -----------------------------------------------------------------------


def create_app(engine: LauncherEngine, ready: asyncio.Event) -> Any:
    """The aiohttp application: the stand-in's OpenAI handlers behind the launcher's checks."""
    from aiohttp import web

    from .ollama_server import ENGINE, json_response, read_json
    from .ollama_server import handle_chat_completions, handle_completions

    launch = engine.launch
    in_flight = [0]

    async def health(_: web.Request) -> web.Response:
        if ready.is_set():
            return json_response({"status": "ok"}) if launch.program == "llama-server" else web.Response(status=200)
        return json_response({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503)

    def guarded(handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if not ready.is_set():
                return await health(request)
            body = await read_json(request)  # cached by aiohttp: the handler reads it again
            name = body.get("model")
            if isinstance(name, str) and not engine.serves(name):
                return json_response({"object": "error", "message": f"The model `{name}` does not exist.",
                                      "type": "NotFoundError", "param": None, "code": 404}, 404)
            if launch.program == "text-generation-launcher" and in_flight[0] >= launch.parallel:
                return json_response({"error": "Model is overloaded", "error_type": "overloaded"}, 429)
            in_flight[0] += 1
            try:
                return await handler(request)
            finally:
                in_flight[0] -= 1
        return handle

    async def models(_: web.Request) -> web.Response:
        created = int(time.time())
        if launch.program == "llama-server":
            data = [{"id": launch.served_names[0], "object": "model", "created": created, "owned_by": "llamacpp",
                     "meta": {"n_ctx_train": 32768, "n_params": 0, "size": engine.model_spec.size_bytes}}]
        elif launch.program == "text-generation-launcher":
            data = [{"id": launch.model_arg, "object": "model", "created": created, "owned_by": launch.model_arg}]
        else:
            data = [{"id": name, "object": "model", "created": created, "owned_by": launch.program,
                     "root": launch.model_arg, "parent": None, "max_model_len": launch.max_model_len or 32768}
                    for name in launch.served_names]
        return json_response({"object": "list", "data": data})

    @web.middleware
    async def authorized(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        # vLLM's, SGLang's and llama-server's --api-key: /v1 needs the bearer token; /health and /version do not.
        if launch.api_key and request.path.startswith("/v1") and (
                request.headers.get("Authorization") != f"Bearer {launch.api_key}"):
            return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    async def version(_: web.Request) -> web.Response:
        return json_response({"version": VLLM_VERSION})

    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[authorized])
    app[ENGINE] = engine
    if launch.program == "vllm":
        app.router.add_get("/version", version)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", guarded(handle_chat_completions))
    app.router.add_post("/v1/completions", guarded(handle_completions))
    return app


async def serve(spec: InstanceSpec, launch: Launch) -> int:
    """Load and serve until SIGTERM/SIGINT; the exit status."""
    from aiohttp import web

    model = find_catalog_model(spec, launch)
    engine = LauncherEngine(spec, launch, model)
    engine.check_fits()
    ready = asyncio.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    owner = asyncio.create_task(watch_owner(stop.set))
    runner = web.AppRunner(create_app(engine, ready), access_log=None)
    await runner.setup()

    async def listen() -> None:
        try:
            await web.TCPSite(runner, launch.host, launch.port, shutdown_timeout=1.0, backlog=LISTEN_BACKLOG).start()
        except OSError as exc:
            raise LaunchError(programs.address_in_use(launch, os.strerror(exc.errno or 0))) from exc

    try:
        for line in programs.loading_lines(launch):
            _log(launch, line)
        started = loop.time()
        if launch.program in programs.LOAD_THEN_LISTEN:
            await engine.load()
            await listen()
        else:
            await listen()
            await engine.load()
        ready.set()
        for line in programs.ready_lines(launch, loop.time() - started, os.getpid()):
            _log(launch, line)
        await stop.wait()
    finally:
        owner.cancel()
        _log(launch, programs.stopping_line(launch))
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``openai_launchers [--as NAME] PROGRAM ARGS``; returns the exit status. ``--as NAME``: a runtime
    imitated by ``PROGRAM``'s stand-in under its own name (``RuntimeFacts.sandbox``): only its
    process's command line says NAME."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--as"]:
        args = args[2:]
    if not args or args[0] not in PROGRAMS:
        print(f"usage: python -m {__name__} {{{','.join(PROGRAMS)}}} ARGS...", file=sys.stderr)
        return 2
    program, rest = args[0], args[1:]
    if "--version" in rest or (program == "vllm" and rest[:1] == ["-v"]):
        out, err = programs.version_text(program)
        sys.stdout.write(out)
        sys.stderr.write(err)
        return 0
    try:
        launch = programs.parse(program, rest)
        spec = load_instance_spec()
        return asyncio.run(serve(spec, launch))
    except (LaunchError, RuntimeError) as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
