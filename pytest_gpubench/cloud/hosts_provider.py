"""The ``hosts`` and ``local`` providers: machines a run does not rent but leases GPUs on.

``cloud: hosts`` benchmarks on the machines of an inventory (:mod:`.hosts_inventory`,
named by the matrix's ``hosts:`` or ``--gpubench-hosts``); ``cloud: local`` on this
machine, with no SSH (``SshDetails.local``), its GPUs read from its own ``nvidia-smi``.
Cells go through the same stages, records and reports as rented ones; cost is the
declared price (the inventory's, 0 by default) for the GPUs the cell holds.

Nothing is created or destroyed: an offer is a machine with enough GPUs of the cell's
type (a row's ``provider:`` is ``hosts`` for any host, or a host's name or tag to pin it);
:meth:`create` leases the GPUs through the store (:class:`.gpu_leasing.GpuLeaseKeeper`),
and the session is ``running`` once it holds them: :meth:`wait_running` waits, with
progress, while every matching GPU is busy (another cell, worker or run holds it), up to
the provision timeout. :attr:`SshDetails.gpu_indices` are the leased GPUs. Two cells never
share one server: the OpenAI-API servers start one per cell on a free port, with files of
its own (``RuntimeFacts.server_per_cell``, in the runtime's declaration), and lease only the cell's GPUs; any other runtime (Ollama
serves one server per machine, on its ``OLLAMA_HOST``) leases every GPU of the machine,
while its server sees only the cell's ``gpus`` of them (``runtimes/base.py``).
:meth:`release` ends the lease; the machine stays as it was (the cell's teardown stops
servers it started, ``plugin/fixtures.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ApiError, InventoryError, NoEligibleOffer, Stage, StageError
from ..matrix.launch import LaunchSpec
from ..matrix.fields import HOSTS_CLOUD, KEPT_MACHINES, LOCAL_CLOUD
from ..matrix.cells import MICROBENCH_MODEL
from ..matrix.selection import gpu_matches
from ..gpuinfo import gpu_type_of, parse_gpu_query_csv
from ..runtime_facts import server_per_cell
from ..settings import Settings
from .gpu_leasing import WAIT_POLL_SECONDS, GpuLeaseBook, GpuLeaseKeeper
from .hosts_inventory import Host, HostsInventory, load_inventory
from .provider import HOLDING_STATUSES, Constraints, CreatedSession, Offer, OfferChoice, Released, Session, SshDetails



def own_gpus_only(runtime: str) -> bool:
    """Whether a cell on ``runtime`` leases only the GPUs it runs on: a runtime that starts a server of its
    own per cell, on a free port with files of its own (its declaration's ``server_per_cell``,
    ``runtimes/registry.py``), or a microbenchmark (``microbench``: one process on its one GPU).
    Any other (Ollama: one server per machine on its OLLAMA_HOST; container workers) leases every GPU of
    the machine, so no two cells share, or disturb, one server."""
    return runtime == MICROBENCH_MODEL or server_per_cell(runtime)
#: How these providers' session ids start (``hosts-lab1-3-ab12cd``): cleanup knows them by it.
MACHINE_SESSION_PREFIXES = tuple(f"{cloud}-" for cloud in sorted(KEPT_MACHINES))


def on_leased_machine(session_id: str) -> bool:
    """Whether ``session_id`` is a ``hosts``/``local`` session: a GPU lease, nothing any API can release."""
    return session_id.startswith(MACHINE_SESSION_PREFIXES)


#: ``~/.ssh/known_hosts``: checked after an inventory's own known_hosts file.
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


def leased(machine: Machine, gpus: int, runtime: str) -> int:
    """How many of ``machine``'s GPUs a cell of ``gpus`` GPUs on ``runtime`` leases: its ``gpus`` for a
    runtime with a server per cell (:func:`own_gpus_only`), else all of them."""
    return gpus if own_gpus_only(runtime) else machine.gpus


class Machine:
    """One leasable machine: how to reach it and what it declares."""

    def __init__(self, name: str, key: str, gpu: str, gpus: int, price_per_hour: float, *, host: Host | None = None,
                 location: str = "", port: int = 0, indices: tuple[int, ...] = (),
                 all_indices: tuple[int, ...] = ()) -> None:
        self.name, self.key, self.gpu, self.gpus, self.port = name, key, gpu, gpus, port
        self.price_per_hour, self.host, self.location = price_per_hour, host, location
        #: The GPUs (nvidia-smi indices) of this type a lease may claim: on a machine with mixed GPUs,
        #: each type is a machine of its own (same ``key``: one lease table) with its own indices.
        self.indices = indices or tuple(range(gpus))
        #: Every GPU of the physical machine: what a runtime with one server per machine leases, so
        #: that no cell of another GPU type shares (or ends) its server.
        self.all_indices = all_indices or self.indices
        self.keep_models = True


class _Pending:
    """A session created for an offer, waiting for (or holding) its GPUs."""

    def __init__(self, session: Session, machine: Machine, count: int, *, whole_machine: bool = False) -> None:
        self.session, self.machine, self.count = session, machine, count
        #: A runtime with one server per machine: every GPU of the physical machine is leased.
        self.whole_machine = whole_machine
        self.lease_id: str | None = None
        self.gpu_indices: tuple[int, ...] = ()


class MachineProvider:
    """What the ``hosts`` and ``local`` providers share: offers from machines, GPU leases, sessions."""

    where = ""
    cloud = ""

    def __init__(self, settings: Settings, store: Callable[[], GpuLeaseBook] | None = None) -> None:
        self.settings = settings
        self._store = store
        self._keeper: GpuLeaseKeeper | None = None
        self._sessions: dict[str, _Pending] = {}
        self._numbers = itertools.count(1)
        #: Every machine offered so far, by name: an offer names its machine (the inventory is the cell's).
        self._known: dict[str, Machine] = {}

    # ------------------------------------------------------------------ machines

    def machines(self, wanted: Constraints | None) -> list[Machine]:
        """The machines this provider offers (for a cell's constraints, or all)."""
        raise NotImplementedError

    def machine_matches(self, machine: Machine, wanted: Constraints) -> bool:
        """Whether the row's ``provider:`` picks ``machine``."""
        return True

    def ssh_for(self, machine: Machine, gpu_indices: tuple[int, ...]) -> SshDetails:
        raise NotImplementedError

    # ------------------------------------------------------------------ the Provider protocol

    async def ready(self, attempts: int = 10) -> None:
        return None

    def _machines(self, wanted: Constraints | None) -> list[Machine]:
        found = self.machines(wanted)
        self._known.update((machine.name, machine) for machine in found)
        return found

    async def offers(self) -> list[Offer]:
        machines = await asyncio.to_thread(self._machines, None)  # may read a file or run nvidia-smi
        return [self._offer(machine, machine.gpus, self.cloud) for machine in machines]

    def _offer(self, machine: Machine, count: int, provider: str) -> Offer:
        share = machine.price_per_hour * count / machine.gpus  # the GPUs the cell holds, of the whole machine
        offer_id = machine.name if count == machine.gpus else f"{machine.name}/gpus={count}"
        return Offer(id=offer_id, provider=provider, provider_id=machine.name, gpu_type=machine.gpu,
                     gpu_count=count, price_per_hour=round(share, 6), location=machine.location,
                     machine_id=machine.name, fetched_at=datetime.now(timezone.utc))

    def _cell_offer(self, machine: Machine, wanted: Constraints) -> Offer:
        """``machine`` offered to a cell with ``wanted``: the GPUs it leases (:func:`leased`), at their share."""
        return self._offer(machine, leased(machine, wanted.gpu_count, wanted.runtime), wanted.provider)

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        machines = await asyncio.to_thread(self._machines, wanted)  # may read a file or run nvidia-smi
        candidates = [m for m in machines if self.machine_matches(m, wanted) and gpu_matches(wanted.gpu, m.gpu)]
        if not candidates:
            known = ", ".join(f"{m.name} ({m.gpus} x {m.gpu})" for m in machines) or "none"
            raise NoEligibleOffer(f"no {self.cloud} machine with a {wanted.gpu} for provider {wanted.provider!r} "
                                  f"(machines: {known})")
        eligible, too_small, too_dear = [], [], []
        for machine in candidates:
            if machine.gpus < wanted.gpu_count:
                too_small.append(machine.name)
            elif wanted.max_price is not None and self._cell_offer(machine, wanted).price_per_hour > wanted.max_price:
                too_dear.append(machine.name)
            else:
                eligible.append(machine)
        if not eligible:
            parts = [f"{', '.join(too_small)}: fewer than {wanted.gpu_count} GPUs"] if too_small else []
            parts += [f"{', '.join(too_dear)}: over the price cap of ${wanted.max_price:.2f}/h"] if too_dear else []
            raise NoEligibleOffer(f"{len(candidates)} {self.cloud} machine(s) with a {wanted.gpu}, none eligible: "
                                  + "; ".join(parts))
        offers = {m.name: self._cell_offer(m, wanted) for m in eligible}
        free = {m.name: await self._free_gpus(m) for m in eligible}
        # Free GPUs now first, then the cheapest: cells spread over idle machines rather than queue on one.
        eligible.sort(key=lambda m: (free[m.name] < offers[m.name].gpu_count, offers[m.name].price_per_hour, m.name))
        ordered = [offers[m.name] for m in eligible]
        return OfferChoice(ordered[0], len(candidates), ordered, wanted)

    async def _free_gpus(self, machine: Machine) -> int:
        if self._store is None:
            return machine.gpus
        held = await self.keeper().busy_with(machine.key)
        return machine.gpus - len({i for lease in held for i in lease.gpu_indices} & set(machine.indices))

    async def template_image(self, hash_id: str) -> str | None:
        return None

    async def create(self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
                     ssh_timeout_minutes: int | None = None, disk_gb: int | None = None,
                     launch: LaunchSpec | None = None, runtime: str = "", model: str = "") -> CreatedSession:
        machine = self._machine_of(offer)
        pending = self._pending_on(machine, offer, consumer, hours, runtime)
        placed = None
        if not await self._claim(pending):
            # Taken since it was offered (another worker chose it at the same moment): an idle machine
            # of the same shape and no dearer serves the cell now, rather than it queueing on this one.
            for other in self._interchangeable(machine, offer):
                instead = self._offer(other, offer.gpu_count, offer.provider)
                moved = self._pending_on(other, instead, consumer, hours, runtime)
                if await self._claim(moved):
                    pending, placed = moved, instead
                    break
        self._sessions[pending.session.id] = pending
        return CreatedSession(session=pending.session, ssh_private_key="", placed=placed)

    def _pending_on(self, machine: Machine, offer: Offer, consumer: str, hours: int, runtime: str) -> _Pending:
        count = leased(machine, offer.gpu_count, runtime)
        session = Session(id=f"{self.cloud}-{machine.name}-{next(self._numbers)}-{uuid.uuid4().hex[:6]}",
                          consumer_id=consumer, provider=offer.provider, gpu_type=machine.gpu, gpu_count=count,
                          status="pending", ssh_host=machine.location, ssh_port=machine.port,
                          price_per_hour=offer.price_per_hour, reservation_hours=hours,
                          created_at=datetime.now(timezone.utc), offer_id=offer.id)
        return _Pending(session, machine, count, whole_machine=not own_gpus_only(runtime))

    def _interchangeable(self, machine: Machine, offer: Offer) -> list[Machine]:
        """Other known machines a cell offered ``machine`` may run on instead: the same GPU type and
        count, no dearer, picked by the same ``provider:``; cheapest first."""
        wanted = Constraints(gpu=machine.gpu, provider=offer.provider, vram_gb=0.0, gpu_count=offer.gpu_count)
        same = [m for m in self._known.values()
                if m.name != machine.name and m.gpu == machine.gpu and m.gpus == machine.gpus
                and m.price_per_hour <= machine.price_per_hour and self.machine_matches(m, wanted)]
        return sorted(same, key=lambda m: (m.price_per_hour, m.name))

    def _machine_of(self, offer: Offer) -> Machine:
        name = str(offer.machine_id or offer.id.partition("/")[0])
        if name not in self._known:
            self._machines(None)
        try:
            return self._known[name]
        except KeyError:
            raise StageError(Stage.PROVISION, f"no {self.cloud} machine {name!r} was offered") from None

    async def _claim(self, pending: _Pending) -> bool:
        machine = pending.machine
        candidates = machine.all_indices if pending.whole_machine else machine.indices
        count = len(candidates) if pending.whole_machine else pending.count
        lease = await self.keeper().try_claim(machine.key, list(candidates), count,
                                              holder=pending.session.consumer_id)
        if lease is None:
            return False
        # The cell's own GPUs of what it leased: a whole mixed machine's other types are held, not used.
        pending.lease_id = lease.lease_id
        pending.gpu_indices = tuple(i for i in lease.gpu_indices if i in machine.indices)
        pending.session.status = "running"
        return True

    async def wait_running(self, session_id: str, on_poll: Callable[[Session, float], None] | None = None,
                           timeout: float | None = None) -> Session:
        pending = self._pending(session_id, Stage.PROVISION)
        bound = self.settings.stage_timeout(Stage.PROVISION)
        bound = min(bound, timeout) if timeout else bound
        started = time.monotonic()
        while pending.session.status == "pending":
            waited = time.monotonic() - started
            if waited >= bound:
                holders = await self.keeper().busy_with(pending.machine.key)
                held = "; ".join(f"GPU(s) {list(lease.gpu_indices)} by {lease.holder}" for lease in holders)
                raise StageError(Stage.PROVISION, f"{pending.count} GPU(s) of {self.cloud} machine "
                                                  f"{pending.machine.name} stayed busy for {waited:.0f} s "
                                                  f"({held or 'no lease now'})",
                                 hint="another cell, worker or run holds them; a dead run's lease expires after "
                                      "--gpubench-gpu-lease-ttl")
            if on_poll is not None:
                on_poll(pending.session.model_copy(update={"status": "waiting_for_gpu"}), waited)
            await asyncio.sleep(min(WAIT_POLL_SECONDS, max(self.settings.gpu_lease_seconds / 6, 0.05)))
            if pending.session.status == "pending":
                await self._claim(pending)
        if pending.session.status != "running":
            raise StageError(Stage.PROVISION, f"session {session_id} is {pending.session.status}")
        return pending.session

    def ssh_details(self, created: CreatedSession, running: Session) -> SshDetails:
        pending = self._pending(running.id, Stage.SSH_CONNECT)
        return self.ssh_for(pending.machine, pending.gpu_indices)

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        pending = self._pending(session_id, stage)
        if pending.lease_id and pending.session.status == "running" and self.keeper().lost(pending.lease_id):
            pending.session.status = "failed"  # its GPUs may be another's now: the cell must not go on
            pending.session.error = self.keeper().lost(pending.lease_id)
        return pending.session

    def _pending(self, session_id: str, stage: Stage) -> _Pending:
        pending = self._sessions.get(session_id)
        if pending is None:
            raise ApiError(stage, 404, f"no {self.cloud} session {session_id}", call=f"session {session_id}")
        return pending

    async def owned_sessions(self, consumer: str | None = None) -> list[Session]:
        return [p.session for p in self._sessions.values()
                if p.session.status in HOLDING_STATUSES and (consumer is None or p.session.consumer_id == consumer)]

    async def release(self, session_id: str) -> Released:
        pending = self._sessions.get(session_id)
        if pending is None:
            return Released(session_id=session_id, before=None, after=None)
        before = pending.session.status
        if pending.lease_id is not None:
            await self.keeper().release(pending.lease_id)
        pending.session.status = "stopped"  # the GPUs are free; the machine itself stays as it is
        return Released(session_id=session_id, before=before, after="stopped")

    async def session_cost(self, session_id: str) -> float | None:
        return None  # nobody bills it: the declared price and the time held are the cost

    async def aclose(self) -> None:
        if self._keeper is not None:
            await self._keeper.release_all()
        self._sessions.clear()

    def keeper(self) -> GpuLeaseKeeper:
        if self._keeper is None:
            if self._store is None:
                raise StageError(Stage.PROVISION, f"the {self.cloud} provider leases GPUs through the run's store; "
                                                  "this command has none")
            self._keeper = GpuLeaseKeeper(self._store, self.settings.gpu_lease_seconds,
                                          holder_prefix=f"{self.settings.run_id}/", run_id=self.settings.run_id)
        return self._keeper


class HostsProvider(MachineProvider):
    """``cloud: hosts``: the machines of a hosts inventory, over SSH."""

    where = "hosts"
    cloud = HOSTS_CLOUD

    def inventory(self, wanted: Constraints | None) -> HostsInventory | None:
        """The inventory: ``--gpubench-hosts``, else the cell's matrix's ``hosts:``; a bad one is an
        ``inventory`` stage error naming the file and field."""
        path = self.settings.hosts or (wanted.hosts_file if wanted is not None else None)
        if path is None:
            if wanted is None:
                return None
            raise StageError(Stage.INVENTORY, "`cloud: hosts` needs a hosts inventory: `hosts: FILE` in the matrix "
                                              "or --gpubench-hosts FILE (docs/providers.md)")
        try:
            return load_inventory(path)
        except InventoryError as exc:
            raise StageError(Stage.INVENTORY, str(exc)) from None

    def machines(self, wanted: Constraints | None) -> list[Machine]:
        inventory = self.inventory(wanted)
        if inventory is None:
            return []
        return [Machine(host.name, f"{host.address}:{host.port}", host.gpu, host.gpus, host.price_per_hour,
                        host=host, location=host.address, port=host.port) for host in inventory.hosts.values()]

    def machine_matches(self, machine: Machine, wanted: Constraints) -> bool:
        return machine.host is not None and machine.host.matches(wanted.provider)

    def ssh_for(self, machine: Machine, gpu_indices: tuple[int, ...]) -> SshDetails:
        host = machine.host
        assert host is not None
        known = tuple(path for path in (host.known_hosts, str(Path(USER_KNOWN_HOSTS).expanduser())) if path)
        pin_file = str(Path(self.settings.known_hosts).expanduser())
        if self.settings.host_keys == "strict":
            # Keys pinned before (or put there by hand) are still known; no new one is pinned.
            known, pin_file = (*known, pin_file), ""
        return SshDetails(host=host.address, port=host.port, user=host.user, private_key="",
                          key_file=host.key_file or "", agent=host.agent, gpu_indices=gpu_indices, known_hosts=known,
                          pin_file=pin_file, keep_models=host.keep_models)


class LocalProvider(MachineProvider):
    """``cloud: local``: this machine, no SSH; its GPUs from its own ``nvidia-smi``."""

    where = "local"
    cloud = LOCAL_CLOUD

    def __init__(self, settings: Settings, store: Callable[[], GpuLeaseBook] | None = None) -> None:
        super().__init__(settings, store)
        self._gpus: list[tuple[int, str]] | None = None

    def gpus_here(self) -> list[tuple[int, str]]:
        """This machine's GPUs (``nvidia-smi``'s index and name), read once; empty without a driver."""
        if self._gpus is None:
            program = shutil.which("nvidia-smi")
            names: list[tuple[int, str]] = []
            if program is not None:
                try:
                    done = subprocess.run([program, "--query-gpu=index,name", "--format=csv,noheader,nounits"],
                                          capture_output=True, text=True, timeout=30, check=False)
                    rows = parse_gpu_query_csv(done.stdout, "index,name") if done.returncode == 0 else []
                    names = [(int(row["index"]), str(row["name"])) for row in rows
                             if isinstance(row["index"], int) and row["name"]]
                except (OSError, subprocess.TimeoutExpired):
                    names = []
            self._gpus = names
        return self._gpus

    def machines(self, wanted: Constraints | None) -> list[Machine]:
        gpus = self.gpus_here()
        if not gpus:
            if wanted is None:
                return []
            raise NoEligibleOffer("this machine has no NVIDIA GPU to lease (nvidia-smi is missing or lists none)")
        price, keep = 0.0, True
        path = self.settings.hosts or (wanted.hosts_file if wanted is not None else None)
        if path is not None:
            try:
                declared = load_inventory(path).local
                price, keep = declared.price_per_hour, declared.keep_models
            except InventoryError as exc:
                raise StageError(Stage.INVENTORY, str(exc)) from None
        name = socket.gethostname() or "localhost"
        by_type: dict[str, list[int]] = {}
        for index, product in gpus:
            by_type.setdefault(gpu_type_of(product), []).append(index)
        machines = []
        for gpu, indices in by_type.items():
            # One machine per GPU type, leasing only its own indices; the price is the machine's share.
            label = LOCAL_CLOUD if len(by_type) == 1 else f"{LOCAL_CLOUD}-{re.sub(r'[^a-z0-9]+', '-', gpu.lower())}"
            machine = Machine(label, f"local:{name}", gpu, len(indices), price * len(indices) / len(gpus),
                              location=name, indices=tuple(indices), all_indices=tuple(i for i, _ in gpus))
            machine.keep_models = keep
            machines.append(machine)
        return machines

    def ssh_for(self, machine: Machine, gpu_indices: tuple[int, ...]) -> SshDetails:
        return SshDetails(host="localhost", port=0, user="", private_key="", local=True, gpu_indices=gpu_indices,
                          keep_models=machine.keep_models)
