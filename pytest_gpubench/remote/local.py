"""``LocalShell``: the :class:`~pytest_gpubench.remote.ssh.Connection` interface on this machine.

For a session that has no SSH (``SshDetails.local``: a running endpoint, later this
machine as a provider), the runtime and the benchmark run their commands here with
the same interface and the same rules: a command is one already-quoted POSIX shell
line (every word from a matrix through ``shlex.quote``), scripts go through stdin,
never the command line. Commands run in the shell's home, which is also their ``HOME``
(where the load generator's checkpoint lands), with the plugin's own Python first on
``PATH`` as ``python3`` (a script that runs it, so a virtualenv's packages come along).
``forward`` is the identity: the server is reached directly.

A running endpoint's shell (:meth:`LocalShell.open`) has a private temporary home, removed
when it closes. This machine as a provider (:meth:`LocalShell.open_machine`) keeps a
persistent one, :func:`machine_home` (``~/.gpubench/local-home``), as a host keeps its
user's home: Ollama's models, the Hugging Face cache, the torch venv and the server pid
and port files outlive the cell, so ``keep_models`` holds and a dead run's server is found.

With ``hide_gpu``, ``nvidia-smi`` answers as on a machine without a driver: a
running endpoint's GPU is the one its matrix declares, and this machine's (if it
has one) must not be sampled in its place.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from ..errors import RemoteCommandError, Stage, StageError
from .ssh import CommandResult

#: Where the shell's own ``bin`` puts ``python3`` (this interpreter) and, with ``hide_gpu``, the ``nvidia-smi`` stub.
_NO_DRIVER = "#!/bin/sh\necho 'nvidia-smi: command not found' >&2\nexit 127\n"


class LocalShell:
    """Commands on this machine behind the SSH ``Connection``'s interface."""

    host = "localhost"
    port = 0
    host_key = None
    host_key_fingerprint = ""

    def __init__(self, home: Path, *, hide_gpu: bool = False, keep_home: bool = False) -> None:
        self.home = home
        #: Whether :meth:`close` leaves the home in place (a machine's) or removes it (a private one).
        self.keep_home = keep_home
        #: Exit status and stderr tail of the last ``stream_lines`` command.
        self.last_exit_status: int | None = None
        self.last_stderr = ""
        self._closed = False
        self._processes: set[asyncio.subprocess.Process] = set()
        bin_dir = home / ".bin"
        bin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _interpreter_wrapper(bin_dir / "python3", sys.executable)
        if hide_gpu:
            stub = bin_dir / "nvidia-smi"
            stub.write_text(_NO_DRIVER)
            stub.chmod(0o700)
        # HOME too: what a script keeps "in the home directory" (the load generator's checkpoint,
        # caches) stays in the shell's home, not in the user's own.
        self._env = {**os.environ, "HOME": str(home),
                     "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}

    @classmethod
    def open(cls, *, hide_gpu: bool = False) -> LocalShell:
        """A shell with a fresh private (0700) working directory, removed by :meth:`close`."""
        return cls(Path(tempfile.mkdtemp(prefix="gpubench-local-")), hide_gpu=hide_gpu)

    @classmethod
    def open_machine(cls, home: Path | None = None) -> LocalShell:
        """A shell for this machine as a provider: in the persistent ``home`` (:func:`machine_home`
        by default, created 0700 when missing), which :meth:`close` leaves in place."""
        home = home or machine_home()
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        return cls(home, keep_home=True)

    async def _start(self, command: str, stdin: bool) -> asyncio.subprocess.Process:
        if self._closed:
            raise OSError("the local shell is closed")
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, cwd=self.home, env=self._env,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # ended as a group: a command's children go with it
        )
        self._processes.add(process)
        return process

    async def run(self, command: str, *, stage: Stage, what: str, timeout: float, stdin: str | None = None,
                  check: bool = True) -> CommandResult:
        """Run ``command`` (already quoted); as :meth:`Connection.run <pytest_gpubench.remote.ssh.Connection.run>`."""
        try:
            process = await self._start(command, stdin is not None)
        except OSError as exc:
            raise StageError(stage, f"{what}: cannot start a local command ({exc})") from None
        try:
            out, err = await asyncio.wait_for(
                process.communicate(stdin.encode() if stdin is not None else None), timeout)
        except asyncio.TimeoutError:
            raise StageError(stage, f"{what} did not finish within {timeout:.0f} s") from None
        finally:
            await self._end(process)
        done = CommandResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), process.returncode)
        if check and not done.ok:
            raise RemoteCommandError(stage, what, done.exit_status, done.stderr or done.stdout)
        return done

    async def stream_lines(self, command: str, *, stdin: str) -> AsyncIterator[str]:
        """Start ``command``, write ``stdin`` and close it, then yield stdout lines; the process
        ends if the caller stops iterating early."""
        process = await self._start(command, True)
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        stderr = asyncio.ensure_future(process.stderr.read())
        try:
            process.stdin.write(stdin.encode())
            try:
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # it exited without reading: its status and stderr say why
            process.stdin.close()
            async for raw in process.stdout:
                yield raw.decode("utf-8", "replace").rstrip("\n")
            await process.wait()
            self.last_exit_status = process.returncode
            self.last_stderr = (await stderr).decode("utf-8", "replace")[-2000:]
        finally:
            stderr.cancel()
            await self._end(process)

    async def _end(self, process: asyncio.subprocess.Process) -> None:
        """Terminate ``process`` (and its group) unless it has exited; reap it."""
        self._processes.discard(process)
        if process.returncode is None:
            try:
                os.killpg(process.pid, 15)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(process.wait(), 5)
            except asyncio.TimeoutError:
                os.killpg(process.pid, 9)
                await process.wait()

    async def forward(self, remote_host: str, remote_port: int) -> int:
        """The server is reached directly from here: its own port."""
        return remote_port

    @property
    def closed(self) -> bool:
        return self._closed

    def set_keepalive(self, interval: float, count_max: int = 0) -> None:
        """Nothing to keep alive."""

    def abort(self) -> None:
        """End every command still running, at once."""
        for process in list(self._processes):
            if process.returncode is None:
                try:
                    os.killpg(process.pid, 9)
                except ProcessLookupError:
                    pass
        self._closed = True

    async def close(self) -> None:
        """End what still runs and remove the home unless it is a machine's (:attr:`keep_home`)."""
        for process in list(self._processes):
            await self._end(process)
        self._closed = True
        if not self.keep_home:
            shutil.rmtree(self.home, ignore_errors=True)


def machine_home() -> Path:
    """Where ``cloud: local`` runs its commands, kept between cells and runs: ``~/.gpubench/local-home``."""
    return Path.home() / ".gpubench" / "local-home"


def _interpreter_wrapper(path: Path, interpreter: str) -> None:
    """Make ``path`` a script that runs ``interpreter``, replacing what is there in one step
    (two workers may share a home).

    A script, not a symlink: a virtualenv's interpreter started through a symlink outside the
    virtualenv finds no ``pyvenv.cfg`` beside it and runs as the bare base interpreter, without
    the virtualenv's packages (PyTorch and NVML's bindings on a GPU box set up that way).
    """
    script = f"#!/bin/sh\nexec {shlex.quote(interpreter)} \"$@\"\n"
    if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == script:
        return
    fresh = path.with_name(f".{path.name}.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    fresh.write_text(script, encoding="utf-8")
    fresh.chmod(0o700)
    os.replace(fresh, path)
