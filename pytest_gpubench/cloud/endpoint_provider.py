"""The ``endpoint`` provider: a server that is already up, in the place of a rental.

A ``runtime: openai`` cell (``matrix/fields.py``) rents nothing, yet goes through
the same stages, records and reports as a rented one. This provider makes that so:
one synthetic offer per cell (the GPU the matrix declares, the declared
``price_per_hour``, provider ``endpoint``), a session that is ``running`` the moment it
is created and ``stopped`` when released, and :attr:`SshDetails.local`: there is no
SSH, so the cell's commands (the load generator) run on this machine through
:class:`~pytest_gpubench.remote.local.LocalShell`. It keeps its sessions in memory:
nothing outlives the run that could need cleaning up.
"""

from __future__ import annotations

import itertools
import re
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timezone

from ..errors import ApiError, NoEligibleOffer, Stage
from ..matrix.fields import ENDPOINT_PROVIDER
from ..matrix.launch import LaunchSpec
from .provider import HOLDING_STATUSES, Constraints, CreatedSession, Offer, OfferChoice, Released, Session, SshDetails


class EndpointProvider:
    """Sessions on running endpoints: nothing to rent, wait for or end."""

    where = "endpoint"

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._numbers = itertools.count(1)

    async def ready(self, attempts: int = 10) -> None:
        return None

    async def offers(self) -> list[Offer]:
        return []  # an endpoint is declared by its cell, not listed

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        spec = wanted.endpoint
        if spec is None:
            raise NoEligibleOffer(f"the {self.where} cloud serves only `runtime: openai` cells, which name "
                                  "their `endpoint: URL`")
        url = urllib.parse.urlsplit(spec.url)
        offer = Offer(id=f"{ENDPOINT_PROVIDER}:{url.hostname}:{url.port or ''}".rstrip(":"),
                      provider=ENDPOINT_PROVIDER, gpu_type=wanted.gpu, vram_gb=wanted.vram_gb,
                      price_per_hour=spec.price_per_hour, location=url.hostname or "",
                      fetched_at=datetime.now(timezone.utc))
        return OfferChoice(offer, 1, [offer], wanted)

    async def template_image(self, hash_id: str) -> str | None:
        return None

    async def create(self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
                     ssh_timeout_minutes: int | None = None, disk_gb: int | None = None,
                     launch: LaunchSpec | None = None, runtime: str = "", model: str = "") -> CreatedSession:
        now = datetime.now(timezone.utc)
        # An id (pytest_gpubench.ids) like every session's: cleanup sends none other to an API.
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", consumer)
        session = Session(id=f"{ENDPOINT_PROVIDER}-{next(self._numbers)}-{safe}", consumer_id=consumer,
                          provider=offer.provider, gpu_type=offer.gpu_type, status="running",
                          ssh_host=offer.location, price_per_hour=offer.price_per_hour,
                          reservation_hours=hours, created_at=now, offer_id=offer.id)
        self._sessions[session.id] = session
        return CreatedSession(session=session, ssh_private_key="")

    async def wait_running(self, session_id: str, on_poll: Callable[[Session, float], None] | None = None,
                           timeout: float | None = None) -> Session:
        return await self.get_session(session_id, Stage.SSH_WAIT)

    def ssh_details(self, created: CreatedSession, running: Session) -> SshDetails:
        return SshDetails(host=running.ssh_host or "localhost", port=0, user="", private_key="", local=True,
                          declared_hardware=True)

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError(stage, 404, f"no endpoint session {session_id}", call=f"session {session_id}")
        return session

    async def owned_sessions(self, consumer: str | None = None) -> list[Session]:
        return [s for s in self._sessions.values()
                if s.status in HOLDING_STATUSES and (consumer is None or s.consumer_id == consumer)]

    async def release(self, session_id: str) -> Released:
        session = self._sessions.get(session_id)
        if session is None:
            return Released(session_id=session_id, before=None, after=None)
        before = session.status
        session.status = "stopped"  # the server is not ours: it keeps running, only the cell lets go
        return Released(session_id=session_id, before=before, after=session.status)

    async def session_cost(self, session_id: str) -> float | None:
        return None  # nobody bills it: the cell's declared price and time are the cost

    async def aclose(self) -> None:
        self._sessions.clear()
