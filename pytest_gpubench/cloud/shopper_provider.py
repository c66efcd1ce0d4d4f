"""GPU sessions through the Cloud GPU Shopper API: the ``shopper`` :class:`~.provider.Provider`."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from ..errors import ApiError, Stage, StageError
from .offers import select_offer
from .provider import (CONSUMER_PREFIX, HOLDING_STATUSES, Constraints, CreatedSession, Offer, OfferChoice,
                       Released, Session, SshDetails)
from ..settings import Settings
from .shopper_client import SessionRequest, ShopperClient
from ..matrix.launch import LaunchSpec, exposed_ports
from ..runtime_facts import facts_of

#: How long a session may stay ``stopping`` after done/DELETE (the server answers
#: those once it is stopped, within seconds).
SETTLE_SECONDS = 30.0
#: What a release records when the API answered but could not say what the session was doing.
UNKNOWN_STATUS = "unknown"


def launch_fields(launch: LaunchSpec | None, runtime: str, model: str) -> dict[str, Any]:
    """The create request's launch fields for a cell's ``runtime.launch`` (none for a plain SSH launch).

    In entrypoint mode the server learns which server the image runs from ``workload_type``
    (``llm_vllm``, ``llm_tgi``: ``buildWorkloadConfig`` in ``internal/service/provisioner/service.go``),
    takes ``exposed_ports[0]`` as the session's API port (``internal/provider/vastai/client.go``) and
    passes ``model_id`` to the image (vLLM: ``VLLM_MODEL``; TGI: ``MODEL_ID``).
    """
    if launch is None or not launch.entrypoint:
        return {}  # the server's default, ssh
    server = facts_of(runtime).image  # the runtime's declaration: which workload GPU Shopper starts it as
    if server is None:  # the matrix refuses it first (launch.launch_problem)
        raise ValueError(f"runtime {runtime!r} cannot be started from an image")
    return {"launch_mode": "entrypoint", "workload_type": server.workload_type, "docker_image": launch.image,
            "model_id": model, "exposed_ports": exposed_ports(launch)}


class ShopperProvider:
    """Sessions for cells, rented through one GPU Shopper server."""

    def __init__(self, client: ShopperClient, settings: Settings, *, fixed_offers: bool = False) -> None:
        self.client = client
        self.settings = settings
        self.where = client.base_url
        #: With ``fixed_offers``: each marketplace's listing, read once (see :meth:`from_settings`).
        self._listings: dict[tuple[str | None, int], list[Offer]] | None = {} if fixed_offers else None

    @classmethod
    def from_settings(cls, settings: Settings, *, fixed_offers: bool = False) -> ShopperProvider:
        """The provider for the run's API (``--gpubench-api``, its token).

        ``fixed_offers``: read each marketplace's inventory once and choose every later
        offer from that reading, so ``gpubench plan`` prices all its cells against the
        same offers.
        """
        return cls(ShopperClient(settings.api, token=settings.api_token), settings, fixed_offers=fixed_offers)

    async def ready(self, attempts: int = 10) -> None:
        await self.client.wait_ready(attempts=attempts, interval=1.0)

    async def offers(self) -> list[Offer]:
        return await self.client.inventory()

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        """Query the inventory for the cell's provider and pick per seed rule.

        Price and VRAM are filtered here, not by the server, so that a cell
        without an eligible offer can say which constraint ruled each one out.
        """
        timeout = self.settings.stage_timeout(Stage.INVENTORY)
        try:
            offers = await asyncio.wait_for(self._inventory(wanted.provider, wanted.gpu_count), timeout)
        except asyncio.TimeoutError:
            raise StageError(
                Stage.INVENTORY,
                f"the GPU Shopper API at {self.client.base_url} did not answer GET /api/v1/inventory "
                f"within the inventory stage's {timeout:g} s",
                hint="the server is stuck or overloaded: check its /health and logs, then rerun the cell",
            ) from None
        offer, eligible = select_offer(offers, wanted)
        return OfferChoice(offer=offer, offers_found=len(offers), eligible=eligible, wanted=wanted)

    async def _inventory(self, marketplace: str | None, gpu_count: int = 1) -> list[Offer]:
        """The listing for ``marketplace``: asked each time, or once with ``fixed_offers``.

        A multi-GPU cell asks the server for machines with at least ``gpu_count`` GPUs
        (``min_gpu_count``, the API's one count filter); :func:`select_offer` keeps those
        with exactly that many. One-GPU cells' listings are unfiltered, so a cell can say
        which constraint ruled each offer out.
        """
        filters = {"provider": marketplace, "min_gpu_count": gpu_count if gpu_count > 1 else None}
        if self._listings is None:
            return await self.client.inventory(**filters)
        key = (marketplace, gpu_count)
        if key not in self._listings:
            self._listings[key] = await self.client.inventory(**filters)
        return list(self._listings[key])

    async def create(
        self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
        ssh_timeout_minutes: int | None = None, disk_gb: int | None = None, launch: LaunchSpec | None = None,
        runtime: str = "", model: str = "",
    ) -> CreatedSession:
        request = SessionRequest(
            consumer_id=consumer,
            offer_id=offer.id,
            **{"workload_type": self.settings.workload_type, **launch_fields(launch, runtime, model)},
            reservation_hours=hours,
            # Idle sessions end server-side too: a dead pytest leaves no bill.
            idle_threshold_minutes=max(5, math.ceil(self.settings.scaled(1800) / 60)),
            template_hash_id=template,
            ssh_timeout_minutes=ssh_timeout_minutes,
            disk_gb=disk_gb,
        )
        return await self.client.create_session(request)

    async def template_image(self, hash_id: str) -> str | None:
        """The Docker image of a template, or None when the server cannot say."""
        try:
            return (await self.client.template(hash_id)).image or None
        except StageError:
            return None

    async def wait_running(
        self,
        session_id: str,
        on_poll: Callable[[Session, float], None] | None = None,
        timeout: float | None = None,
    ) -> Session:
        """Poll until ``running`` (ready for SSH), at most ``timeout`` seconds (default: the
        ``ssh_wait`` stage timeout).

        A session the server failed fails at ``ssh_wait`` when its error is about SSH
        ("SSH verification timeout"), else at ``provision`` ("No available public IPs"; in
        entrypoint mode "API verification timeout": the image's server never answered).
        """
        if timeout is None:
            timeout = self.settings.stage_timeout(Stage.SSH_WAIT)
        start = time.monotonic()
        while True:
            session = await self.client.get_session(session_id, Stage.SSH_WAIT)
            waited = time.monotonic() - start
            if on_poll is not None:
                on_poll(session, waited)
            if session.status == "running" and session.ssh_host:
                return session
            if session.status in ("failed", "stopped", "stopping"):
                reason = session.error or f"session became {session.status}"
                stage = Stage.SSH_WAIT if "ssh" in reason.lower() else Stage.PROVISION
                raise StageError(stage, f"session {session_id} {session.status}: {reason}")
            if waited >= timeout:
                never = ("its image's model server never answered /health" if session.launch_mode == "entrypoint"
                         else "SSH never became ready")
                raise StageError(Stage.SSH_WAIT, f"session {session_id} still {session.status} after "
                                                 f"{waited:.0f} s; {never}")
            await asyncio.sleep(min(self.settings.poll_interval, max(0.0, timeout - waited)))

    def ssh_details(self, created: CreatedSession, running: Session) -> SshDetails:
        """The key comes once, with the create; host and port once the session runs."""
        return SshDetails(host=running.ssh_host, port=running.ssh_port, user=running.ssh_user or "root",
                          private_key=created.ssh_private_key)

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        return await self.client.get_session(session_id, stage)

    async def owned_sessions(self, consumer: str | None = None) -> list[Session]:
        sessions = await self.client.list_sessions(consumer_id=consumer)
        return [s for s in sessions if s.status in HOLDING_STATUSES and s.consumer_id.startswith(CONSUMER_PREFIX)]

    async def session_cost(self, session_id: str) -> float | None:
        try:
            return await self.client.session_cost(session_id)
        except ApiError as exc:
            if exc.status == 404:
                return None  # a session the server does not know cost it nothing
            raise

    async def aclose(self) -> None:
        await self.client.aclose()

    async def release(self, session_id: str) -> Released:
        """End the session: the one release path, for teardown and cleanup alike.

        A 404 means the server has no such session (nothing to end); a ``stopped``
        one is left as it is. Otherwise ``done`` (unless ``failed``: that answers
        409 but may still hold an instance), then ``DELETE`` while the session is
        still active or ``failed``; a ``stopping`` one is given
        :data:`SETTLE_SECONDS` to stop first. A ``done`` the server refuses is not
        the end: ``DELETE`` follows. When the API answers but cannot say what the
        session is doing (an error, a body that is not its JSON), ending it is the safe
        side: ``done`` and ``DELETE`` blind, and the status is ``unknown``. Raises
        ``StageError`` when the ``DELETE`` itself is refused.
        """
        try:
            current = await self._status(session_id)
        except StageError:
            return await self._release_blind(session_id)
        if current is None or current.status == "stopped":
            status = current.status if current is not None else None
            return Released(session_id=session_id, before=status, after=status)
        before = current.status
        if before != "failed":
            try:
                await self.client.release(session_id)
            except StageError:
                pass  # refused or unanswered: DELETE below ends it
            current = await self._settled(session_id, await self._status(session_id))
        if current is not None and current.status in HOLDING_STATUSES | {"failed"}:
            await self.client.destroy(session_id)
            current = await self._settled(session_id, await self._status(session_id))
        return Released(session_id=session_id, before=before, after=current.status if current else None)

    async def _release_blind(self, session_id: str) -> Released:
        """``done`` then ``DELETE`` for a session whose status cannot be read."""
        try:
            await self.client.release(session_id)
        except StageError:
            pass  # refused or unanswered: DELETE ends it
        await self.client.destroy(session_id)
        try:
            after = await self._status(session_id)
        except StageError:
            return Released(session_id=session_id, before=UNKNOWN_STATUS, after=UNKNOWN_STATUS)
        return Released(session_id=session_id, before=UNKNOWN_STATUS, after=after.status if after else None)

    async def _settled(self, session_id: str, current: Session | None) -> Session | None:
        """``current``, or the session once it has left ``stopping`` (at most :data:`SETTLE_SECONDS`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_SECONDS
        while current is not None and current.status == "stopping" and loop.time() < deadline:
            await asyncio.sleep(0.5)
            current = await self._status(session_id)
        return current

    async def _status(self, session_id: str) -> Session | None:
        """The session now, None when the server does not know it (404)."""
        try:
            return await self.client.get_session(session_id, Stage.CLEANUP)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
