"""The OpenAI-server launchers the sandbox stands in for: their command lines and their own words.

One :func:`parse` per program turns the real command line into a :class:`Launch`
(the flags the stand-in acts on; others are accepted and ignored); the functions
below it say what each server prints: its version, its failure at load (an unknown
model, one that does not fit), its start-up lines. The server that serves them follows.

``vllm serve MODEL`` (``--port`` 8000, ``--host`` 0.0.0.0, ``--served-model-name``,
``--max-num-seqs`` 256, ``--tensor-parallel-size``/``-tp``, ``--gpu-memory-utilization``
0.9, ``--max-model-len``); ``llama-server -m FILE`` (``--port`` 8080, ``--host``
127.0.0.1, ``-c``, ``-np`` (-1: 4), ``-a/--alias``, ``-hf/--hf-repo REPO[:QUANT]``,
``-hff/--hf-file``); ``python3 -m sglang.launch_server
--model-path M`` (``--port`` 30000, ``--host`` 127.0.0.1, ``--served-model-name``,
``--max-running-requests`` (256), ``--tp-size``/``--tp``, ``--mem-fraction-static``
0.88, ``--context-length``); ``text-generation-launcher --model-id M`` (``--port``
3000, ``--hostname`` 0.0.0.0, ``--max-concurrent-requests`` 128, ``--num-shard``,
``--cuda-memory-fraction`` 1.0, ``--max-total-tokens``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
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
from .ollama_common import FOREVER, LISTEN_BACKLOG
from .ollama_engine import Engine, EngineSettings
from .standin_state import PulledModel, StateStore

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
    #: vLLM's ``--speculative-config``'s ``num_speculative_tokens``: tokens drafted per step (0: none).
    speculative_tokens: int = 0
    #: llama.cpp's ``-hf REPO[:QUANT]``: the GGUF is downloaded from this Hugging Face repo
    #: (the stand-in's "hub" is its catalog: :func:`hub_names`).
    hf_repo: str | None = None
    #: ``--as NAME``: the program of the runtime this stand-in imitates ("": its own).
    imitates: str = ""


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
    parser.add_argument("--speculative-config")
    args, _ = parser.parse_known_args(list(argv[1:]))
    model = args.model_tag or args.model
    if not model:
        raise LaunchError("vllm serve: error: the following arguments are required: model_tag")
    speculative = speculative_tokens(args.speculative_config) if args.speculative_config is not None else 0
    return Launch(program="vllm", model=model, served_names=tuple(args.served_model_name or [model]),
                  host=args.host, port=args.port, parallel=max(1, args.max_num_seqs),
                  tensor_parallel=max(1, args.tensor_parallel_size), max_model_len=args.max_model_len,
                  memory_fraction=args.gpu_memory_utilization, model_arg=model, api_key=args.api_key,
                  speculative_tokens=speculative)


#: The stand-in's speculative decoding: each drafted token is accepted with this probability
#: given the one before it was (a draft of k tokens is accepted up to its first miss). 0.7 is in
#: the range vLLM reports for EAGLE-style drafters on chat prompts; an emulation, not a model.
SPEC_ACCEPTANCE = 0.7


def speculative_tokens(text: str) -> int:
    """``--speculative-config``'s JSON -> its ``num_speculative_tokens``, or vLLM's kind of refusal."""
    try:
        config = json.loads(text)
    except ValueError:
        raise LaunchError(f"vllm serve: error: argument --speculative-config: invalid loads value: {text!r}") from None
    tokens = config.get("num_speculative_tokens") if isinstance(config, dict) else None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise LaunchError("ValueError: speculative config needs num_speculative_tokens, a whole number of at "
                          f"least 1; got {text}")
    return tokens


def expected_accepted(draft: int) -> float:
    """Tokens accepted per verification step on average: ``a + a^2 + ... + a^k`` for a draft of ``k``."""
    return sum(SPEC_ACCEPTANCE ** i for i in range(1, draft + 1))


def metrics_text(launch: Launch, tokens: int) -> str:
    """vLLM's ``/metrics`` after ``tokens`` generated tokens: with a speculative config, the V1
    spec-decode counters those tokens imply (each step emits its accepted tokens and one more, so
    ``drafts = round(tokens / (1 + expected_accepted(k)))``, ``accepted = tokens - drafts``,
    ``draft_tokens = drafts x k``)."""
    label = f'{{engine="0",model_name="{launch.served_names[0]}"}}'
    lines = ["# HELP vllm:generation_tokens_total Number of generation tokens processed.",
             "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{label} {float(tokens)}"]
    k = launch.speculative_tokens
    if k:
        drafts = round(tokens / (1 + expected_accepted(k)))
        for name, value in (("drafts", drafts), ("draft_tokens", drafts * k), ("accepted_tokens", tokens - drafts)):
            lines += [f"# TYPE vllm:spec_decode_num_{name} counter", f"vllm:spec_decode_num_{name}_total{label} "
                      f"{float(value)}", f"vllm:spec_decode_num_{name}_created{label} {time.time():.3f}"]
    return "\n".join(lines) + "\n"


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
    parser.add_argument("-hf", "-hfr", "--hf-repo")
    parser.add_argument("-hff", "--hf-file")
    args, _ = parser.parse_known_args(list(argv))
    # With -hf, llama.cpp reads -m as the file to fetch from the repo (its --hf-file) and saves
    # it there; without -m it picks the file by the repo's :QUANT and names the model by the repo.
    file = args.model or args.hf_file
    if not file and not args.hf_repo:
        raise LaunchError("error: no model given: use -m FILE or --model FILE")
    name = Path(file).name if file else args.hf_repo
    name = name[: -len(".gguf")] if name.endswith(".gguf") else name
    given = args.model or args.hf_repo
    return Launch(program="llama-server", model=name, served_names=(args.alias or given,), host=args.host,
                  port=args.port, parallel=4 if args.parallel < 1 else args.parallel, max_model_len=args.ctx_size,
                  memory_fraction=None, model_arg=given, api_key=args.api_key, hf_repo=args.hf_repo)


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


# ----------------------------------------------------------------------
#
# Stand-ins for the launchers of OpenAI-compatible servers: ``vllm``, ``llama-server``,
# SGLang's ``python3 -m sglang.launch_server`` and TGI's ``text-generation-launcher``.
#
# Run as ``python -m pytest_gpubench.sandbox.openai_launchers PROGRAM ARGS`` (the
# instance's wrappers in ``bin/``, and the ``sglang`` package on its ``PYTHONPATH``, do
# that). Each start is one long-running server, built on the Ollama stand-in's engine
# (:mod:`.ollama_engine`: the catalog model's load time, TTFT, decode rate, batching
# model and stream faults) and its OpenAI endpoints (:mod:`.ollama_server`); only the
# launcher's flags, logs, readiness, ``/v1/models`` and failure wording are its own
# (:mod:`.openai_launchers`):
#
# - vLLM, SGLang and TGI load first, then listen: ``GET /health`` answers an empty 200
#   once anything answers. llama.cpp listens first; ``GET /health`` is 503
#   ``{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}``
#   while loading, then 200 ``{"status": "ok"}``.
# - vLLM checks a request's ``model`` against its served names (404 ``The model `x`
#   does not exist.``); the others serve their one model whatever the name.
# - TGI refuses requests over ``--max-concurrent-requests`` with 429 ``Model is
#   overloaded``; the others queue without a limit.
# - Memory: vLLM, SGLang and TGI take their memory fraction of every card of the
#   tensor-parallel group up front and fail (exit 1, the server's words) when the
#   weights do not fit it; llama.cpp needs weights, KV cache for ``-np`` slots and graph.
# - GPUs: each sees those ``CUDA_VISIBLE_DEVICES`` names (all without it). A
#   tensor-parallel size (``-tp``, ``--tp-size``, ``--num-shard``) larger than that is
#   refused in the server's words; the group is the first N of them, where nvidia-smi
#   shows the model's memory, split evenly; llama.cpp spreads layers over all it sees.
#   Tensor parallelism decodes faster by :func:`tensor_parallel_speedup`.
# - ``--api-key KEY`` (vLLM, SGLang, llama-server): ``/v1/*`` answers 401 without
#   ``Authorization: Bearer KEY``; ``/health`` and vLLM's ``/version`` stay open.
#
# All: ``--version``; exit 1 with a message for an unknown model, one that does not
# fit, or a port in use; stop cleanly on SIGTERM/SIGINT (exit 0), or when the sandbox dies.


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
        #: Whose batching law it follows: the imitated runtime's program (``--as``), else its own.
        self.program = launch.imitates or launch.program
        if launch.tensor_parallel > 1:  # the catalog's rate is one GPU's
            model = model.model_copy(update={
                "tokens_per_second": model.tokens_per_second * tensor_parallel_speedup(launch.tensor_parallel)})
        if launch.speculative_tokens:  # each step emits its accepted draft tokens and one of its own
            model = model.model_copy(update={
                "tokens_per_second": model.tokens_per_second * (1 + expected_accepted(launch.speculative_tokens))})
        self.model_spec = model
        self.key = normalize_model_name(launch.model)
        pulled = PulledModel(name=self.key, size=model.size_bytes, digest=model.digest_hex,
                             modified_at=datetime.now(timezone.utc))
        self.pulled = {self.key: pulled}
        self._served = {normalize_model_name(name) for name in launch.served_names}

    def serves(self, name: str) -> bool:
        """Whether a request's ``model`` reaches this server's model."""
        return self.launch.program not in CHECKS_MODEL_NAME or normalize_model_name(name) in self._served

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
            raise LaunchError(no_gpu(launch))
        if launch.tensor_parallel > len(self.devices):
            raise LaunchError(too_many_gpus(launch, len(self.devices)))
        if launch.memory_fraction is not None:
            budget = self.vram_bytes(model)
            weights = model.size_bytes + max(256 * MIB, model.size_bytes // 20)
            if weights > budget:
                raise LaunchError(out_of_memory(
                    launch, short_mib=(weights - budget) / MIB, total_mib=gpu.memory_mib,
                    free_mib=max(0, budget - model.size_bytes) / MIB))
            return
        needed, available = self.vram_bytes(model), self.available_vram()
        if needed > available:
            raise LaunchError(out_of_memory(launch, short_mib=needed / MIB, total_mib=gpu.memory_mib,
                                                     free_mib=available / MIB))

    async def load(self) -> None:
        """Load the model now, as the launcher does before serving."""
        await self.load_only(self.key, FOREVER)


#: A size in billions as a word of its own in a file or repo name (``Qwen2-7B-Instruct-GGUF``).
_HUB_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)b(?![a-z0-9])")


def hub_names(name: str) -> list[str]:
    """The catalog names a Hugging Face file or repo name may stand for, most specific first.

    The sandbox has no network: ``llama-server -hf REPO`` "downloads" the catalog model the
    names say, read as family and size: ``Qwen/Qwen2-7B-Instruct-GGUF:Q4_K_M`` and
    ``qwen2-7b-instruct-q4_k_m.gguf`` are ``qwen2:7b``; the family may lose trailing words
    (``DeepSeek-R1-Distill-Qwen-14B`` tries ``deepseek-r1-distill-qwen:14b``, ...,
    ``deepseek-r1:14b``). A name that is already a catalog name (``qwen2:7b.gguf``) is itself.
    """
    last = name.strip().lower().rsplit("/", 1)[-1]
    last = last[: -len(".gguf")] if last.endswith(".gguf") else last
    names = [last]
    stem = last.partition(":")[0]  # a repo's :QUANT
    found = _HUB_SIZE.search(stem)
    if found:
        words = stem[: found.start()].strip("-_. ").split("-")
        names += [f"{'-'.join(words[:n])}:{found.group(1)}b" for n in range(len(words), 0, -1)]
    return names


def find_catalog_model(spec: InstanceSpec, launch: Launch) -> tuple[Launch, ModelSpec]:
    """The catalog entry the launcher's model argument names (the launch naming it), or the
    server's own error. llama.cpp's ``-hf REPO`` stands for the catalog model its file or repo
    names (:func:`hub_names`); none is a download that fails, as an unknown repo's does."""
    found = spec.find_model(launch.model)
    if found is None and launch.hf_repo:
        for name in [*hub_names(launch.model), *hub_names(launch.hf_repo)]:
            if (found := spec.find_model(name)) is not None:
                launch = dataclasses.replace(launch, model=name)
                break
        else:
            repo, _, _ = launch.hf_repo.partition(":")
            file = f"/resolve/main/{launch.model_arg}" if launch.model_arg != launch.hf_repo else ""
            raise LaunchError(f"error: failed to download model from https://huggingface.co/{repo}{file}")
    if found is None:
        raise LaunchError(unknown_model(launch))
    return launch, found[1]


def _log(launch: Launch, message: str) -> None:
    print(log_line(launch, message), file=sys.stderr, flush=True)


# -- HTTP -----------------------------------------------------------------------


def create_app(engine: LauncherEngine, ready: asyncio.Event) -> Any:
    """The aiohttp application: the stand-in's OpenAI handlers behind the launcher's checks."""
    from aiohttp import web

    from .ollama_server import ENGINE, handle_chat_completions, handle_completions, json_response, read_json

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
    async def metrics(_: web.Request) -> web.Response:
        # Every token the engine streamed (its lag statistics count each one).
        return web.Response(text=metrics_text(launch, engine.lag.tokens), content_type="text/plain")

    if launch.program == "vllm":
        app.router.add_get("/version", version)
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", guarded(handle_chat_completions))
    app.router.add_post("/v1/completions", guarded(handle_completions))
    return app


async def serve(spec: InstanceSpec, launch: Launch) -> int:
    """Load and serve until SIGTERM/SIGINT; the exit status."""
    from aiohttp import web

    launch, model = find_catalog_model(spec, launch)
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
            raise LaunchError(address_in_use(launch, os.strerror(exc.errno or 0))) from exc

    try:
        for line in loading_lines(launch):
            _log(launch, line)
        started = loop.time()
        if launch.program in LOAD_THEN_LISTEN:
            await engine.load()
            await listen()
        else:
            await listen()
            await engine.load()
        ready.set()
        for line in ready_lines(launch, loop.time() - started, os.getpid()):
            _log(launch, line)
        await stop.wait()
    finally:
        owner.cancel()
        _log(launch, stopping_line(launch))
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``openai_launchers [--as NAME] PROGRAM ARGS``; returns the exit status. ``--as NAME``: a runtime
    imitated by ``PROGRAM``'s stand-in under its own name (``RuntimeFacts.sandbox``): only its
    process's command line says NAME."""
    args = list(sys.argv[1:] if argv is None else argv)
    imitates = ""
    if args[:1] == ["--as"]:
        imitates, args = (args[1:2] or [""])[0], args[2:]
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
        launch = dataclasses.replace(parse(program, rest), imitates=imitates)
        spec = load_instance_spec()
        return asyncio.run(serve(spec, launch))
    except (LaunchError, RuntimeError) as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
