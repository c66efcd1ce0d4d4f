"""Fault injection for the sandbox (``/sandbox/faults``): the failures seed 001 lists.

Faults on an offer wait in a :class:`FaultBook` until the cloud meets them; each
fires ``times`` times (default: until cleared with ``DELETE /sandbox/faults``):

``provision_error`` (``offer_id``, ``message``, ``when``)
    ``when: "boot"`` (default): the create answers 201, then at boot the instance
    fails and the session turns ``failed`` with ``message`` as its error (and, a
    lifecycle tick later, ``stopped`` keeping it, as the real server does).
    ``when: "create"``: the create itself answers 500 with ``error_type`` and
    ``retry_suggested``, the session record is ``failed``.
``stale_inventory`` (``offer_id``)
    the create answers 503 ``stale_inventory`` and the offer leaves the listing
    for the provider's cache TTL.
``no_ssh`` (``offer_id``)
    the instance boots and reports a host and port, but nothing accepts SSH: the
    session stays ``provisioning`` until the server's SSH check gives up
    (``ssh_timeout_minutes`` of the create, default 8 minutes, time-scaled), then
    ``failed`` with "SSH verification timeout".

Faults that act at once:

``kill_instance`` (``session_id``)
    the instance dies: its processes are killed, SSH closes, and the session is
    ``stopped`` with "Instance not found on provider during reconciliation".
``not_ready`` (``seconds``)
    ``/health`` and ``/ready`` answer 503 for that many (real) seconds, like the
    server's start-up sweep.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OFFER_FAULTS = frozenset({"provision_error", "stale_inventory", "no_ssh"})
FaultKind = Literal["provision_error", "stale_inventory", "no_ssh", "kill_instance", "not_ready"]


class FaultRequest(BaseModel):
    """The body of ``POST /sandbox/faults``."""

    model_config = ConfigDict(extra="forbid")

    fault: FaultKind
    offer_id: str | None = None
    session_id: str | None = None
    message: str = "No available public IPs"
    when: Literal["boot", "create"] = "boot"
    times: int | None = Field(default=None, ge=1)
    seconds: float = Field(default=5.0, ge=0)

    @model_validator(mode="after")
    def _check_target(self) -> FaultRequest:
        if self.fault in OFFER_FAULTS and not self.offer_id:
            raise ValueError(f"fault {self.fault} needs offer_id")
        if self.fault == "kill_instance" and not self.session_id:
            raise ValueError("fault kill_instance needs session_id")
        return self


class Fault(BaseModel):
    """A fault waiting in the book."""

    id: int
    fault: FaultKind
    offer_id: str
    message: str
    when: Literal["boot", "create"]
    remaining: int | None
    fired: int = 0


class FaultBook:
    """The faults still waiting to fire, by offer."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)

    def add(self, request: FaultRequest) -> Fault:
        """Arm an offer fault."""
        assert request.fault in OFFER_FAULTS and request.offer_id
        fault = Fault(
            id=next(self._ids),
            fault=request.fault,
            offer_id=request.offer_id,
            message=request.message,
            when=request.when,
            remaining=request.times,
        )
        self._faults.append(fault)
        return fault

    def take(self, kind: str, offer_id: str, *, when: str | None = None) -> Fault | None:
        """The first armed fault of ``kind`` for ``offer_id``, counting one firing."""
        for fault in self._faults:
            if fault.fault != kind or fault.offer_id != offer_id:
                continue
            if when is not None and fault.when != when:
                continue
            fault.fired += 1
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
            return fault
        return None

    def list(self) -> list[Fault]:
        """The faults still armed."""
        return list(self._faults)

    def clear(self) -> int:
        """Disarm everything; returns how many faults were removed."""
        count = len(self._faults)
        self._faults.clear()
        return count
