"""``cloud: toy``: a pytest-gpubench provider defined outside the package, in one module.

Its "API" has nothing of GPU Shopper's shape: a folder (``TOY_CLOUD_DIR``) holding
``pods.json``, the pods on offer in a RunPod-like camelCase shape (``podId``, ``gpuName``,
``costPerHr``, ``sshHost``, ...), and ``rentals.json``, what was rented (``desiredStatus``
``RUNNING`` or ``EXITED``). A pod is a machine reachable over SSH (the tests' sandbox
hosts). The provider translates that into the seam's types (``Offer``, ``Session``,
``CreatedSession``, ``SshDetails``, ``Released``); ``toy_cloud-0.dist-info/entry_points.txt``
registers it in ``pytest_gpubench.providers`` as ``toy``.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_gpubench.cloud.offers import select_offer
from pytest_gpubench.cloud.provider import (CONSUMER_PREFIX, Constraints, CreatedSession, Offer, OfferChoice,
                                            Released, Session, SshDetails)
from pytest_gpubench.errors import ApiError, ApiUnreachable, Stage
from pytest_gpubench.settings import Settings

#: Where the toy cloud keeps its pods and rentals.
DIR_ENV = "TOY_CLOUD_DIR"
#: The toy's marketplace: a matrix row's ``provider:`` under ``cloud: toy``.
MARKETPLACE = "toyland"
_STATUS = {"RUNNING": "running", "EXITED": "stopped"}


class ToyCloud:
    """The pods of one toy cloud folder, rented and released by editing ``rentals.json``."""

    def __init__(self, settings: Settings, *, fixed_offers: bool = False, store: Any = None) -> None:
        self.settings = settings
        self.folder = Path(os.environ.get(DIR_ENV, ""))
        self.where = f"toy cloud at {self.folder}"

    @staticmethod
    def recorded_settings(settings: Settings) -> dict[str, str]:
        """What a run records of this cloud: its folder (nothing secret)."""
        return {"dir": os.environ.get(DIR_ENV, "")}

    # ------------------------------------------------------------------ its "API"

    def _pods(self) -> list[dict[str, Any]]:
        return json.loads((self.folder / "pods.json").read_text())["pods"]

    @contextmanager
    def _rentals(self) -> Iterator[dict[str, dict[str, Any]]]:
        """``rentals.json`` read and written back under a lock (xdist workers share it)."""
        with open(self.folder / "rentals.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.folder / "rentals.json"
            rentals = json.loads(path.read_text())["rentals"] if path.exists() else {}
            yield rentals
            path.write_text(json.dumps({"rentals": rentals}, indent=1))

    def _session(self, rental_id: str, rental: dict[str, Any]) -> Session:
        pod = next(p for p in self._pods() if p["podId"] == rental["podId"])
        return Session(id=rental_id, consumer_id=rental["name"], provider=MARKETPLACE, gpu_type=pod["gpuName"],
                       gpu_count=pod["gpuCount"], status=_STATUS[rental["desiredStatus"]], ssh_host=pod["sshHost"],
                       ssh_port=pod["sshPort"], ssh_user=pod["sshUser"], price_per_hour=pod["costPerHr"],
                       reservation_hours=rental["hours"], offer_id=pod["podId"],
                       created_at=datetime.fromisoformat(rental["createdAt"]))

    def _known(self, session_id: str, stage: Stage) -> dict[str, Any]:
        with self._rentals() as rentals:
            if session_id not in rentals:
                raise ApiError(stage, 404, f"no rental {session_id}")
            return dict(rentals[session_id])

    # ------------------------------------------------------------------ the Provider protocol

    async def ready(self, attempts: int = 10) -> None:
        if not (self.folder / "pods.json").is_file():
            raise ApiUnreachable(str(self.folder), f"no pods.json: set {DIR_ENV} to a toy cloud folder")

    async def offers(self) -> list[Offer]:
        with self._rentals() as rentals:
            busy = {r["podId"] for r in rentals.values() if r["desiredStatus"] == "RUNNING"}
        return [Offer(id=pod["podId"], provider=MARKETPLACE, gpu_type=pod["gpuName"], gpu_count=pod["gpuCount"],
                      vram_gb=pod["memoryInGb"], price_per_hour=pod["costPerHr"], machine_id=pod["podId"])
                for pod in self._pods() if pod["podId"] not in busy]

    async def choose_offer(self, wanted: Constraints) -> OfferChoice:
        offers = await self.offers()
        chosen, eligible = select_offer(offers, wanted)
        return OfferChoice(chosen, len(offers), eligible, wanted)

    async def template_image(self, hash_id: str) -> str | None:
        return None

    async def create(self, offer: Offer, consumer: str, hours: int, *, template: str | None = None,
                     ssh_timeout_minutes: int | None = None, disk_gb: int | None = None, launch: Any = None,
                     runtime: str = "", model: str = "") -> CreatedSession:
        rental_id = str(uuid.uuid4())
        with self._rentals() as rentals:
            if any(r["podId"] == offer.id and r["desiredStatus"] == "RUNNING" for r in rentals.values()):
                raise ApiError(Stage.PROVISION, 409, f"pod {offer.id} is rented")
            rentals[rental_id] = {"podId": offer.id, "name": consumer, "desiredStatus": "RUNNING", "hours": hours,
                                  "createdAt": datetime.now(timezone.utc).isoformat()}
            rental = dict(rentals[rental_id])
        pod = next(p for p in self._pods() if p["podId"] == offer.id)
        key = (self.folder / pod["sshKeyFile"]).read_text()
        return CreatedSession(session=self._session(rental_id, rental), ssh_private_key=key)

    async def wait_running(self, session_id: str, on_poll: Callable[[Session, float], None] | None = None,
                           timeout: float | None = None) -> Session:
        return self._session(session_id, self._known(session_id, Stage.PROVISION))

    def ssh_details(self, created: CreatedSession, running: Session) -> SshDetails:
        return SshDetails(host=running.ssh_host, port=running.ssh_port, user=running.ssh_user,
                          private_key=created.ssh_private_key)

    async def get_session(self, session_id: str, stage: Stage = Stage.SSH_WAIT) -> Session:
        return self._session(session_id, self._known(session_id, stage))

    async def owned_sessions(self, consumer: str | None = None) -> list[Session]:
        with self._rentals() as rentals:
            mine = {i: dict(r) for i, r in rentals.items() if r["desiredStatus"] == "RUNNING"
                    and (r["name"] == consumer if consumer else r["name"].startswith(CONSUMER_PREFIX))}
        return [self._session(i, r) for i, r in mine.items()]

    async def release(self, session_id: str) -> Released:
        with self._rentals() as rentals:
            rental = rentals.get(session_id)
            if rental is None:
                return Released(session_id=session_id, before=None, after=None)
            before = _STATUS[rental["desiredStatus"]]
            rental["desiredStatus"] = "EXITED"
        return Released(session_id=session_id, before=before, after="stopped")

    async def session_cost(self, session_id: str) -> float | None:
        return None

    async def aclose(self) -> None:
        pass
