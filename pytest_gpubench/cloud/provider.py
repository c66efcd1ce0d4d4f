"""The ``Provider`` seam: where a cell's GPU session comes from.

Everything above ``cloud/`` rents through this protocol, never through a
concrete API: the fixtures and provisioning (offers, create, wait, SSH details),
the session watch and the session pool (a session's state), and cleanup (the
sessions a run owns, release). :class:`~pytest_gpubench.cloud.shopper_provider.ShopperProvider`
(GPU Shopper) implements it; :mod:`.registry` maps a matrix's ``cloud:`` name to
an implementation, and ``tests/e2e/test_provider_contract.py`` is the suite every
implementation passes (its checks for any provider are :mod:`pytest_gpubench.run.provider_contract`).

The vocabulary a provider speaks (``Offer``, ``Session``, ``CreatedSession``,
``Constraints``, ``OfferChoice``, ``SshDetails``, ``Released``) lives here, in the
seam: it is what the manifest and the results record. Each implementation
translates its own API into it (``shopper_client.py`` reads GPU Shopper's JSON,
whose fields these types were first drawn from, into it).

:class:`OwnedSession` is a session a run owns and whose release was never recorded:
what the store reports (:meth:`~pytest_gpubench.store.base.Store.unreleased_sessions`)
and cleanup releases. It lives in the seam so ``store/`` and cleanup's ``Leftover``
share it without ``cloud/`` importing the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..errors import Stage
from ..matrix.cells import Cell
from ..matrix.fields import EndpointSpec
from ..matrix.launch import LaunchSpec

#: Every consumer id a run of this plugin makes starts so (see :func:`consumer_id`).
CONSUMER_PREFIX = "gpubench-"
#: Statuses in which a session may still hold (and bill for) an instance: ``stopping``
#: too, until it has stopped.
HOLDING_STATUSES = frozenset({"pending", "provisioning", "running", "stopping"})


def consumer_id(run_id: str, cell_id: str, attempt: int = 1) -> str:
    """Identifies the run and the cell, so the API alone can find what a run owns.

    Unique per session: the server refuses a second active session with the same
    consumer_id and offer.
    """
    safe_cell = "".join(ch if ch.isalnum() or ch in "-_.:" else "_" for ch in cell_id)
    return f"{CONSUMER_PREFIX}{run_id}-{safe_cell}-a{attempt}"


class Offer(BaseModel):
    """One GPU offer from the inventory."""

    # No NaN or infinity (Python's JSON reader takes both): a NaN price compares false with
    # everything, so it slipped past any price cap and the spend check.
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    id: str
    provider: str
    provider_id: str = ""
    gpu_type: str
    gpu_count: int = 1
    vram_gb: float = 0
    price_per_hour: float
    location: str = ""
    reliability: float | None = None
    available: bool = True
    # Absent means the server did not compute one: treat as certain (seed 000).
    availability_confidence: float = 1.0
    cuda_version: str | float | None = None
    machine_id: str | int | None = None
    interruptible: bool = False
    fetched_at: datetime | None = None

    @property
    def machine(self) -> str:
        """The machine the offer is on: its ``machine_id`` (a host's name for ``cloud: hosts``), else
        ``provider_id``; "" when the inventory says neither."""
        return str(self.machine_id) if self.machine_id not in (None, "") else self.provider_id


class Session(BaseModel):
    """A GPU session as the API reports it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # a price must be a number (Offer)

    id: str
    consumer_id: str = ""
    provider: str = ""
    gpu_type: str = ""
    gpu_count: int = 1
    status: str
    error: str = ""
    ssh_host: str = ""
    ssh_port: int = 0
    ssh_user: str = "root"
    price_per_hour: float = 0.0
    reservation_hours: int = 0
    created_at: datetime | None = None
    expires_at: datetime | None = None
    offer_id: str = ""
    #: ``entrypoint`` when the image's own server was launched (``pkg/models/session.go``); "" is ``ssh``.
    launch_mode: str = ""
    #: ``http://host:api_port``, set by the server once the image's ``/health`` answered (entrypoint mode).
    api_endpoint: str = ""
    api_port: int = 0


class CreatedSession(BaseModel):
    """The answer to a session create: the private key is returned once only."""

    model_config = ConfigDict(extra="ignore")

    session: Session
    ssh_private_key: str = Field(repr=False)
    retries_attempted: int = 0
    #: The offer the provider placed the session on when not the one asked for (a leased machine
    #: taken since it was offered, another of the same shape idle); ``None``: the one asked for.
    placed: Offer | None = Field(default=None, exclude=True)


@dataclass(frozen=True)
class Constraints:
    """What an offer must satisfy for one cell."""

    gpu: str
    provider: str
    vram_gb: float
    min_confidence: float = 0.5
    max_price: float | None = None
    #: A running endpoint the cell declares (``runtime: openai``): its offer is this server, not a rental.
    endpoint: EndpointSpec | None = None
    #: GPUs the offer (or host) must give the cell on one machine.
    gpu_count: int = 1
    #: The hosts inventory the cell's matrix names (``cloud: hosts``/``local``); None: none.
    hosts_file: str | None = None
    #: The cell's runtime (``microbench`` for a microbenchmark cell, ``Cell.lease_runtime``): on a shared
    #: machine, one serving from one server per machine leases all its GPUs.
    runtime: str = ""

    @classmethod
    def for_cell(cls, cell: Cell) -> Constraints:
        """What ``cell``'s matrix entry asks of an offer."""
        return cls(gpu=cell.gpu, provider=cell.provider, vram_gb=cell.vram_gb,
                   min_confidence=cell.offer.min_availability_confidence, max_price=cell.offer.max_price,
                   endpoint=cell.endpoint, gpu_count=cell.gpus, hosts_file=cell.hosts_file,
                   runtime=cell.lease_runtime)


@dataclass
class OfferChoice:
    """The offer chosen for a cell and how many the inventory returned."""

    offer: Offer
    offers_found: int
    eligible: list[Offer]
    #: The constraints it was chosen by: failover asks the inventory again with them.
    wanted: Constraints | None = None


class SshDetails(BaseModel):
    """How to reach a running session over SSH."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int
    user: str = "root"
    private_key: str = Field(repr=False)
    #: No SSH: the session's commands run on this machine (``remote/local.py``'s ``LocalShell``),
    #: for a provider that rents nothing (a running endpoint, this machine).
    local: bool = False
    #: The machine's GPUs (nvidia-smi indices) the cell may use; empty: all of them. A provider
    #: of shared machines (``hosts``, ``local``) sets it from the GPUs it leased to the cell.
    gpu_indices: tuple[int, ...] = ()
    #: The GPU is the one the matrix declares, not probed (a running endpoint: this machine's
    #: GPU, if any, is not the one measured); False: ``gpu_ssh`` asks nvidia-smi, also on ``local``.
    declared_hardware: bool = False
    #: A private key file on this machine (a host's ``key_file``), handed to SSH where it is, never
    #: copied; ``private_key`` is then empty.
    key_file: str = ""
    #: Authenticate with the running ssh-agent (``SSH_AUTH_SOCK``) instead of ``private_key``.
    agent: bool = False
    #: known_hosts files the host key is checked against, in order (``remote/ssh.py``);
    #: empty: a rented instance, whose key is pinned per session on first use.
    known_hosts: tuple[str, ...] = ()
    #: Where a host key found in none of ``known_hosts`` is pinned on first use ("": nowhere).
    pin_file: str = ""
    #: Models a cell pulls stay on the machine (a cache); False: a machine the run does not own
    #: (``hosts: keep_models: false``) gets the ones it pulled removed after the cell.
    keep_models: bool = True


class Released(BaseModel):
    """What releasing one session found and left (:meth:`Provider.release`)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    #: Its status before the release; None: the provider has no such session (404).
    before: str | None
    #: Its status after; None: the provider no longer knows it.
    after: str | None

    @property
    def found(self) -> bool:
        return self.before is not None

    @property
    def already_ended(self) -> bool:
        """It had stopped before anything was asked of it."""
        return self.before == "stopped"

    @property
    def still_holding(self) -> bool:
        """Still active after ``done`` and ``DELETE``: it may still hold (and bill for) an instance."""
        return self.after in HOLDING_STATUSES

    @property
    def final_status(self) -> str:
        """The status to record: the last one seen, ``not_found`` once the provider forgot it."""
        return self.after or "not_found"


@runtime_checkable
class Provider(Protocol):
    """Rents GPU sessions for cells and ends them; every method may raise ``StageError``.

    ``where`` names what it rents through (the API URL) for messages and the manifest.
    """

    where: str

    async def ready(self, attempts: int = 10) -> None:
        """Check the provider answers (retrying a starting one); raises ``ApiUnreachable``."""
        ...

    async def offers(self) -> list[Offer]:
        """Everything on offer now (``gpubench offers``)."""
        ...

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        """The offer a cell with ``wanted`` takes, and the other eligible ones (for failover);
        raises ``NoEligibleOffer`` saying which constraint ruled each offer out."""
        ...

    async def template_image(self, hash_id: str) -> str | None:
        """The image of a provider template, or None when it cannot say."""
        ...

    async def create(
        self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
        ssh_timeout_minutes: int | None = None, disk_gb: int | None = None, launch: LaunchSpec | None = None,
        runtime: str = "", model: str = "",
    ) -> CreatedSession:
        """Rent ``offer`` for ``hours`` under the consumer id ``consumer`` (:func:`consumer_id`).

        ``launch``: how the instance starts; in ``entrypoint`` mode its image serves ``model``
        with the server of ``runtime`` (the cell's)."""
        ...

    async def wait_running(
        self, session_id: str, on_poll: Callable[[Session, float], None] | None = None,
        timeout: float | None = None,
    ) -> Session:
        """The session once it is ``running`` and reachable over SSH; a ``StageError`` at
        ``provision`` or ``ssh_wait`` when it fails or does not come up in ``timeout`` seconds."""
        ...

    def ssh_details(self, created: CreatedSession, running: Session) -> SshDetails:
        """Host, port, user and key of a running session."""
        ...

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        """The session's state now (the watch asks it while a stage runs: anything other
        than ``running`` means the instance is gone); an ``ApiError`` 404 once it is unknown."""
        ...

    async def owned_sessions(self, consumer: str | None = None) -> list[Session]:
        """Sessions under this plugin's consumer ids (or only ``consumer``) that may still
        hold an instance (:data:`HOLDING_STATUSES`): what cleanup looks for."""
        ...

    async def release(self, session_id: str) -> Released:
        """End the session, whatever state it is in, and say what it found and left."""
        ...

    async def session_cost(self, session_id: str) -> float | None:
        """The provider's own figure for what the session cost; None when it has none
        (also for a session it does not know)."""
        ...

    async def aclose(self) -> None:
        """Close connections; the provider is not used after."""
        ...


class OwnedSession(BaseModel):
    """A session the store knows a run rented, with the cell that rented it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    session_id: str
    run_id: str
    consumer_id: str | None = None
    row_id: str | None = None
    cell_id: str | None = None
    cell_status: str | None = None
    worker: str | None = None
    progress_file: str | None = None
    #: The last status the API reported, if any.
    session_status: str | None = None
    #: The attempt that rented it, or None when only the cell knows the session.
    attempt: int | None = None
