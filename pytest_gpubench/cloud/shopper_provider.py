"""GPU sessions through the Cloud GPU Shopper API: find, create, wait, release."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ApiError, Stage, StageError
from .offers import Constraints, select_offer
from ..settings import SEED_TOTAL_TIMEOUT, Settings
from .shopper_client import CreatedSession, Offer, Session, SessionRequest, ShopperClient


@dataclass
class OfferChoice:
    """The offer chosen for a cell and how many the inventory returned."""

    offer: Offer
    offers_found: int
    eligible: list[Offer]
    #: The constraints it was chosen by: failover asks the inventory again with them.
    wanted: Constraints | None = None


def consumer_id(run_id: str, cell_id: str, attempt: int = 1) -> str:
    """Identifies the run and the cell, so the API alone can find what a run owns.

    Unique per session: the server refuses a second active session with the same
    consumer_id and offer.
    """
    safe_cell = "".join(ch if ch.isalnum() or ch in "-_.:" else "_" for ch in cell_id)
    return f"gpubench-{run_id}-{safe_cell}-a{attempt}"


def reservation_hours(settings: Settings, duration: float) -> int:
    """Hours to reserve: the seed's total budget plus the benchmark, rounded up.

    The server ends the session on its own once this passes, even if the
    machine running pytest dies.
    """
    seconds = settings.scaled(SEED_TOTAL_TIMEOUT) + duration
    return min(12, max(1, math.ceil(seconds / 3600)))


class ShopperProvider:
    """Sessions for cells, rented through one GPU Shopper server."""

    def __init__(self, client: ShopperClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        """Query the inventory for the cell's provider and pick per seed rule.

        Price and VRAM are filtered here, not by the server, so that a cell
        without an eligible offer can say which constraint ruled each one out.
        """
        timeout = self.settings.stage_timeout(Stage.INVENTORY)
        try:
            offers = await asyncio.wait_for(self.client.inventory(provider=wanted.provider), timeout)
        except asyncio.TimeoutError:
            raise StageError(
                Stage.INVENTORY,
                f"the GPU Shopper API at {self.client.base_url} did not answer GET /api/v1/inventory "
                f"within the inventory stage's {timeout:g} s",
                hint="the server is stuck or overloaded: check its /health and logs, then rerun the cell",
            ) from None
        offer, eligible = select_offer(offers, wanted)
        return OfferChoice(offer=offer, offers_found=len(offers), eligible=eligible, wanted=wanted)

    async def create(
        self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
        ssh_timeout_minutes: int | None = None, disk_gb: int | None = None,
    ) -> CreatedSession:
        request = SessionRequest(
            consumer_id=consumer,
            offer_id=offer.id,
            workload_type=self.settings.workload_type,
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
        ("SSH verification timeout"), else at ``provision`` ("No available public IPs").
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
                raise StageError(
                    Stage.SSH_WAIT,
                    f"session {session_id} still {session.status} after {waited:.0f} s; "
                    "SSH never became ready",
                )
            await asyncio.sleep(min(self.settings.poll_interval, max(0.0, timeout - waited)))

    async def release(self, session_id: str) -> Session | None:
        """End the session and return its last state.

        ``done`` first (``DELETE`` if that fails). A ``failed`` session answers
        ``done`` with 409 but may still hold an instance: ``DELETE`` ends it, and
        the server then reports it ``stopped``.
        """
        try:
            stopped_now = await self.client.release(session_id)
        except (ApiError, StageError):
            await self.client.destroy(session_id)
        else:
            if not stopped_now:
                try:
                    current = await self.client.get_session(session_id, Stage.CLEANUP)
                except StageError:
                    current = None  # gone: nothing left to end
                if current is not None and current.status == "failed":
                    await self.client.destroy(session_id)
        try:
            return await self.client.get_session(session_id, Stage.CLEANUP)
        except StageError:
            return None
