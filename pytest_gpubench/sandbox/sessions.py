"""Session records of the emulated API and the JSON the server answers for them.

The record holds what the server stores (``models.Session``); :meth:`response`
is the server's ``SessionResponse``: no ``offer_id``, no ``stopped_at``, no
``idle_threshold_minutes``, and every ``omitempty`` field left out when empty, so a
new session shows ``ssh_port: 22`` and ``ssh_user: "root"`` but no ``ssh_host``.
:meth:`state` adds what only the sandbox shows (``/sandbox/state``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .catalog import format_time
from .instances import Instance
from .served import served_fields

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
