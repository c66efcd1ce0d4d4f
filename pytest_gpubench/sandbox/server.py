"""Running the sandbox: in-process (:class:`Sandbox`, :class:`SandboxThread`) or as a program,
and its machines for the ``hosts`` and ``local`` providers.

``python -m pytest_gpubench.sandbox [--host H] [--port P] [--catalog FILE]
[--time-scale S] [--ssh-server {asyncssh,openssh}]`` prints two lines to stdout
once the API answers, its address and the bearer token every request needs
(:mod:`.auth`; the environment's ``GPUBENCH_SANDBOX_TOKEN``, else a new random one)::

    GPUBENCH_SANDBOX_URL=http://127.0.0.1:PORT
    export GPUBENCH_API_TOKEN=<token>

then logs to stderr (never the token). It refuses to print the token into a regular
file that other users can read (``gpubench sandbox > out`` under umask 022). SIGTERM
or SIGINT stops every session (``stopped``), kills every instance process, removes the
temporary directories, prints a one-line summary to stderr and exits 0.

**Sandbox machines for the ``hosts`` and ``local`` providers**: no GPU Shopper API, just machines.
:class:`SandboxHosts` starts N standalone "host" machines, each a sandbox
:class:`~.instances.Instance` (real SSH on loopback, the nvidia-smi, ollama, df and
launcher stand-ins) built from a catalog offer of the GPU asked for, with as many GPUs as
asked, and writes what a user would: a private key (0600) and a ``hosts.yaml`` naming the
machines (docs/providers.md). ``gpubench sandbox hosts`` runs it from the command line.

:func:`local_machine` is the ``local`` provider's counterpart: an instance with no SSH
whose ``environment()`` (``PATH`` with its ``bin/`` first, ``OLLAMA_HOST``, the stand-ins'
``GPUBENCH_SANDBOX_INSTANCE``) gives this machine the stand-in GPUs and Ollama; a test
runs pytest with it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import yaml
from aiohttp import web

from . import sshd
from .api import make_app
from .auth import TOKEN_ENV, TOKEN_LINE_PREFIX, new_token
from .catalog import Catalog, CatalogError, OfferSpec, load_catalog
from .cloud import EmulatedCloud
from .instances import SSH_SERVERS, Instance, free_port, instance_document

log = logging.getLogger("pytest_gpubench.sandbox")
URL_PREFIX = "GPUBENCH_SANDBOX_URL="
T = TypeVar("T")


@dataclass(frozen=True)
class SandboxSummary:
    """What a sandbox did, reported when it stops."""

    created: int
    left_running: int

    def line(self) -> str:
        return (
            f"gpubench sandbox stopped: {self.created} session(s) created, "
            f"{self.left_running} left running before shutdown (now stopped)"
        )


class Sandbox:
    """The emulated API and its instances on the current event loop.

    ``catalog`` is a :class:`Catalog`, a path to a catalog file, or None for the
    shipped one. ``time_scale`` multiplies every emulated delay (provisioning,
    install, pull, model load) and never token rates or TTFT. ``ssh_server`` is
    what answers on each instance's SSH port: ``"asyncssh"`` in this process, or
    ``"openssh"``, a real ``sshd`` per instance (needs openssh-server and root;
    :meth:`start` raises :class:`~.sshd.SshServerUnavailable` otherwise). ``token`` is
    the bearer token every API request must carry (None: ``GPUBENCH_SANDBOX_TOKEN`` from the
    environment, else a new random one); :attr:`token` holds it.
    """

    def __init__(
        self,
        *,
        catalog: Catalog | str | Path | None = None,
        time_scale: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        workdir: str | Path | None = None,
        access_log: bool = False,
        ssh_server: str = "asyncssh",
        token: str | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if ssh_server not in SSH_SERVERS:
            raise ValueError(f"ssh_server must be one of {', '.join(SSH_SERVERS)}, not {ssh_server!r}")
        self.ssh_server = ssh_server
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        self.time_scale = time_scale
        self.host = host
        self.port = port
        self._workdir = Path(workdir) if workdir is not None else None
        self._owns_workdir = workdir is None
        self._access_log = access_log
        self._runner: web.AppRunner | None = None
        self.cloud: EmulatedCloud | None = None
        self.url = ""
        self.token = token or os.environ.get(TOKEN_ENV) or new_token()

    async def start(self) -> str:
        """Start serving; returns the base URL once the API answers."""
        if self.ssh_server == "openssh":
            sshd.require_sshd()  # before anything is bound or created
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="gpubench-sandbox-"))
        self.cloud = EmulatedCloud(
            self.catalog, time_scale=self.time_scale, workdir=self._workdir, ssh_server=self.ssh_server
        )
        runner = web.AppRunner(make_app(self.cloud, self.token), access_log=log if self._access_log else None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        self.cloud.start_lifecycle()
        await _wait_answering(self.host, port)
        log.info(
            "sandbox listening at %s (time scale %g, %s SSH, workdir %s)",
            self.url,
            self.time_scale,
            self.ssh_server,
            self._workdir,
        )
        return self.url

    async def close(self) -> SandboxSummary:
        """Stop every session and instance, stop serving, remove temporary files."""
        left = created = 0
        if self.cloud is not None:
            created = len(self.cloud.sessions)
            left = await self.cloud.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        return SandboxSummary(created=created, left_running=left)

    async def reset(self, *, catalog: Catalog | str | Path | None = None, time_scale: float | None = None) -> int:
        """Back to the state this sandbox started in, on the same address (see
        :meth:`EmulatedCloud.reset`); ``catalog`` (a :class:`Catalog` or a file) and
        ``time_scale`` replace the starting ones until the next reset. Returns how many
        sessions were still active."""
        if self.cloud is None:
            raise RuntimeError("the sandbox is not started")
        chosen = catalog if catalog is None or isinstance(catalog, Catalog) else load_catalog(catalog)
        left = await self.cloud.reset(catalog=chosen, time_scale=time_scale)
        self.catalog, self.time_scale = self.cloud.catalog, self.cloud.time_scale
        return left

    def state(self) -> dict[str, Any]:
        """Counts by status (as ``/sandbox/state`` reports them)."""
        return self.cloud.counts() if self.cloud else {}

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    catalog: Catalog | str | Path | None = None,
    time_scale: float = 1.0,
    ssh_server: str = "asyncssh",
    token: str | None = None,
) -> Sandbox:
    """Start a :class:`Sandbox` on the running loop; ``await sandbox.close()`` when done (its
    requests need ``sandbox.token``)."""
    sandbox = Sandbox(catalog=catalog, time_scale=time_scale, host=host, port=port, ssh_server=ssh_server,
                      token=token)
    await sandbox.start()
    return sandbox


class SandboxThread:
    """A :class:`Sandbox` on its own event loop in a daemon thread, for sync callers.

    ::

        with SandboxThread(time_scale=0.01) as sandbox:
            httpx.get(sandbox.url + "/health", headers=bearer(sandbox.token))
    """

    def __init__(self, **sandbox_args: Any) -> None:
        self.sandbox = Sandbox(**sandbox_args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gpubench-sandbox", daemon=True)
        self.url = ""
        self.token = self.sandbox.token

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the sandbox's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        try:
            self.url = self.run(self.sandbox.start(), timeout)
        except BaseException:
            self.stop()  # a sandbox that failed to start leaves no thread or files behind
            raise
        return self.url

    def reset(self, *, catalog: Catalog | str | Path | None = None, time_scale: float | None = None,
              timeout: float = 60.0) -> int:
        """:meth:`Sandbox.reset` from a sync caller."""
        return self.run(self.sandbox.reset(catalog=catalog, time_scale=time_scale), timeout)

    def stop(self, timeout: float = 60.0) -> SandboxSummary:
        try:
            return self.run(self.sandbox.close(), timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SandboxThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _wait_answering(host: str, port: int, timeout: float = 10.0) -> None:
    """Wait until ``GET /ready`` answers on the socket (not just until it is bound)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET /ready HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            status_line = await reader.readline()
            writer.close()
            if status_line.startswith(b"HTTP/"):
                return
        except OSError:
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"sandbox at {host}:{port} does not answer")
        await asyncio.sleep(0.02)


# -- program --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubench sandbox",
        description="Run the emulated GPU Shopper API with SSH instances on loopback.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    parser.add_argument("--catalog", default=None, help="catalog YAML (default: the shipped catalog)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies emulated delays: provisioning, install, pull, load (default 1.0)",
    )
    parser.add_argument(
        "--ssh-server",
        choices=SSH_SERVERS,
        default="asyncssh",
        help="what answers on each instance's SSH port: asyncssh in this process (default) "
        "or openssh, a real sshd per instance (needs openssh-server and root)",
    )
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request to stderr")
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when standard input closes: a parent that dies (even by SIGKILL) takes the sandbox with it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the sandbox until SIGTERM/SIGINT; the ``gpubench sandbox`` command."""
    args = _parser().parse_args(argv)
    if args.time_scale < 0:
        print("gpubench sandbox: --time-scale must be >= 0", file=sys.stderr)
        return 2
    try:
        catalog = load_catalog(args.catalog)
    except CatalogError as exc:
        print(f"gpubench sandbox: {exc}", file=sys.stderr)
        return 2
    problem = _shared_stdout()
    if problem:
        print(f"gpubench sandbox: {problem}", file=sys.stderr)
        return 2
    if args.ssh_server == "openssh":
        try:
            sshd.require_sshd()
        except sshd.SshServerUnavailable as exc:
            print(f"gpubench sandbox: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s gpubench-sandbox %(levelname)s %(message)s",
    )
    # asyncssh logs every connection at INFO: the plugin's SSH polling would drown the log.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    try:
        return asyncio.run(_serve_until_signal(catalog, args))
    except OSError as exc:
        print(f"gpubench sandbox: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _shared_stdout() -> str | None:
    """Why standard output must not get the token: a regular file that other users can read."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if stat.S_ISREG(mode) and mode & 0o077:
        return (f"standard output is a file other users can read (mode {stat.S_IMODE(mode):04o}), and the "
                "sandbox prints its API token there: write it to a private file (umask 077) or a pipe")
    return None


def _stop_on_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    if not os.read(sys.stdin.fileno(), 4096):
        loop.remove_reader(sys.stdin.fileno())
        stop.set()


def stop_on_signals(exit_with_stdin: bool) -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (and, with ``exit_with_stdin``, by standard input closing)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if exit_with_stdin:
        loop.add_reader(sys.stdin.fileno(), _stop_on_eof, loop, stop)
    return stop


async def _serve_until_signal(catalog: Catalog, args: argparse.Namespace) -> int:
    sandbox = Sandbox(
        catalog=catalog,
        time_scale=args.time_scale,
        host=args.host,
        port=args.port,
        access_log=args.verbose,
        ssh_server=args.ssh_server,
    )
    stop = stop_on_signals(args.exit_with_stdin)
    try:
        url = await sandbox.start()
        # The token goes to stdout only (a terminal, a pipe or a private file): the log never has it.
        sys.stdout.write(f"{URL_PREFIX}{url}\n{TOKEN_LINE_PREFIX}{sandbox.token}\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        summary = await sandbox.close()
        print(summary.line(), file=sys.stderr, flush=True)
    return 0


# ------------------------------------------------------------ machines for the hosts and local providers

#: The sandbox's clock for its machines: a 30 s Ollama install takes 0.6 s.
HOSTS_TIME_SCALE = 0.02


@dataclass(frozen=True)
class HostPlan:
    """One machine to start: its inventory name, GPU type and GPU count."""

    name: str
    gpu: str = "RTX 4090"
    gpus: int = 1
    #: Ollama installed already (else the cell's install command installs the stand-in).
    ollama: bool = False


def catalog_offer(catalog: Catalog, gpu: str, gpus: int) -> OfferSpec:
    """A catalog offer of ``gpu`` (its rates, pull speed and disk), with ``gpus`` GPUs."""
    for offer in catalog.offers:
        if offer.gpu_type.lower() == gpu.lower():
            return offer.model_copy(update={"gpu_count": gpus})
    known = sorted({offer.gpu_type for offer in catalog.offers})
    raise ValueError(f"the sandbox catalog has no {gpu!r}; known GPUs: {', '.join(known)}")


class SandboxHosts:
    """N sandbox machines reachable over SSH, and the inventory that names them."""

    def __init__(self, workdir: Path, plans: Sequence[HostPlan], *, catalog: Catalog | str | Path | None = None,
                 time_scale: float = HOSTS_TIME_SCALE, ssh_server: str = "asyncssh",
                 inventory_extra: dict[str, Any] | None = None) -> None:
        self.workdir = Path(workdir)
        self.plans = list(plans)
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        self.time_scale = time_scale
        self.ssh_server = ssh_server
        self.inventory_extra = inventory_extra or {}
        self.key_file = self.workdir / "id_sandbox_hosts"
        self.inventory = self.workdir / "hosts.yaml"
        self.machines: dict[str, Instance] = {}

    async def start(self) -> Path:
        """Start every machine and write the key and ``hosts.yaml``; returns the inventory's path."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        key = await asyncio.get_running_loop().run_in_executor(
            None, lambda: asyncssh.generate_private_key("ssh-ed25519"))
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.export_private_key())
        hosts: dict[str, Any] = {}
        used: set[int] = set()
        for plan in self.plans:
            instance = self._instance(plan, key, used)
            port = await instance.start_ssh()
            self.machines[plan.name] = instance
            hosts[plan.name] = {"address": "127.0.0.1", "port": port, "user": "root", "key_file": self.key_file.name,
                                "gpu": plan.gpu, "gpus": plan.gpus, **self.inventory_extra.get(plan.name, {})}
        self.inventory.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False), encoding="utf-8")
        return self.inventory

    def _instance(self, plan: HostPlan, key: asyncssh.SSHKey, used: set[int]) -> Instance:
        offer = catalog_offer(self.catalog, plan.gpu, plan.gpus)
        root = self.workdir / "machines" / plan.name
        document = instance_document(self.catalog, offer, f"host-{plan.name}", self.time_scale, root / "state")
        ollama_port = free_port(used)
        used.add(ollama_port)
        instance = Instance(root, document, key, ollama_port=ollama_port, ollama_preinstalled=plan.ollama,
                            ssh_server=self.ssh_server)
        instance.build()
        return instance

    async def stop(self) -> None:
        """Stop every machine (its SSH server and every process it started)."""
        for instance in self.machines.values():
            await instance.stop(remove=False)
        self.machines.clear()


def local_machine(workdir: Path, gpu: str = "RTX 4090", gpus: int = 1, *, catalog: Catalog | None = None,
                  time_scale: float = HOSTS_TIME_SCALE) -> Instance:
    """A machine with no SSH whose ``environment()`` gives this one the stand-in GPUs and Ollama."""
    catalog = catalog or load_catalog()
    offer = catalog_offer(catalog, gpu, gpus)
    root = Path(workdir) / "local"
    document = instance_document(catalog, offer, "local", time_scale, root / "state")
    key = asyncssh.generate_private_key("ssh-ed25519")  # never listened with: it has no SSH
    instance = Instance(root, document, key, ollama_port=free_port(), ollama_preinstalled=True)
    instance.build()
    return instance


class SandboxHostsThread:
    """:class:`SandboxHosts` on an event loop of its own in a daemon thread, for sync callers (tests, the CLI)."""

    def __init__(self, workdir: Path, plans: Sequence[HostPlan], **options: Any) -> None:
        self.hosts = SandboxHosts(workdir, plans, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gpubench-sandbox-hosts", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> Path:
        return self.run(self.hosts.start())

    def stop(self) -> None:
        try:
            self.run(self.hosts.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


# ------------------------------------------------------------------ gpubench sandbox hosts

#: The line ``gpubench sandbox hosts`` prints once its machines answer: the inventory's path.
INVENTORY_PREFIX = "GPUBENCH_HOSTS="


def parse_host(text: str) -> HostPlan:
    """``NAME``, ``NAME=GPU`` or ``NAME=GPU*COUNT`` (``lab1=RTX 4090*2``)."""
    name, _, rest = text.partition("=")
    gpu, _, count = rest.partition("*")
    if not name.strip() or (count and not count.strip().isdigit()):
        raise ValueError(f"{text!r}: give NAME, NAME=GPU or NAME=GPU*COUNT, such as 'lab1=RTX 4090*2'")
    return HostPlan(name.strip(), gpu.strip() or HostPlan.gpu, int(count) if count else 1)


def hosts_main(argv: list[str] | None = None) -> int:
    """``gpubench sandbox hosts``: start machines, print ``GPUBENCH_HOSTS=<hosts.yaml>``, serve until stopped."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(
        prog="gpubench sandbox hosts",
        description="Start sandbox machines with real SSH on loopback and the stand-ins (no GPU Shopper API), "
                    "and write a hosts.yaml naming them, for `cloud: hosts` (docs/providers.md).")
    parser.add_argument("hosts", nargs="*", default=["lab1", "lab2"], metavar="NAME[=GPU[*COUNT]]",
                        help="the machines (default: lab1 lab2, one RTX 4090 each)")
    parser.add_argument("--dir", help="where the key, hosts.yaml and the machines go (default: a new temporary one)")
    parser.add_argument("--time-scale", type=float, default=HOSTS_TIME_SCALE,
                        help=f"the stand-ins' clock (installs, pulls, loads; default {HOSTS_TIME_SCALE})")
    parser.add_argument("--ssh-server", choices=("asyncssh", "openssh"), default="asyncssh")
    parser.add_argument("--exit-with-stdin", action="store_true", help="stop when standard input closes")
    args = parser.parse_args(argv)
    try:
        plans = [parse_host(text) for text in args.hosts]
        workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gpubench-hosts-"))
        machines = SandboxHosts(workdir, plans, time_scale=args.time_scale, ssh_server=args.ssh_server)
        for plan in plans:
            catalog_offer(machines.catalog, plan.gpu, plan.gpus)
    except ValueError as exc:
        print(f"gpubench sandbox hosts: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        stop = stop_on_signals(args.exit_with_stdin)
        try:
            inventory = await machines.start()
            print(f"{INVENTORY_PREFIX}{inventory}", flush=True)
            for plan in plans:
                instance = machines.machines[plan.name]
                print(f"  {plan.name}: {plan.gpus} x {plan.gpu}, ssh -i {machines.key_file} -p {instance.ssh_port} "
                      "root@127.0.0.1", file=sys.stderr, flush=True)
            await stop.wait()
        finally:
            await machines.stop()
        return 0

    return asyncio.run(serve())


#: What ``gpubench sandbox local`` prints: the variables that give a shell the stand-ins.
LOCAL_VARIABLES = ("PATH", "OLLAMA_HOST", "GPUBENCH_SANDBOX_INSTANCE", "GPUBENCH_SANDBOX_OWNER")


def local_main(argv: list[str] | None = None) -> int:
    """``gpubench sandbox local``: this machine's stand-in GPUs and Ollama, as ``export`` lines for a
    shell (``eval``), kept until stopped (the stand-ins' daemons end with this command)."""
    import argparse
    import shlex
    import sys
    import tempfile

    parser = argparse.ArgumentParser(
        prog="gpubench sandbox local",
        description="Give this machine stand-in GPUs and Ollama for `cloud: local` (docs/providers.md): prints "
                    "export lines for a shell and runs until stopped.")
    parser.add_argument("gpu", nargs="?", default="RTX 4090*1", metavar="GPU[*COUNT]")
    parser.add_argument("--dir", help="where the machine's files go (default: a new temporary folder)")
    parser.add_argument("--time-scale", type=float, default=HOSTS_TIME_SCALE)
    parser.add_argument("--exit-with-stdin", action="store_true", help="stop when standard input closes")
    args = parser.parse_args(argv)
    try:
        plan = parse_host(f"local={args.gpu}")
        machine = local_machine(Path(args.dir or tempfile.mkdtemp(prefix="gpubench-local-")), plan.gpu, plan.gpus,
                                time_scale=args.time_scale)
    except ValueError as exc:
        print(f"gpubench sandbox local: {exc}", file=sys.stderr)
        return 2
    environment = machine.environment()
    for name in LOCAL_VARIABLES:
        print(f"export {name}={shlex.quote(environment[name])}", flush=True)

    async def wait() -> int:
        await stop_on_signals(args.exit_with_stdin).wait()
        await machine.stop(remove=False)
        return 0

    return asyncio.run(wait())
