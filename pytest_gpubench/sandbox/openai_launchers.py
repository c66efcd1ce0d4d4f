"""Stand-ins for the launchers of OpenAI-compatible servers: ``vllm`` and ``llama-server``.

Run as ``python -m pytest_gpubench.sandbox.openai_launchers vllm|llama-server ARGS``
(the instance's wrappers in ``bin/`` do that). Each start is one long-running server,
built on the Ollama stand-in's engine (:mod:`.ollama_engine`: the catalog model's
load time, TTFT, decode rate and batching model) and its OpenAI endpoints
(:mod:`.ollama_openai`); only the launcher's flags, logs, readiness, ``/v1/models``
and failure wording are its own:

``vllm serve MODEL [--port 8000] [--host H] [--served-model-name NAME...]
[--max-num-seqs 256] [--max-model-len N] [--tensor-parallel-size N]
[--gpu-memory-utilization 0.9] [--api-key KEY] ...`` (other flags accepted and ignored)
    Loads first (the catalog's ``load_seconds``, time-scaled), then listens, as
    vLLM's API server does: ``GET /health`` answers 200 once anything answers.
    Requests must name a served model (404 ``The model `x` does not exist.``).
    Out of memory when the weights do not fit ``gpu-memory-utilization`` of the
    GPUs the tensor-parallel group spans.
``llama-server -m FILE|--model FILE [--port 8080] [--host 127.0.0.1] [-c N] [-np N]
[-a ALIAS] [--api-key KEY] ...``
    Listens first; ``GET /health`` is 503 ``{"error": {"code": 503, "message":
    "Loading model", "type": "unavailable_error"}}`` while loading, then 200
    ``{"status": "ok"}``. The catalog model is the file's name without ``.gguf``
    (``/models/qwen2:7b.gguf`` is ``qwen2:7b``); the request's ``model`` is not
    checked, as llama.cpp serves its one model whatever the name. Out of memory
    when weights, KV cache for ``-np`` slots and graph exceed the GPU.

Both: ``--version``; exit 1 with a message for an unknown model or one that does
not fit; stop cleanly on SIGTERM/SIGINT (exit 0), or when the sandbox dies.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .instance_spec import BASELINE_MIB, MIB, InstanceSpec, ModelSpec, load_instance_spec, normalize_model_name
from .lifeline import watch_owner
from .ollama_common import FOREVER
from .ollama_engine import Engine, EngineSettings
from .standin_state import PulledModel, StateStore

VLLM_VERSION = "0.10.1.1"
LLAMA_CPP_BUILD = "6188 (21c17b5b)"
#: What each launcher's process calls itself in messages.
PROGRAMS = ("vllm", "llama-server")


class LaunchError(Exception):
    """A launcher that cannot start: the message is printed and the exit status is 1."""


@dataclass(frozen=True)
class Launch:
    """One launcher's parsed command line."""

    program: str
    model: str  # the catalog name of the model
    served_names: tuple[str, ...]
    host: str
    port: int
    parallel: int
    tensor_parallel: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    model_arg: str = ""  # as given (vLLM's repo id or path, llama.cpp's file)
    #: ``--api-key``: requests to ``/v1/*`` need ``Authorization: Bearer KEY`` (401 otherwise), as both servers do.
    api_key: str | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit 2 with its own usage
        raise LaunchError(f"{self.prog}: error: {message}")


def parse_vllm(argv: Sequence[str]) -> Launch:
    """``vllm serve MODEL ...``: the flags the stand-in acts on; the rest are accepted."""
    parser = _Parser(prog="vllm serve", add_help=False)
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--model")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--api-key")
    args, _ = parser.parse_known_args(list(argv))
    model = args.model_tag or args.model
    if not model:
        raise LaunchError("vllm serve: error: the following arguments are required: model_tag")
    return Launch(
        program="vllm",
        model=model,
        served_names=tuple(args.served_model_name or [model]),
        host=args.host,
        port=args.port,
        parallel=max(1, args.max_num_seqs),
        tensor_parallel=max(1, args.tensor_parallel_size),
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        model_arg=model,
        api_key=args.api_key,
    )


def parse_llama_server(argv: Sequence[str]) -> Launch:
    """``llama-server -m FILE ...``; ``-np`` defaults to 4, what ``-1`` (auto) picks."""
    parser = _Parser(prog="llama-server", add_help=False)
    parser.add_argument("-m", "--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-c", "--ctx-size", type=int)
    parser.add_argument("-np", "--parallel", type=int, default=-1)
    parser.add_argument("-a", "--alias")
    parser.add_argument("--api-key")
    args, _ = parser.parse_known_args(list(argv))
    if not args.model:
        raise LaunchError("error: no model given: use -m FILE or --model FILE")
    name = Path(args.model).name
    name = name[: -len(".gguf")] if name.endswith(".gguf") else name
    return Launch(
        program="llama-server",
        model=name,
        served_names=(args.alias or args.model,),
        host=args.host,
        port=args.port,
        parallel=4 if args.parallel < 1 else args.parallel,
        max_model_len=args.ctx_size,
        model_arg=args.model,
        api_key=args.api_key,
    )


class LauncherEngine(Engine):
    """The Ollama engine with one model, loaded at start, under the launcher's names.

    Nothing is pulled: the model is the launcher's argument. Its names live in memory
    only, so Ollama's model store on the instance is left as it was.
    """

    def __init__(self, spec: InstanceSpec, launch: Launch, model: ModelSpec) -> None:
        settings = dataclasses.replace(
            EngineSettings.from_env(),
            num_parallel=launch.parallel,
            max_queue=1 << 30,  # these servers queue without a limit
            default_keep_alive=FOREVER,
            prune=False,
        )
        super().__init__(spec, StateStore(spec.state_dir), settings)
        self.launch = launch
        self.model_spec = model
        self.key = normalize_model_name(launch.model)
        pulled = PulledModel(name=self.key, size=model.size_bytes, digest=model.digest_hex,
                             modified_at=datetime.now(timezone.utc))
        self.pulled = {self.key: pulled}
        self._served = {normalize_model_name(name) for name in launch.served_names}

    def serves(self, name: str) -> bool:
        """Whether a request's ``model`` reaches this server's model."""
        return self.launch.program == "llama-server" or normalize_model_name(name) in self._served

    def find_pulled(self, name: str) -> tuple[PulledModel, ModelSpec] | None:
        if not self.serves(name):
            return None
        return self.pulled[self.key], self.model_spec

    def vram_bytes(self, model: ModelSpec) -> int:
        if self.launch.program == "vllm":
            # vLLM takes its share of every card of the group up front; the KV cache fills it.
            return int(self._group_bytes() * self.launch.gpu_memory_utilization)
        return super().vram_bytes(model)

    def _group_bytes(self) -> int:
        gpu = self.spec.gpu
        cards = max(1, min(self.launch.tensor_parallel, gpu.count))
        return (gpu.memory_mib - BASELINE_MIB) * MIB * cards

    def check_fits(self) -> None:
        """Raise :class:`LaunchError` with the server's own wording when the model does not fit."""
        model, launch, gpu = self.model_spec, self.launch, self.spec.gpu
        if launch.program == "vllm":
            if launch.tensor_parallel > gpu.count:
                raise LaunchError(
                    f"ValueError: The number of required GPUs exceeds the total number of available GPUs "
                    f"in the placement group. (tensor_parallel_size={launch.tensor_parallel}, GPUs={gpu.count})")
            budget = self.vram_bytes(model)
            weights = model.size_bytes + max(256 * MIB, model.size_bytes // 20)
            if weights > budget:
                raise LaunchError(
                    f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                    f"{(weights - budget) / MIB / 1024:.2f} GiB. GPU 0 has a total capacity of "
                    f"{gpu.memory_mib / 1024:.2f} GiB of which {max(0, budget - model.size_bytes) / MIB / 1024:.2f} "
                    f"GiB is free.")
            return
        needed, available = self.vram_bytes(model), self.available_vram()
        if needed > available:
            raise LaunchError(
                f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {needed / MIB:.2f} MiB on device 0: "
                f"cudaMalloc failed: out of memory\n"
                f"llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
                f"main: exiting due to model loading error")

    async def load(self) -> None:
        """Load the model now, as the launcher does before serving."""
        await self.load_only(self.key, FOREVER)


def find_catalog_model(spec: InstanceSpec, launch: Launch) -> ModelSpec:
    """The catalog entry the launcher's model argument names, or the server's own error."""
    found = spec.find_model(launch.model)
    if found is not None:
        return found[1]
    if launch.program == "vllm":
        raise LaunchError(
            f"OSError: {launch.model_arg} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'")
    raise LaunchError(
        f"gguf_init_from_file: failed to open GGUF file '{launch.model_arg}'\n"
        f"llama_model_load_from_file_impl: failed to load model\n"
        f"main: exiting due to model loading error")


# -- logs --------------------------------------------------------------------


def _vllm_log(message: str) -> None:
    stamp = datetime.now().strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} [api_server.py] {message}", file=sys.stderr, flush=True)


def _llama_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- HTTP -----------------------------------------------------------------------


def create_app(engine: LauncherEngine, ready: asyncio.Event) -> Any:
    """The aiohttp application: the stand-in's OpenAI handlers behind the launcher's checks."""
    from aiohttp import web

    from .ollama_http import ENGINE, json_response, read_json
    from .ollama_openai import handle_chat_completions, handle_completions

    launch = engine.launch

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
            if launch.program == "vllm" and isinstance(name, str) and not engine.serves(name):
                return json_response({"object": "error", "message": f"The model `{name}` does not exist.",
                                      "type": "NotFoundError", "param": None, "code": 404}, 404)
            return await handler(request)
        return handle

    async def models(_: web.Request) -> web.Response:
        created = int(time.time())
        if launch.program == "vllm":
            data = [{"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": launch.model_arg,
                     "parent": None, "max_model_len": launch.max_model_len or 32768} for name in launch.served_names]
        else:
            data = [{"id": launch.served_names[0], "object": "model", "created": created, "owned_by": "llamacpp",
                     "meta": {"n_ctx_train": 32768, "n_params": 0, "size": engine.model_spec.size_bytes}}]
        return json_response({"object": "list", "data": data})

    @web.middleware
    async def authorized(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        # vLLM's and llama-server's --api-key: /v1 needs the bearer token; /health and /version do not.
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
    log = _vllm_log if launch.program == "vllm" else _llama_log
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
            await web.TCPSite(runner, launch.host, launch.port, shutdown_timeout=1.0).start()
        except OSError as exc:
            raise LaunchError(f"error: couldn't bind HTTP server socket, hostname: {launch.host}, "
                              f"port: {launch.port}: {os.strerror(exc.errno or 0)}") from exc

    try:
        if launch.program == "vllm":
            log(f"vLLM API server version {VLLM_VERSION}")
            log(f"non-default args: {{'model': {launch.model_arg!r}, 'port': {launch.port}}}")
            started = loop.time()
            await engine.load()
            log(f"Loading weights took {loop.time() - started:.2f} seconds")
            await listen()
            ready.set()
            log(f"Starting vLLM API server 0 on http://{launch.host}:{launch.port}")
            print(f"INFO:     Started server process [{os.getpid()}]", file=sys.stderr, flush=True)
            print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
        else:
            log(f"build: {LLAMA_CPP_BUILD} with cc (GCC) for x86_64-linux-gnu")
            log(f"main: HTTP server is listening, hostname: {launch.host}, port: {launch.port}, http threads: 4")
            await listen()
            log("main: loading model")
            log(f"srv    load_model: loading model '{launch.model_arg}'")
            await engine.load()
            ready.set()
            log("main: model loaded")
            log(f"main: server is listening on http://{launch.host}:{launch.port} - starting the main loop")
            log("srv  update_slots: all slots are idle")
        await stop.wait()
    finally:
        owner.cancel()
        if launch.program == "vllm":
            print("INFO:     Shutting down", file=sys.stderr, flush=True)
        else:
            log("srv    operator(): operator(): cleaning up before exit...")
        await runner.cleanup()
    return 0


def version_text(program: str) -> tuple[str, str]:
    """``(stdout, stderr)`` of ``PROGRAM --version``."""
    if program == "vllm":
        return f"{VLLM_VERSION}\n", ""
    return "", f"version: {LLAMA_CPP_BUILD}\nbuilt with cc (GCC) for x86_64-linux-gnu\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``openai_launchers PROGRAM ARGS``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in PROGRAMS:
        print(f"usage: python -m {__name__} {{{','.join(PROGRAMS)}}} ARGS...", file=sys.stderr)
        return 2
    program, rest = args[0], args[1:]
    if "--version" in rest or (program == "vllm" and rest[:1] == ["-v"]):
        out, err = version_text(program)
        sys.stdout.write(out)
        sys.stderr.write(err)
        return 0
    try:
        if program == "vllm":
            if rest[:1] != ["serve"]:
                raise LaunchError("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...")
            launch = parse_vllm(rest[1:])
        else:
            launch = parse_llama_server(rest)
        spec = load_instance_spec()
        return asyncio.run(serve(spec, launch))
    except (LaunchError, RuntimeError) as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
