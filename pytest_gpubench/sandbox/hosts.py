"""Sandbox machines for the ``hosts`` and ``local`` providers: no GPU Shopper API, just machines.

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

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import yaml

from .catalog import Catalog, OfferSpec, load_catalog
from .instances import Instance, free_port, instance_document

T = TypeVar("T")
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


def main(argv: list[str] | None = None) -> int:
    """``gpubench sandbox hosts``: start machines, print ``GPUBENCH_HOSTS=<hosts.yaml>``, serve until stopped."""
    import argparse
    import sys
    import tempfile

    from .server import stop_on_signals

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

    from .server import stop_on_signals

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
