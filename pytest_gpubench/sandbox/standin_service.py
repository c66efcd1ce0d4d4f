"""An instance's answering service: one-shot stand-in calls without a Python start.

Starting Python for every ``nvidia-smi --query-gpu=...``, ``nvidia-smi -q``,
``ollama --version``, ``df -Pk`` or ``curl <install URL>`` costs ~0.17 s of CPU
(interpreter plus pydantic). The sandbox process has those modules loaded already, so
each instance gets a small HTTP service on a Unix socket in a private (0700)
directory, and the ``bin/`` wrappers (:func:`.shims.service_wrapper`) ask it with the
host's real ``curl --unix-socket``::

    POST http://standin/<program>   (form: instance=<instance.json>, arg=... in order,
                                     env=NAME=value for each forwarded variable that is
                                     set, cwd=$PWD for df)

It computes the answer with the stand-in's own ``one_shot`` function (the very code
the Python module runs, so the bytes are the same) and replies with ``sh`` that
replays it: ``printf`` of the shell-quoted stdout and stderr, then ``exit STATUS``.
The wrapper ``eval``s that; only this service can bind the socket's directory.

It declines (HTTP 404, the wrapper then ``exec``s the Python module as before) any
call it cannot answer exactly: a long-lived one (``nvidia-smi -l``, ``ollama serve``,
the HTTP client commands), a caller whose ``GPUBENCH_SANDBOX_INSTANCE`` is not this
instance or whose ``TZ`` differs from this process's (timestamps are local time), and
anything unexpected. A sandbox that is gone means no socket: the wrapper falls back too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import stat
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from . import df_standin, nvidia_smi_standin, ollama_standin, shims
from .ollama_common import OllamaHost
from .ollama_standin import VERSION_TIMEOUT_S, VersionQuery
from .standin_answer import Answer

log = logging.getLogger("pytest_gpubench.sandbox")

class Declined(Exception):
    """The service will not answer this call; the wrapper runs the Python module."""


def shell_replay(answer: Answer) -> str:
    """``sh`` that writes ``answer``'s stdout and stderr and exits with its status."""
    lines = []
    if answer.stdout:
        lines.append(f"printf '%s' {shlex.quote(answer.stdout)}")
    if answer.stderr:
        lines.append(f"printf '%s' {shlex.quote(answer.stderr)} >&2")
    lines.append(f"exit {int(answer.status)}")
    return "\n".join(lines) + "\n"


def private_directory(path: Path) -> bool:
    """Create ``path`` mode 0700, or accept it if it already is a directory of ours that
    nobody else can enter; False for anything else (then the service stays off)."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


async def server_version(host: OllamaHost) -> str | None:
    """What ``GET /api/version`` names, as :func:`.ollama_standin.fetch_server_version` reads it."""
    timeout = aiohttp.ClientTimeout(sock_connect=VERSION_TIMEOUT_S, sock_read=VERSION_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{host.base_url}/api/version") as response:
                data = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        raise Declined("a version answer that is not an object")  # the module fails its own way
    return data.get("version", "")


class StandinService:
    """Answers one instance's one-shot stand-in calls on a Unix socket."""

    def __init__(self, spec_path: Path, bin_dir: Path) -> None:
        self.socket_path = shims.socket_path_for(bin_dir)
        self.spec_path = spec_path
        self.bin_dir = bin_dir
        #: Calls answered here, by program (tests and the benchmark read it).
        self.answered: dict[str, int] = {}
        self._runner: web.AppRunner | None = None

    async def start(self) -> bool:
        """Listen on the socket (replacing a stale one); False when its directory is not
        private (a squatted ``/tmp`` name), so the wrappers run the modules."""
        if not private_directory(self.socket_path.parent):
            log.warning("stand-in service off: %s is not a private directory", self.socket_path.parent)
            return False
        app = web.Application()
        app.router.add_post("/{program}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            self.socket_path.unlink(missing_ok=True)
            await web.UnixSite(runner, str(self.socket_path)).start()
        except OSError as exc:
            await runner.cleanup()
            log.warning("stand-in service off: cannot listen on %s: %s", self.socket_path, exc)
            return False
        self._runner = runner
        return True

    async def stop(self) -> None:
        """Stop listening; remove the socket and its directory."""
        if self._runner is None:
            return
        await self._runner.cleanup()
        self._runner = None
        self.socket_path.unlink(missing_ok=True)
        try:
            self.socket_path.parent.rmdir()
        except OSError:
            pass

    async def _handle(self, request: web.Request) -> web.Response:
        program = request.match_info["program"]
        try:
            form = await request.post()
            answer = await self.answer(
                program,
                [str(arg) for arg in form.getall("arg", [])],
                str(form.get("instance", "")),
                _environment(form.getall("env", [])),
                str(form["cwd"]) if "cwd" in form else None,
            )
        except Declined as exc:
            return web.Response(status=404, text=f"declined: {exc}\n")
        except Exception:  # a bug here must cost a Python start, never a wrong answer
            log.exception("stand-in service: %s failed; the wrapper falls back to Python", program)
            return web.Response(status=500, text="failed\n")
        self.answered[program] = self.answered.get(program, 0) + 1
        return web.Response(text=shell_replay(answer))

    async def answer(
        self, program: str, args: list[str], instance: str, env: dict[str, str], cwd: str | None
    ) -> Answer:
        """The answer to ``program args``; raises :class:`Declined` when only the module can give it."""
        if instance not in ("", str(self.spec_path)):  # unset: the "not on an instance" error
            raise Declined("another instance file")
        if not set(env) <= set(shims.FORWARDED_ENV.get(program, ())):
            raise Declined("a variable the wrapper does not send")
        if env.get("TZ") != os.environ.get("TZ"):
            raise Declined("another time zone")
        environ = {**env, shims.INSTANCE_ENV: instance} if instance else dict(env)
        if program == "nvidia-smi":
            found = nvidia_smi_standin.one_shot(args, environ)
            if not isinstance(found, Answer):
                raise Declined("a loop")
            return found
        if program == "df":
            if cwd is None or not os.path.isabs(cwd):
                raise Declined("no working directory")
            return df_standin.one_shot(args, environ, cwd)
        if program == "ollama":
            step = ollama_standin.one_shot(args, environ)
            if isinstance(step, VersionQuery):
                return step.answer(await server_version(step.host))
            if step is None:
                raise Declined("serve or a client command")
            return step
        if program == "curl":
            found = shims.install_answer(self.bin_dir, args, environ)
            if found is None:
                raise Declined("not the install URL on stdout")
            return found
        raise Declined(f"no program {program!r}")


def _environment(pairs: list[Any]) -> dict[str, str]:
    environ: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = str(pair).partition("=")
        if not sep or not name:
            raise Declined("a malformed env field")
        environ[name] = value
    return environ


