"""The ``ollama`` program of a sandbox instance: server and CLI in one entry point.

Run as ``python -m pytest_gpubench.sandbox.ollama_standin ARGS`` (the instance's
``ollama`` wrapper script does that). It reads the instance from the JSON file named
by ``GPUBENCH_SANDBOX_INSTANCE`` and behaves like Ollama 0.5.x as far as the plugin
can see:

``ollama --version`` / ``-v``
    ``ollama version is X`` when a server answers; otherwise, like the real CLI,
    ``Warning: could not connect to a running Ollama instance`` and
    ``Warning: client version is X``. Exit 0 either way.
``ollama serve``
    an aiohttp server on ``OLLAMA_HOST`` until SIGTERM/SIGINT, logging to stderr
    and writing ``ollama.pid`` in the state directory. Endpoints: ``GET /``,
    ``GET /api/version``, ``POST /api/pull``, ``GET /api/tags``, ``GET /api/ps``,
    ``POST /api/show``, ``DELETE /api/delete``, ``POST /api/generate``,
    ``POST /api/chat``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
    ``GET /v1/models``. Environment at start: ``OLLAMA_NUM_PARALLEL`` (default 1),
    ``OLLAMA_MAX_QUEUE`` (512), ``OLLAMA_KEEP_ALIVE`` (5m), ``OLLAMA_MODELS`` (named
    in disk errors), ``OLLAMA_NOPRUNE`` (keep unfinished downloads), and the sandbox truth
    knobs ``GPUBENCH_SANDBOX_TTFT_MS``, ``GPUBENCH_SANDBOX_TOKENS_PER_SECOND``,
    ``GPUBENCH_SANDBOX_JITTER`` (relative, default 0) that override the instance
    file's per-model values.
``ollama pull|list|ls|ps|rm|stop|run``
    HTTP clients of that server; ``Error: could not connect to ollama app, is it
    running?`` and exit 1 when nothing answers.

Error wordings taken from Ollama: ``model "x" not found, try pulling it first``
(404, generate/chat), ``model 'x' not found`` (404, show/delete),
``pull model manifest: file does not exist`` (pull of an unknown model),
``write <models>/blobs/sha256-<hex>-partial: no space left on device`` (a pull
that fills the instance's emulated disk),
``model requires more system memory (A GiB) than is available (B GiB)`` (500, a
model that does not fit), ``server busy, please try again.  maximum pending
requests exceeded`` (503).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping, Sequence

from .instance_spec import load_instance_spec
from .ollama_cli import COMMANDS, VersionQuery, fetch_server_version, run_command
from .ollama_common import parse_ollama_host
from .standin_answer import Answer

USAGE = """Large language model runner

Usage:
  ollama [flags]
  ollama [command]

Available Commands:
  serve       Start ollama
  pull        Pull a model from a registry
  list        List models
  ps          List running models
  run         Run a model
  stop        Stop a running model
  rm          Remove a model

Flags:
  -h, --help      help for ollama
  -v, --version   Show version information
"""


def one_shot(argv: Sequence[str], environ: Mapping[str, str]) -> Answer | VersionQuery | None:
    """The answer to ``ollama argv`` when it needs no running process: an :class:`Answer`,
    a :class:`VersionQuery` (``--version``: ask the server, then answer), or None for
    ``serve`` and the HTTP client commands, which only this program runs."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        return Answer(stdout=USAGE)
    try:
        spec = load_instance_spec(environ)
    except RuntimeError as exc:
        return Answer(stderr=f"Error: {exc}\n", status=1)
    if args[0] in ("-v", "--version"):
        return VersionQuery(parse_ollama_host(environ.get("OLLAMA_HOST")), spec.ollama.version)
    if args[0] != "serve" and args[0] not in COMMANDS:
        return Answer(stderr=f'Error: unknown command "{args[0]}" for "ollama"\n', status=1)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``ollama`` arguments; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    step = one_shot(args, os.environ)
    if isinstance(step, Answer):
        return step.emit()
    if isinstance(step, VersionQuery):
        return step.answer(fetch_server_version(step.host)).emit()
    spec = load_instance_spec()
    host = parse_ollama_host(os.environ.get("OLLAMA_HOST"))
    if args[0] == "serve":
        # Imported here so that CLI calls do not pay for loading aiohttp.
        from .ollama_engine import EngineSettings
        from .ollama_server import run_with_fine_timers, serve

        try:
            settings = EngineSettings.from_env()
        except ValueError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        if os.environ.get("GPUBENCH_SANDBOX_FINE_TIMERS") == "1":
            return run_with_fine_timers(serve(spec, host, settings))
        return asyncio.run(serve(spec, host, settings))
    return run_command(args, host)


if __name__ == "__main__":
    sys.exit(main())
