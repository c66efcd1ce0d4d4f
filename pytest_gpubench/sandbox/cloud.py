"""The emulated GPU Shopper: inventory, session state machine, lifecycle, costs.

Behaviour follows the server's provisioner and lifecycle manager:

- create: record ``pending`` -> ``provisioning`` (``ssh_port`` 22, ``ssh_user`` root,
  no host) and answer 201; a create the provider refuses fails the record and
  answers 503 ``stale_inventory`` or 500.
- boot (after the offer's provisioning time, time-scaled): the instance's SSH
  server (asyncssh, or OpenSSH's ``sshd`` with ``ssh_server="openssh"``) starts
  and its host and port appear on the still-``provisioning``
  session; the server's own SSH login with the session key then makes it
  ``running``. No login before the SSH timeout means ``failed``.
- ``done``/``DELETE``: ``stopping``, the instance is destroyed, ``stopped`` after
  the destroy check (answer returns once stopped). ``DELETE`` of a ``failed``
  session that had an instance turns it ``stopped``, keeping its error; the
  lifecycle tick does the same on its own.
- lifecycle tick: hourly billing, expiry of ``running`` sessions past
  ``expires_at``, the 12-hour hard cap, failed -> stopped.

**Costs**: the sandbox's clock and its cost ledger, billed by the clock hour like the server.
The real cost tracker does two things:

- every hour (a ticker started with the server) it records ``price_per_hour`` for
  each session that is ``running`` at that moment, keyed by the clock hour;
- when a session *fails*, it records ``price_per_hour`` for every clock hour the
  session touched (at least one).

So a session stopped normally within its first hour costs 0 in ``/costs``, while a
failed one costs at least an hour. :class:`Ledger` keeps one record per
(session, clock hour), as the server's ``ON CONFLICT`` upsert does.

:class:`Clock` is wall-clock time plus an offset, so tests can jump forward
(``POST /sandbox/clock``) to see hourly billing, expiry and the 12-hour cap.

**Sessions**: records of the emulated API and the JSON the server answers for them.
The record holds what the server stores (``models.Session``); :meth:`SessionRecord.response`
is the server's ``SessionResponse``: no ``offer_id``, no ``stopped_at``, no
``idle_threshold_minutes``, and every ``omitempty`` field left out when empty, so a
new session shows ``ssh_port: 22`` and ``ssh_user: "root"`` but no ``ssh_host``.
:meth:`SessionRecord.state` adds what only the sandbox shows (``/sandbox/state``).

**Inventory**: the catalog's offers as the server lists and looks them up.
Like the server's inventory service:

- listings hold only ``available`` offers, filtered exactly (``gpu_type`` must equal
  the offer's, "A100" does not match "A100 80GB"), sorted by availability
  confidence (highest first), then price (lowest first);
- a lookup by id searches the provider cache, rented offers included;
- an offer whose create failed is evicted from the cache until the provider's
  cache TTL (time-scaled) has passed: it vanishes from listings and lookups.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from . import docker_standin, entrypoint, sshd
from .catalog import Catalog, OfferSpec, availability_confidence, format_time, offer_json, offer_vram_gb
from .faults import DRIVER_TOOLS, PULL_ERROR_MESSAGE, WORKER_FAULTS, FaultBook, FaultRequest
from .instance_spec import InstanceSpec
from .instances import SSH_SERVERS, Instance, UnsupportedFault, free_port, instance_document
from .schemas import RETRY_SCOPES, WORKLOAD_TYPES
from .standin_state import PullFault, StreamFault, served_fields

# ------------------------------------------------------------ costs

HOUR = 3600.0


class Clock:
    """UTC wall-clock time that can be advanced (never moved back)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def timestamp(self) -> float:
        return time.time() + self.offset

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp(), tz=timezone.utc)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the sandbox clock only moves forward")
        self.offset += seconds


class Billable(Protocol):
    """What the ledger reads from a session record."""

    id: str
    consumer_id: str
    provider: str
    gpu_type: str
    price_per_hour: float


@dataclass(frozen=True)
class CostRecord:
    session_id: str
    consumer_id: str
    provider: str
    gpu_type: str
    hour: datetime
    amount: float


class Ledger:
    """Cost records, one per (session, clock hour)."""

    def __init__(self, started: datetime) -> None:
        self._records: dict[tuple[str, datetime], CostRecord] = {}
        self.next_tick = started + timedelta(seconds=HOUR)

    def record(self, record: CostRecord) -> None:
        self._records[(record.session_id, record.hour)] = record

    def hourly_ticks(self, now: datetime, running: Iterable[Billable]) -> int:
        """Fire every hourly tick due by ``now``; returns how many fired.

        ``running`` yields session records (``id``, ``consumer_id``, ``provider``,
        ``gpu_type``, ``price_per_hour``) running at the time of the call.
        """
        sessions = list(running)
        fired = 0
        while now >= self.next_tick:
            hour = floor_hour(self.next_tick)
            for session in sessions:
                self.record(_record_for(session, hour))
            self.next_tick += timedelta(seconds=HOUR)
            fired += 1
        return fired

    def final_cost(self, session: Billable, created_at: datetime, ended_at: datetime) -> None:
        """Bill every clock hour a failed session touched (the server's RecordFinalCost)."""
        if session.price_per_hour <= 0 or ended_at <= created_at:
            return
        hour = floor_hour(created_at)
        while hour <= ended_at:
            self.record(_record_for(session, hour))
            hour += timedelta(seconds=HOUR)

    def session_cost(self, session_id: str) -> float:
        return round(sum(r.amount for r in self._records.values() if r.session_id == session_id), 10)

    def summary(self, consumer_id: str, start: datetime, end: datetime) -> dict[str, object]:
        """The server's cost summary over ``[start, end)`` of clock hours."""
        chosen = [
            r
            for r in self._records.values()
            if start <= r.hour < end and (not consumer_id or r.consumer_id == consumer_id)
        ]
        body: dict[str, object] = {
            "total_cost": round(sum(r.amount for r in chosen), 10),
            "session_count": len({r.session_id for r in chosen}),
            "hours_used": float(len(chosen)),
            "period_start": start,
            "period_end": end,
        }
        if consumer_id:
            body = {"consumer_id": consumer_id, **body}
        return body


def floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The current calendar month, the server's default cost period."""
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def _record_for(session: Billable, hour: datetime) -> CostRecord:
    return CostRecord(
        session_id=session.id,
        consumer_id=session.consumer_id,
        provider=session.provider,
        gpu_type=session.gpu_type,
        hour=hour,
        amount=session.price_per_hour,
    )


# ------------------------------------------------------------ sessions

ACTIVE = frozenset({"pending", "provisioning", "running"})
TERMINAL = frozenset({"stopped", "failed"})


class ApiFailure(Exception):
    """An error answer: HTTP ``status`` and the JSON body (``request_id`` is added later)."""

    def __init__(self, status: int, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.body: dict[str, Any] = {"error": error, **extra}


class SessionTerminal(ApiFailure):
    """``done``/``extend`` on a session that is over (the server's 409)."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(409, f"session {session_id} is in terminal state: {status}")


@dataclass
class SessionRecord:
    """One session, as the server stores it, plus the sandbox's handles."""

    id: str
    consumer_id: str
    offer_id: str
    provider: str
    gpu_type: str
    gpu_count: int
    workload_type: str
    reservation_hours: int
    price_per_hour: float
    created_at: datetime
    expires_at: datetime
    status: str = "pending"
    error: str = ""
    provider_instance_id: str = ""
    ssh_host: str = ""
    ssh_port: int = 0
    ssh_user: str = ""
    idle_threshold_minutes: int = 0
    storage_policy: str = "destroy"
    template_hash_id: str = ""
    disk_gb: int = 0
    auto_retry: bool = False
    retry_count: int = 0
    failed_offers: str = ""
    stopped_at: datetime | None = None
    #: Entrypoint mode (``launch_mode: entrypoint``): the image serves ``model_id`` on ``api_port``.
    launch_mode: str = ""
    docker_image: str = ""
    model_id: str = ""
    exposed_ports: list[int] = field(default_factory=list)
    api_port: int = 0
    api_endpoint: str = ""
    # -- sandbox only ----------------------------------------------------------
    instance: Instance | None = None
    ollama_port: int = 0
    boot_task: asyncio.Task[Any] | None = None
    failed_at: float | None = None  # loop time of the failure, for failed -> stopped
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def response(self) -> dict[str, Any]:
        """The server's ``SessionResponse`` for this session."""
        body: dict[str, Any] = {
            "id": self.id,
            "consumer_id": self.consumer_id,
            "provider": self.provider,
            "gpu_type": self.gpu_type,
            "gpu_count": self.gpu_count,
            "status": self.status,
        }
        optional = {
            "error": self.error,
            "ssh_host": self.ssh_host,
            "ssh_port": self.ssh_port,
            "ssh_user": self.ssh_user,
            "launch_mode": self.launch_mode,
            "api_endpoint": self.api_endpoint,
            "api_port": self.api_port,
            "model_id": self.model_id,
            "template_hash_id": self.template_hash_id,
            "disk_gb": self.disk_gb,
        }
        body.update({k: v for k, v in optional.items() if v})
        body.update(
            {
                "workload_type": self.workload_type,
                "reservation_hours": self.reservation_hours,
                "price_per_hour": self.price_per_hour,
                "created_at": format_time(self.created_at),
                "expires_at": format_time(self.expires_at),
            }
        )
        retry = {"auto_retry": self.auto_retry, "retry_count": self.retry_count, "failed_offers": self.failed_offers}
        body.update({k: v for k, v in retry.items() if v})
        return body

    def state(self, cost: float) -> dict[str, Any]:
        """Everything the sandbox knows about the session (``/sandbox/state``)."""
        body = self.response()
        body.update(
            {
                "offer_id": self.offer_id,
                "provider_instance_id": self.provider_instance_id,
                "idle_threshold_minutes": self.idle_threshold_minutes,
                "storage_policy": self.storage_policy,
                "stopped_at": format_time(self.stopped_at) if self.stopped_at else None,
                "ollama_host": f"127.0.0.1:{self.ollama_port}" if self.ollama_port else None,
                "docker_image": self.docker_image or None,
                "exposed_ports": self.exposed_ports or None,
                "instance_dir": str(self.instance.root) if self.instance and not self.instance.stopped else None,
                "total_cost": cost,
                **served_fields(self.instance.served_requests if self.instance else {}),
            }
        )
        return body


# ------------------------------------------------------------ inventory

@dataclass
class OfferFilter:
    """Inventory query, as the server parses it (zero means "no constraint")."""

    provider: str = ""
    gpu_type: str = ""
    location: str = ""
    min_vram: int = 0
    max_price: float = 0.0
    min_gpu_count: int = 0
    min_reliability: float = 0.0
    min_availability_confidence: float = 0.0
    min_cuda: float = 0.0


class Inventory:
    """Offers of one sandbox, with the server's cache eviction."""

    def __init__(self, catalog: Catalog, time_scale: float) -> None:
        self.catalog = catalog
        self.time_scale = time_scale
        self._evicted: dict[str, float] = {}

    def _cached(self, offer: OfferSpec) -> bool:
        until = self._evicted.get(offer.id)
        return until is None or asyncio.get_running_loop().time() >= until

    def list_offers(self, query: OfferFilter, now: datetime) -> list[dict[str, Any]]:
        """Available offers matching ``query`` in the server's JSON and order."""
        if query.provider and query.provider not in self.catalog.providers:
            raise ApiFailure(400, f"provider not found: {query.provider}")
        chosen = [o for o in self.catalog.offers if o.available and self._cached(o) and self._matches(o, query)]
        chosen.sort(key=lambda o: (-availability_confidence(o), o.price_per_hour))
        return [offer_json(self.catalog, o, now) for o in chosen]

    def _matches(self, offer: OfferSpec, q: OfferFilter) -> bool:
        checks = (
            not q.provider or offer.provider == q.provider,
            not q.gpu_type or offer.gpu_type == q.gpu_type,
            not q.min_vram or offer_vram_gb(self.catalog, offer) >= q.min_vram,
            not q.max_price or offer.price_per_hour <= q.max_price,
            not q.location or q.location in offer.location,
            not q.min_reliability or offer.reliability >= q.min_reliability,
            not q.min_gpu_count or offer.gpu_count >= q.min_gpu_count,
            not q.min_availability_confidence or availability_confidence(offer) >= q.min_availability_confidence,
            not q.min_cuda or offer.cuda_version >= q.min_cuda,
        )
        return all(checks)

    def get_offer(self, offer_id: str) -> OfferSpec:
        """An offer still in the server's cache (rented ones included); else 404."""
        offer = self.catalog.offer(offer_id)
        if offer is None or not self._cached(offer):
            raise ApiFailure(404, f"offer not found: {offer_id}")
        return offer

    def evict(self, offer: OfferSpec) -> None:
        """Drop a failed offer from the cache until its provider's TTL passes."""
        ttl = self.catalog.providers[offer.provider].cache_ttl_seconds * self.time_scale
        self._evicted[offer.id] = asyncio.get_running_loop().time() + ttl


# ------------------------------------------------------------ the emulated cloud

log = logging.getLogger("pytest_gpubench.sandbox")

HARD_MAX_HOURS = 12
GHOST_ERROR = "Instance not found on provider during reconciliation"
_TICK_SECONDS = 0.2
# The server's fast-provision script for `llm` sessions without a template.
_LLM_ONSTART = """curl -fsSL https://ollama.com/install.sh | sh
nohup ollama serve > "$HOME/ollama.log" 2>&1 &
sleep {pause}
echo "Ollama installed and serving on port 11434"
"""


class EmulatedCloud:
    """All server-side state of one sandbox."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        time_scale: float,
        workdir: Path,
        clock: Clock | None = None,
        ssh_server: str = "asyncssh",
    ) -> None:
        if ssh_server not in SSH_SERVERS:
            raise ValueError(f"ssh_server must be one of {', '.join(SSH_SERVERS)}, not {ssh_server!r}")
        self.ssh_server = ssh_server
        self.workdir = workdir
        #: What :meth:`reset` returns to when it is given no other catalog or time scale.
        self.start_catalog, self.start_time_scale = catalog, time_scale
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lifecycle: asyncio.Task[Any] | None = None
        self._fresh_state(catalog, time_scale, clock or Clock())

    def _fresh_state(self, catalog: Catalog, time_scale: float, clock: Clock) -> None:
        """Everything a session, a fault or a request can change, as a new sandbox has it."""
        self.catalog = catalog
        self.time_scale = time_scale
        self.clock = clock
        self.ledger = Ledger(self.clock.now())
        self.faults = FaultBook()
        self.sessions: dict[str, SessionRecord] = {}
        self.benchmarks: list[Any] = []
        self.not_ready_until = 0.0
        #: Requests by the SHA-256 of their bearer token ("" for none): proves a client
        #: sends its token without the sandbox ever keeping the token itself.
        self.bearer_digests: dict[str, int] = {}
        self.inventory = Inventory(catalog, time_scale)
        self._stream_fault_ids = itertools.count(1)

    # -- helpers --------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        """Emulated seconds -> real seconds."""
        return seconds * self.time_scale

    def _now_loop(self) -> float:
        return asyncio.get_running_loop().time()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- sessions -------------------------------------------------------------------

    async def create_session(self, req: dict[str, Any]) -> tuple[SessionRecord, str]:
        """Create a session from a bound request; returns it and its private key (PEM)."""
        if req["workload_type"] not in WORKLOAD_TYPES:
            raise ApiFailure(400, "invalid workload_type: must be one of: " + ", ".join(WORKLOAD_TYPES))
        if req["auto_retry"] and req["retry_scope"] and req["retry_scope"] not in RETRY_SCOPES:
            raise ApiFailure(400, "invalid retry_scope: must be one of: same_gpu, same_vram, any")
        try:
            offer = self.inventory.get_offer(req["offer_id"])
        except ApiFailure:
            raise ApiFailure(404, f"offer not found: {req['offer_id'][:128]}") from None
        key = await asyncio.get_running_loop().run_in_executor(
            None, lambda: asyncssh.generate_private_key("ssh-rsa", key_size=2048)
        )
        # Checked after the only await, right before the insert: two concurrent creates
        # for one consumer and offer cannot both pass (the server's unique index).
        for other in self.sessions.values():
            if other.consumer_id == req["consumer_id"] and other.offer_id == offer.id and other.active:
                raise ApiFailure(
                    409,
                    f"consumer {req['consumer_id']} already has active session {other.id} "
                    f"for offer {offer.id} (status: {other.status})",
                )
        now = self.clock.now()
        record = SessionRecord(
            id=str(uuid.uuid4()),
            consumer_id=req["consumer_id"],
            offer_id=offer.id,
            provider=offer.provider,
            gpu_type=offer.gpu_type,
            gpu_count=offer.gpu_count,
            workload_type=req["workload_type"],
            reservation_hours=req["reservation_hours"],
            price_per_hour=offer.price_per_hour,
            created_at=now,
            expires_at=now + timedelta(hours=req["reservation_hours"]),
            idle_threshold_minutes=req["idle_threshold_minutes"],
            storage_policy="preserve" if req["storage_policy"] == "preserve" else "destroy",
            template_hash_id=req["template_hash_id"],
            disk_gb=req["disk_gb"],
            auto_retry=req["auto_retry"],
        )
        if req["launch_mode"] == "entrypoint":
            record.launch_mode, record.model_id = "entrypoint", req["model_id"]
            record.docker_image = entrypoint.image_of(req["docker_image"], req["workload_type"])
            record.exposed_ports = list(req["exposed_ports"] or [])
            # Only the first exposed port becomes the API port: none given, none set (the server's rule).
            record.api_port = record.exposed_ports[0] if record.exposed_ports else 0
        self.sessions[record.id] = record
        record.status = "provisioning"
        self._refuse_if_faulty(record, offer)
        record.provider_instance_id = _instance_id(offer)
        record.ssh_user, record.ssh_port = "root", 22
        record.boot_task = self._spawn(self._boot(record, offer, key, req))
        log.info("session %s created on %s (%s)", record.id, offer.id, offer.gpu_type)
        return record, key.export_private_key("pkcs1-pem").decode()

    def _refuse_if_faulty(self, record: SessionRecord, offer: OfferSpec) -> None:
        """The provider's CreateInstance: rented offers and armed faults fail here."""
        if not offer.available or self.faults.take("stale_inventory", offer.id):
            cause = (
                f"{offer.provider} CreateInstance failed: offer unavailable due to stale inventory"
                " - retry with different offer recommended"
            )
            self._fail(record, f"provider create failed: {cause}")
            self.inventory.evict(offer)
            raise ApiFailure(
                503,
                f"offer {offer.id} from {offer.provider} unavailable (stale inventory): {cause}"
                " - consider retrying with a different offer",
                error_type="stale_inventory",
                offer_id=offer.id,
                provider=offer.provider,
                retry_suggested=True,
                message="The selected offer is no longer available. "
                "Please refresh inventory and select a different offer.",
            )
        fault = self.faults.take("provision_error", offer.id, when="create")
        if fault:
            self._fail(record, f"provider create failed: {fault.message}")
            self.inventory.evict(offer)
            error_type, retry = classify_provision_error(fault.message)
            raise ApiFailure(
                500, f"failed to create instance: {fault.message}", error_type=error_type, retry_suggested=retry
            )

    async def _boot(self, record: SessionRecord, offer: OfferSpec, key: asyncssh.SSHKey, req: dict[str, Any]) -> None:
        try:
            await self._boot_steps(record, offer, key, req)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a sandbox bug or a full disk: fail the session, never hang it
            log.exception("session %s: instance failed to start", record.id)
            if record.instance is not None:
                await record.instance.stop()
            if record.status == "provisioning":
                self._fail(record, f"sandbox instance failed to start: {exc}")

    async def _boot_steps(
        self, record: SessionRecord, offer: OfferSpec, key: asyncssh.SSHKey, req: dict[str, Any]
    ) -> None:
        await asyncio.sleep(self.scaled(self.catalog.provisioning_seconds(offer)))
        fault = self.faults.take("provision_error", offer.id, when="boot")
        if fault:
            self._fail(record, fault.message)
            return
        no_ssh = self.faults.take("no_ssh", offer.id) is not None
        missing = self.faults.take("missing_tools", offer.id)
        template = self.catalog.template(record.template_hash_id) if record.template_hash_id else None
        used = {s.ollama_port for s in self.sessions.values() if s.active}
        record.ollama_port = free_port(used)
        root = self.workdir / "instances" / record.id
        document = instance_document(
            self.catalog, offer, record.id, self.time_scale, root / "state", disk_gb=record.disk_gb
        )
        memory = self.faults.take("gpu_memory", offer.id)
        if memory is not None and memory.memory_mib:
            document["gpu"]["memory_mib"] = memory.memory_mib  # a mislisted machine
        driver = self.faults.take("gpu_driver", offer.id)
        if driver is not None and driver.driver:
            document["gpu_tools"] = DRIVER_TOOLS[driver.driver]
        instance = Instance(
            root,
            document,
            key,
            ollama_port=record.ollama_port,
            ollama_preinstalled=offer.ollama_preinstalled or bool(template and template.ollama_preinstalled),
            ssh_server=self.ssh_server,
            missing_tools=frozenset(missing.tools) if missing else frozenset(),
        )
        record.instance = instance
        instance.build()
        port = free_port() if no_ssh else await instance.start_ssh()
        record.ssh_host, record.ssh_port = "127.0.0.1", port
        onstart = self._onstart_script(req, template)
        if onstart:
            instance.run_background(onstart, "onstart.log")
        if record.launch_mode == "entrypoint":
            await self._serve_from_image(record, instance)
            return
        if await self._verify_ssh(record, key, req):
            record.status = "running"
            log.info("session %s running, ssh 127.0.0.1:%d", record.id, port)
        elif record.status == "provisioning":
            await instance.stop()
            self._fail(record, "SSH verification timeout")

    async def _serve_from_image(self, record: SessionRecord, instance: Instance) -> None:
        """Entrypoint mode: the image's server starts (after its pull); ``running`` once its
        ``/health`` answers, else the instance is destroyed and the session failed."""
        spec = InstanceSpec.model_validate(instance.document)
        pull = self.scaled(docker_standin.pull_seconds(spec, record.docker_image))  # as `docker pull` would take
        instance.run_background(entrypoint.server_script(record.docker_image, record.model_id, record.api_port, pull),
                                "entrypoint.log")
        timings = self.catalog.timings
        healthy = await entrypoint.verify_api(
            record.ssh_host, record.api_port, timeout=self.scaled(timings.api_verify_timeout_seconds),
            interval=max(self.scaled(timings.api_check_interval_seconds), 0.02),
            still_waiting=lambda: record.status == "provisioning")
        if healthy:
            record.api_endpoint = f"http://{record.ssh_host}:{record.api_port}"
            record.status = "running"
            log.info("session %s running, API %s", record.id, record.api_endpoint)
        elif record.status == "provisioning":
            await instance.stop()
            self._fail(record, entrypoint.FAILED_MESSAGE)

    def _onstart_script(self, req: dict[str, Any], template: Any) -> str:
        if req["on_start_cmd"]:
            return req["on_start_cmd"]
        if req["workload_type"] == "llm" and template is None:
            return _LLM_ONSTART.format(pause=f"{self.scaled(3):.3f}")
        if template is not None and template.ollama_autostart:
            return 'nohup ollama serve > "$HOME/ollama.log" 2>&1 &\n'
        return ""

    async def _verify_ssh(self, record: SessionRecord, key: asyncssh.SSHKey, req: dict[str, Any]) -> bool:
        """The server's SSH check: log in until it works or the SSH timeout passes."""
        minutes = min(max(req["ssh_timeout_minutes"], 1), 30) if req["ssh_timeout_minutes"] > 0 else 0
        timeout = self.scaled(minutes * 60 if minutes else self.catalog.timings.ssh_verify_timeout_seconds)
        interval = max(self.scaled(self.catalog.timings.ssh_check_interval_seconds), 0.02)
        deadline = self._now_loop() + timeout
        while record.status == "provisioning":
            try:
                await sshd.probe(record.ssh_host, record.ssh_port, key, timeout=10.0)
                return True
            except (OSError, asyncssh.Error, asyncio.TimeoutError):
                pass
            if self._now_loop() >= deadline:
                return False
            await asyncio.sleep(min(interval, max(deadline - self._now_loop(), 0.0) + 0.01))
        return False

    def _fail(self, record: SessionRecord, reason: str) -> None:
        """The server's failSession: ``failed``, the error, and the final cost."""
        record.status = "failed"
        record.error = reason
        record.stopped_at = self.clock.now()
        record.failed_at = self._now_loop()
        self.ledger.final_cost(record, record.created_at, record.stopped_at)
        log.info("session %s failed: %s", record.id, reason)

    def get_session(self, session_id: str) -> SessionRecord:
        record = self.sessions.get(session_id)
        if record is None:
            raise ApiFailure(404, "record not found")
        return record

    def list_sessions(
        self, consumer_id: str = "", status: str = "", provider: str = "", limit: int = 0
    ) -> list[SessionRecord]:
        chosen = [
            s
            for s in reversed(self.sessions.values())  # newest first, like ORDER BY created_at DESC
            if (not consumer_id or s.consumer_id == consumer_id)
            and (not status or s.status == status)
            and (not provider or s.provider == provider)
        ]
        return chosen[:limit] if limit > 0 else chosen

    async def signal_done(self, session_id: str) -> None:
        record = self.get_session(session_id)
        if record.terminal:
            raise SessionTerminal(session_id, record.status)
        await self.destroy_session(session_id)

    async def destroy_session(self, session_id: str) -> None:
        """The server's DestroySession; returns once the session is stopped."""
        record = self.sessions.get(session_id)
        if record is None:
            raise ApiFailure(404, f"session not found: {session_id[:128]}")
        async with record.lock:
            if record.terminal or record.status == "stopping":
                if record.status == "failed" and record.provider_instance_id:
                    await self._release(record)
                    record.provider_instance_id = ""
                    record.status, record.stopped_at = "stopped", self.clock.now()
                return
            record.status = "stopping"
            await self._release(record)
            if record.provider_instance_id:
                await asyncio.sleep(self.scaled(self.catalog.timings.destroy_seconds))
            record.status, record.stopped_at = "stopped", self.clock.now()
            log.info("session %s stopped", record.id)

    async def _release(self, record: SessionRecord) -> None:
        """Stop booting and destroy the instance (idempotent)."""
        task = record.boot_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if record.instance is not None:
            await record.instance.stop()

    def extend_session(self, session_id: str, hours: int) -> SessionRecord:
        record = self.get_session(session_id)
        if record.terminal or record.status == "stopping":
            raise SessionTerminal(session_id, record.status)
        age = self.clock.now() - record.created_at
        if age + timedelta(hours=hours) > timedelta(hours=HARD_MAX_HOURS):
            raise ApiFailure(
                400,
                f"extension would exceed {HARD_MAX_HOURS}-hour hard max: session {session_id} has been running "
                f"for {age.total_seconds() / 3600:.1f} hours, requested {hours} more hours",
            )
        record.expires_at += timedelta(hours=hours)
        record.reservation_hours += hours
        return record

    async def kill_instance(self, session_id: str, *, silent: bool = False) -> SessionRecord:
        """Fault: the provider lost the instance; reconciliation stops the session.

        ``silent``: its SSH connections go quiet instead of closing (a host gone from
        the network), so that only the API tells.
        """
        record = self.get_session(session_id)
        async with record.lock:
            if record.status not in ("running", "provisioning"):
                raise ApiFailure(409, f"session {session_id} has no live instance (status: {record.status})")
            if silent and record.instance is not None:
                task = record.boot_task
                if task is not None and not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                try:
                    await record.instance.stop(silent=True)
                except UnsupportedFault as exc:
                    raise ApiFailure(400, str(exc)) from None
            else:
                await self._release(record)
            record.status, record.error = "stopped", GHOST_ERROR
            record.stopped_at = self.clock.now()
        log.info("session %s: instance killed by fault", record.id)
        return record

    def running_instance(self, session_id: str) -> Instance:
        """The live instance of a running session, for faults that act on it."""
        record = self.get_session(session_id)
        if record.status != "running" or record.instance is None or record.instance.stopped:
            raise ApiFailure(409, f"session {session_id} has no running instance (status: {record.status})")
        return record.instance

    async def instance_fault(self, request: FaultRequest) -> dict[str, Any]:
        """Faults on a running instance: ``drop_ssh``, ``stop_ollama``, ``stop_server``, ``stall_stream``,
        ``empty_output``, ``pull_error``, the worker faults."""
        assert request.session_id is not None
        instance = self.running_instance(request.session_id)
        if request.fault == "drop_ssh":
            try:
                return {"dropped_connections": instance.drop_ssh()}
            except UnsupportedFault as exc:
                raise ApiFailure(400, str(exc)) from None
        if request.fault == "stop_ollama":
            pid = await instance.stop_ollama(hang=request.hang)
            if pid is None:
                raise ApiFailure(409, f"session {request.session_id}: ollama serve is not running")
            return {"stopped_pid": pid}
        if request.fault == "stop_server":
            pids = await instance.stop_servers(hang=request.hang)
            if not pids:
                raise ApiFailure(409, f"session {request.session_id}: no OpenAI server launcher is running")
            return {"stopped_pids": pids}
        if request.fault == "pull_error":
            message = request.message if "message" in request.model_fields_set else PULL_ERROR_MESSAGE
            pull = PullFault(id=next(self._stream_fault_ids), message=message, times=request.times)
            instance.arm_pull_fault(pull)
            return {"pull_fault": pull.model_dump()}
        if request.fault in WORKER_FAULTS:
            return {"worker_fault": instance.arm_worker_fault(
                {"kind": request.fault, "after_tokens": request.after_tokens, "times": request.times})}
        stall = request.fault == "stall_stream"
        fault = StreamFault(id=next(self._stream_fault_ids), kind="stall" if stall else "empty",
                            after_tokens=request.after_tokens if stall else 0, times=request.times)
        instance.arm_stream_fault(fault)
        return {"stream_fault": fault.model_dump()}

    def clear_stream_faults(self) -> int:
        """Disarm the stream faults of every live instance; returns how many there were."""
        return sum(r.instance.clear_stream_faults() for r in self.sessions.values()
                   if r.instance is not None and not r.instance.stopped)

    # -- lifecycle ------------------------------------------------------------------

    def start_lifecycle(self) -> None:
        self._lifecycle = asyncio.create_task(self._lifecycle_loop())

    async def _lifecycle_loop(self) -> None:
        while True:
            try:
                self.lifecycle_step()
            except Exception:  # a bug here must not stop billing and expiry for good
                log.exception("lifecycle step failed")
            await asyncio.sleep(_TICK_SECONDS)

    def lifecycle_step(self) -> None:
        """Billing ticks, expiry, the hard cap and failed -> stopped, as of now."""
        now = self.clock.now()
        running = [s for s in self.sessions.values() if s.status == "running"]
        self.ledger.hourly_ticks(now, running)
        for record in running:
            if now >= record.expires_at or now - record.created_at > timedelta(hours=HARD_MAX_HOURS):
                log.info("session %s expired", record.id)
                self._spawn(self.destroy_session(record.id))
        settle = max(self.scaled(self.catalog.timings.lifecycle_check_seconds), 1.0)
        for record in self.sessions.values():
            if record.status == "failed" and record.provider_instance_id and record.failed_at is not None:
                if self._now_loop() - record.failed_at >= settle:
                    self._spawn(self.destroy_session(record.id))
                    record.failed_at = None

    def counts(self) -> dict[str, int]:
        result = {"created": len(self.sessions)}
        for status in ("provisioning", "running", "stopping", "stopped", "failed"):
            result[status] = sum(1 for s in self.sessions.values() if s.status == status)
        return result

    async def reset(self, *, catalog: Catalog | None = None, time_scale: float | None = None) -> int:
        """Back to a new sandbox's state, on the same address: every instance stopped (its
        SSH server and processes ended, its directory removed), then no session, fault,
        benchmark or bill, the clock unmoved and the inventory fresh. ``catalog`` and
        ``time_scale`` replace the ones the sandbox started with (None: those).
        Returns how many sessions were still active."""
        if time_scale is not None and time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        left = await self.close()
        shutil.rmtree(self.workdir / "instances", ignore_errors=True)
        shutil.rmtree(self.workdir / "request-logs", ignore_errors=True)
        self._fresh_state(catalog or self.start_catalog,
                          self.start_time_scale if time_scale is None else time_scale, Clock())
        self.start_lifecycle()
        log.info("sandbox reset: %d active session(s) stopped (time scale %g)", left, self.time_scale)
        return left

    async def close(self) -> int:
        """Stop every session and its instance; returns how many were still active."""
        if self._lifecycle is not None:
            self._lifecycle.cancel()
            await asyncio.gather(self._lifecycle, return_exceptions=True)
        live = [s for s in self.sessions.values() if s.active or s.status == "stopping"]
        for record in self.sessions.values():
            await self._release(record)
            if record.active or record.status == "stopping":
                record.status, record.stopped_at = "stopped", self.clock.now()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return len(live)


def classify_provision_error(message: str) -> tuple[str, bool]:
    """The server's ``classifyProvisionError``: error type and whether to retry."""
    text = message.lower()
    if "ssh" in text or "timeout" in text:
        return "ssh_timeout", True
    if "stopped" in text or "terminated" in text:
        return "instance_stopped", True
    if "connection refused" in text:
        return "provider_unavailable", True
    if "not found" in text or "invalid" in text:
        return "invalid_request", False
    return "provision_failed", True


def _instance_id(offer: OfferSpec) -> str:
    if offer.provider == "vastai":
        return str(random.randint(20_000_000, 29_999_999))
    return str(uuid.uuid4())
