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

**The client side** (every subcommand but ``serve``) talks HTTP to the server. Like the
real CLI it reaches the server at ``OLLAMA_HOST``, prints tables and answers on stdout,
progress on stderr, and fails with ``Error: <message>`` and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from .instance_spec import load_instance_spec
from .ollama_common import OllamaHost, go_duration, human_bytes, human_time, parse_ollama_host
from .standin_answer import Answer

# ------------------------------------------------------------ the client side

NO_SERVER = "could not connect to ollama app, is it running?"
_TIMEOUT = httpx.Timeout(None, connect=5.0)
#: How long ``ollama --version`` waits for the server (connect, and then the answer).
VERSION_TIMEOUT_S = 5.0


class CliError(Exception):
    """Ends the command with ``Error: <message>`` and exit status 1."""


class Client:
    """A small synchronous client of the Ollama API."""

    def __init__(self, host: OllamaHost) -> None:
        self.http = httpx.Client(base_url=host.base_url, timeout=_TIMEOUT, trust_env=False)

    def _check(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            response.read()
            try:
                message = response.json().get("error") or response.text
            except ValueError:
                message = response.text.strip() or f"status {response.status_code}"
            raise CliError(message)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.ConnectError as exc:
            raise CliError(NO_SERVER) from exc
        self._check(response)
        return response.json() if response.content else None

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The NDJSON objects of a streamed answer; an ``error`` object raises."""
        try:
            with self.http.stream("POST", path, json=body) as response:
                self._check(response)
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if "error" in item:
                        raise CliError(item["error"])
                    yield item
        except httpx.ConnectError as exc:
            raise CliError(NO_SERVER) from exc


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width + 4) for cell, width in zip(row, widths, strict=True)]
        lines.append("".join(cells).rstrip() + "    ")
    return "\n".join(lines)


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class VersionQuery:
    """``ollama --version``: its answer depends on what the server at ``host`` says."""

    host: OllamaHost
    client_version: str

    def answer(self, server_version: str | None) -> Answer:
        """The answer, given the server's version (None: no server answered)."""
        lines = []
        if server_version is None:
            lines.append("Warning: could not connect to a running Ollama instance")
        if server_version:
            lines.append(f"ollama version is {server_version}")
        if (server_version or "") != self.client_version:
            lines.append(f"Warning: client version is {self.client_version}")
        return Answer(stdout="".join(line + "\n" for line in lines))


def fetch_server_version(host: OllamaHost) -> str | None:
    """``GET /api/version`` of the server at ``host``: its version ("" if it names
    none), or None when nothing answers."""
    try:
        response = httpx.get(f"{host.base_url}/api/version", timeout=VERSION_TIMEOUT_S, trust_env=False)
        return response.json().get("version", "")
    except (httpx.HTTPError, ValueError):
        return None


def cmd_pull(client: Client, args: argparse.Namespace) -> None:
    shown: dict[str, int] = {}
    for update in client.stream("/api/pull", {"model": args.model, "stream": True}):
        status = update.get("status", "")
        total, completed = update.get("total"), update.get("completed")
        if total and completed is not None:
            percent = int(100 * completed / total) if total else 100
            # One line per 10% step, not per update: the output is a log, not a tty.
            if percent // 10 == shown.get(status, -1) // 10 and percent < 100:
                continue
            shown[status] = percent
            bar = ("█" * (percent // 5)).ljust(20)
            print(f"{status}: {percent:3d}% ▕{bar}▏ {human_bytes(completed)}/{human_bytes(total)}", file=sys.stderr)
        elif not total:
            print(status, file=sys.stderr)


def cmd_list(client: Client, args: argparse.Namespace) -> None:
    models = client.request("GET", "/api/tags")["models"]
    rows = [
        (m["name"], m["digest"][:12], human_bytes(m["size"]), human_time(_parse_time(m["modified_at"]))) for m in models
    ]
    print(_table(("NAME", "ID", "SIZE", "MODIFIED"), rows))


def cmd_ps(client: Client, args: argparse.Namespace) -> None:
    models = client.request("GET", "/api/ps")["models"]
    rows = []
    for m in models:
        share = round(100 * m["size_vram"] / m["size"]) if m["size"] else 100
        processor = "100% GPU" if share >= 100 else f"{100 - share}%/{share}% CPU/GPU"
        rows.append(
            (m["name"], m["digest"][:12], human_bytes(m["size"]), processor, human_time(_parse_time(m["expires_at"])))
        )
    print(_table(("NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"), rows))


def cmd_rm(client: Client, args: argparse.Namespace) -> None:
    for name in args.models:
        client.request("DELETE", "/api/delete", {"model": name})
        print(f"deleted '{name}'")


def cmd_stop(client: Client, args: argparse.Namespace) -> None:
    client.request("POST", "/api/generate", {"model": args.model, "keep_alive": 0})


def cmd_run(client: Client, args: argparse.Namespace) -> None:
    prompt = " ".join(args.prompt)
    if not prompt and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if not prompt:
        raise CliError("the sandbox's ollama runs only with a prompt: ollama run MODEL PROMPT")
    try:
        client.request("POST", "/api/show", {"model": args.model})
    except CliError as exc:
        if "not found" not in str(exc):
            raise
        cmd_pull(client, args)  # like the real CLI, run pulls a missing model first
    body: dict[str, Any] = {"model": args.model, "messages": [{"role": "user", "content": prompt}]}
    if args.keepalive:
        body["keep_alive"] = args.keepalive
    final: dict[str, Any] = {}
    for chunk in client.stream("/api/chat", body):
        sys.stdout.write(chunk.get("message", {}).get("content", ""))
        sys.stdout.flush()
        if chunk.get("done"):
            final = chunk
    sys.stdout.write("\n")
    if args.verbose and final:
        _print_stats(final)


def _print_stats(final: dict[str, Any]) -> None:
    def rate(count: int, nanos: int) -> str:
        return f"{count / (nanos / 1e9):.2f} tokens/s" if nanos else "0.00 tokens/s"

    lines = [
        ("total duration", go_duration(final["total_duration"] / 1e9)),
        ("load duration", go_duration(final["load_duration"] / 1e9)),
        ("prompt eval count", f"{final['prompt_eval_count']} token(s)"),
        ("prompt eval duration", go_duration(final["prompt_eval_duration"] / 1e9)),
        ("prompt eval rate", rate(final["prompt_eval_count"], final["prompt_eval_duration"])),
        ("eval count", f"{final['eval_count']} token(s)"),
        ("eval duration", go_duration(final["eval_duration"] / 1e9)),
        ("eval rate", rate(final["eval_count"], final["eval_duration"])),
    ]
    for label, value in lines:
        print(f"{label + ':':<22}{value}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ollama", description="Large language model runner (sandbox)")
    sub = parser.add_subparsers(dest="command")
    pull = sub.add_parser("pull", help="Pull a model from a registry")
    pull.add_argument("model")
    pull.add_argument("--insecure", action="store_true")
    pull.set_defaults(func=cmd_pull)
    for name in ("list", "ls"):
        sub.add_parser(name, help="List models").set_defaults(func=cmd_list)
    sub.add_parser("ps", help="List running models").set_defaults(func=cmd_ps)
    rm = sub.add_parser("rm", help="Remove a model")
    rm.add_argument("models", nargs="+")
    rm.set_defaults(func=cmd_rm)
    stop = sub.add_parser("stop", help="Stop a running model")
    stop.add_argument("model")
    stop.set_defaults(func=cmd_stop)
    run = sub.add_parser("run", help="Run a model")
    run.add_argument("model")
    run.add_argument("prompt", nargs="*")
    run.add_argument("--verbose", action="store_true")
    run.add_argument("--keepalive", default="")
    run.add_argument("--nowordwrap", action="store_true")
    run.add_argument("--insecure", action="store_true")
    run.add_argument("--format", default="")
    run.set_defaults(func=cmd_run)
    return parser


COMMANDS = ("pull", "list", "ls", "ps", "rm", "stop", "run")


def run_command(argv: Sequence[str], host: OllamaHost) -> int:
    """Run one client subcommand; returns the exit status."""
    if argv and argv[0] not in COMMANDS:
        print(f'Error: unknown command "{argv[0]}" for "ollama"', file=sys.stderr)
        return 1
    args = _parser().parse_args(list(argv))
    client = Client(host)
    try:
        args.func(client, args)
    except CliError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.http.close()
    return 0


# ------------------------------------------------------------ the program

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
