"""The OpenAI-server launchers the sandbox stands in for: their command lines and their own words.

One :func:`parse` per program turns the real command line into a :class:`Launch`
(the flags the stand-in acts on; others are accepted and ignored); the functions
below it say what each server prints: its version, its failure at load (an unknown
model, one that does not fit), its start-up lines. :mod:`.openai_launchers` serves.

``vllm serve MODEL`` (``--port`` 8000, ``--host`` 0.0.0.0, ``--served-model-name``,
``--max-num-seqs`` 256, ``--tensor-parallel-size``/``-tp``, ``--gpu-memory-utilization``
0.9, ``--max-model-len``); ``llama-server -m FILE`` (``--port`` 8080, ``--host``
127.0.0.1, ``-c``, ``-np`` (-1: 4), ``-a/--alias``); ``python3 -m sglang.launch_server
--model-path M`` (``--port`` 30000, ``--host`` 127.0.0.1, ``--served-model-name``,
``--max-running-requests`` (256), ``--tp-size``/``--tp``, ``--mem-fraction-static``
0.88, ``--context-length``); ``text-generation-launcher --model-id M`` (``--port``
3000, ``--hostname`` 0.0.0.0, ``--max-concurrent-requests`` 128, ``--num-shard``,
``--cuda-memory-fraction`` 1.0, ``--max-total-tokens``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.10.1.1"
LLAMA_CPP_BUILD = "6188 (21c17b5b)"
SGLANG_VERSION = "0.5.1"
TGI_VERSION = "3.3.4"
#: The programs, as ``openai_launchers PROGRAM ARGS`` names them.
PROGRAMS = ("vllm", "llama-server", "sglang", "text-generation-launcher")
#: Servers that load first and listen after (nothing answers ``/health`` while loading).
LOAD_THEN_LISTEN = frozenset({"vllm", "sglang", "text-generation-launcher"})
#: Servers that check a request's ``model`` against the names they serve (404 otherwise).
CHECKS_MODEL_NAME = frozenset({"vllm"})


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
    #: The share of each card the server takes up front (None: it takes what the model needs).
    memory_fraction: float | None = 0.9
    model_arg: str = ""  # as given (a repo id or path, llama.cpp's file)
    #: ``--api-key``: requests to ``/v1/*`` need ``Authorization: Bearer KEY`` (401 otherwise), as the servers do.
    api_key: str | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit 2 with its own usage
        raise LaunchError(f"{self.prog}: error: {message}")


def parse_vllm(argv: Sequence[str]) -> Launch:
    """``vllm serve MODEL ...``."""
    if list(argv[:1]) != ["serve"]:
        raise LaunchError("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...")
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
    args, _ = parser.parse_known_args(list(argv[1:]))
    model = args.model_tag or args.model
    if not model:
        raise LaunchError("vllm serve: error: the following arguments are required: model_tag")
    return Launch(program="vllm", model=model, served_names=tuple(args.served_model_name or [model]),
                  host=args.host, port=args.port, parallel=max(1, args.max_num_seqs),
                  tensor_parallel=max(1, args.tensor_parallel_size), max_model_len=args.max_model_len,
                  memory_fraction=args.gpu_memory_utilization, model_arg=model, api_key=args.api_key)


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
    return Launch(program="llama-server", model=name, served_names=(args.alias or args.model,), host=args.host,
                  port=args.port, parallel=4 if args.parallel < 1 else args.parallel, max_model_len=args.ctx_size,
                  memory_fraction=None, model_arg=args.model, api_key=args.api_key)


def parse_sglang(argv: Sequence[str]) -> Launch:
    """``python3 -m sglang.launch_server --model-path M ...``."""
    parser = _Parser(prog="launch_server.py", add_help=False)
    parser.add_argument("--model-path", "--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--max-running-requests", type=int, default=256)
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--mem-fraction-static", type=float, default=0.88)
    parser.add_argument("--context-length", type=int)
    parser.add_argument("--api-key")
    args, _ = parser.parse_known_args(list(argv))
    if not args.model_path:
        raise LaunchError("launch_server.py: error: the following arguments are required: --model-path")
    return Launch(program="sglang", model=args.model_path, served_names=(args.served_model_name or args.model_path,),
                  host=args.host, port=args.port, parallel=max(1, args.max_running_requests),
                  tensor_parallel=max(1, args.tp_size), max_model_len=args.context_length,
                  memory_fraction=args.mem_fraction_static, model_arg=args.model_path, api_key=args.api_key)


def parse_tgi(argv: Sequence[str]) -> Launch:
    """``text-generation-launcher --model-id M ...``."""
    parser = _Parser(prog="text-generation-launcher", add_help=False)
    parser.add_argument("--model-id", default="bigscience/bloom-560m")
    parser.add_argument("--hostname", default="0.0.0.0")
    parser.add_argument("-p", "--port", type=int, default=3000)
    parser.add_argument("--max-concurrent-requests", type=int, default=128)
    parser.add_argument("--num-shard", type=int, default=1)
    parser.add_argument("--cuda-memory-fraction", type=float, default=1.0)
    parser.add_argument("--max-total-tokens", type=int)
    args, _ = parser.parse_known_args(list(argv))
    return Launch(program="text-generation-launcher", model=args.model_id, served_names=(args.model_id,),
                  host=args.hostname, port=args.port, parallel=max(1, args.max_concurrent_requests),
                  tensor_parallel=max(1, args.num_shard), max_model_len=args.max_total_tokens,
                  memory_fraction=args.cuda_memory_fraction, model_arg=args.model_id)


PARSERS: dict[str, Callable[[Sequence[str]], Launch]] = {
    "vllm": parse_vllm, "llama-server": parse_llama_server, "sglang": parse_sglang,
    "text-generation-launcher": parse_tgi,
}


def parse(program: str, argv: Sequence[str]) -> Launch:
    """The launch ``program ARGV`` asks for, or its own usage error."""
    return PARSERS[program](argv)


def version_text(program: str) -> tuple[str, str]:
    """``(stdout, stderr)`` of ``PROGRAM --version`` (SGLang's is ``sglang.__version__``)."""
    if program == "vllm":
        return f"{VLLM_VERSION}\n", ""
    if program == "sglang":
        return f"{SGLANG_VERSION}\n", ""
    if program == "text-generation-launcher":
        return f"text-generation-launcher {TGI_VERSION}\n", ""
    return "", f"version: {LLAMA_CPP_BUILD}\nbuilt with cc (GCC) for x86_64-linux-gnu\n"


# -- failures at load, in each server's words --------------------------------


def unknown_model(launch: Launch) -> str:
    """What the server prints before exiting 1 when its model does not exist."""
    if launch.program in ("vllm", "sglang"):
        return (f"OSError: {launch.model_arg} is not a local folder and is not a valid model identifier listed on "
                "'https://huggingface.co/models'")
    if launch.program == "text-generation-launcher":
        return (f"huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url: "
                f"https://huggingface.co/api/models/{launch.model_arg}\nError: DownloadError")
    return (f"gguf_init_from_file: failed to open GGUF file '{launch.model_arg}'\n"
            f"llama_model_load_from_file_impl: failed to load model\n"
            f"main: exiting due to model loading error")


def too_many_gpus(launch: Launch, gpus: int) -> str:
    """The error of a tensor-parallel group larger than the machine."""
    if launch.program == "text-generation-launcher":
        return f"Error: `num_shard` ({launch.tensor_parallel}) is greater than the number of GPUs ({gpus})"
    if launch.program == "sglang":
        return f"RuntimeError: --tp-size {launch.tensor_parallel} is larger than the number of GPUs ({gpus})"
    return (f"ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement "
            f"group. (tensor_parallel_size={launch.tensor_parallel}, GPUs={gpus})")


def no_gpu(launch: Launch) -> str:
    """The error of a server that sees no GPU (``CUDA_VISIBLE_DEVICES`` names none of the machine's)."""
    return "RuntimeError: No CUDA GPUs are available"


def out_of_memory(launch: Launch, *, short_mib: float, total_mib: int, free_mib: float) -> str:
    """What the server prints before exiting 1 when the model does not fit."""
    torch_oom = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {short_mib / 1024:.2f} GiB. "
                 f"GPU 0 has a total capacity of {total_mib / 1024:.2f} GiB of which {free_mib / 1024:.2f} GiB is free.")
    if launch.program == "vllm":
        return torch_oom
    if launch.program == "sglang":
        return "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    if launch.program == "text-generation-launcher":
        return f"{torch_oom}\nError: ShardCannotStart"
    return (f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {short_mib:.2f} MiB on device 0: "
            f"cudaMalloc failed: out of memory\n"
            f"llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
            f"main: exiting due to model loading error")


def address_in_use(launch: Launch, reason: str) -> str:
    """The error of a port another process holds."""
    if launch.program == "llama-server":
        return f"error: couldn't bind HTTP server socket, hostname: {launch.host}, port: {launch.port}: {reason}"
    if launch.program == "text-generation-launcher":
        return f"Error: WebserverFailed\nrouter: {reason} (os error 98)"
    return f"ERROR:    [Errno 98] error while attempting to bind on address ('{launch.host}', {launch.port}): {reason}"


# -- start-up lines ------------------------------------------------------------


def log_line(launch: Launch, message: str) -> str:
    """One log line as the server writes it."""
    now = datetime.now()
    if launch.program == "vllm":
        return f"INFO {now.strftime('%m-%d %H:%M:%S')} [api_server.py] {message}"
    if launch.program == "sglang":
        return f"[{now.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
    if launch.program == "text-generation-launcher":
        return f"{now.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}  INFO text_generation_launcher: {message}"
    return message


def loading_lines(launch: Launch) -> list[str]:
    """Lines printed as the server starts loading."""
    if launch.program == "vllm":
        return [f"vLLM API server version {VLLM_VERSION}",
                f"non-default args: {{'model': {launch.model_arg!r}, 'port': {launch.port}}}"]
    if launch.program == "sglang":
        return [f"server_args=ServerArgs(model_path={launch.model_arg!r}, port={launch.port}, "
                f"max_running_requests={launch.parallel}, tp_size={launch.tensor_parallel})",
                "Load weight begin."]
    if launch.program == "text-generation-launcher":
        return [f"Args {{ model_id: {launch.model_arg!r}, port: {launch.port}, "
                f"max_concurrent_requests: {launch.parallel}, num_shard: Some({launch.tensor_parallel}) }}",
                "Starting download process.", "Successfully downloaded weights.", "Starting shard rank=0"]
    return [f"build: {LLAMA_CPP_BUILD} with cc (GCC) for x86_64-linux-gnu",
            f"main: HTTP server is listening, hostname: {launch.host}, port: {launch.port}, http threads: 4",
            "main: loading model", f"srv    load_model: loading model '{launch.model_arg}'"]


def ready_lines(launch: Launch, load_seconds: float, pid: int) -> list[str]:
    """Lines printed once the server answers."""
    url = f"http://{launch.host}:{launch.port}"
    if launch.program == "vllm":
        return [f"Loading weights took {load_seconds:.2f} seconds", f"Starting vLLM API server 0 on {url}",
                f"INFO:     Started server process [{pid}]", "INFO:     Application startup complete."]
    if launch.program == "sglang":
        return [f"Load weight end. elapsed={load_seconds:.2f} s", f"INFO:     Started server process [{pid}]",
                f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)",
                "The server is fired up and ready to roll!"]
    if launch.program == "text-generation-launcher":
        return [f"Shard ready in {load_seconds:.2f}s rank=0", "Starting Webserver",
                f"INFO text_generation_router::server: Connected on {url}"]
    return ["main: model loaded", f"main: server is listening on {url} - starting the main loop",
            "srv  update_slots: all slots are idle"]


def stopping_line(launch: Launch) -> str:
    """The line printed on SIGTERM."""
    if launch.program in ("vllm", "sglang"):
        return "INFO:     Shutting down"
    if launch.program == "text-generation-launcher":
        return "Terminating webserver"
    return "srv    operator(): operator(): cleaning up before exit..."
