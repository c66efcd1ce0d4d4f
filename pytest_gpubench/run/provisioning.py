"""Stages ``provision`` and ``ssh_wait`` with failover: offers are tried until one runs.

Seed 001's provisioning failures ("No available public IPs", stale inventory, a
session that turns ``failed``, SSH that never comes up) are usually about one
host, not the GPU: the cell moves on to the next eligible offer
(:func:`~pytest_gpubench.cloud.offers.next_offer`: the seed's order, another location
or machine first), up to ``--gpubench-max-attempts`` / the matrix's
``offer.max_attempts`` offers. Each attempt is a session of its own
(``consumer_id`` ends ``-a1``, ``-a2``, ...), a row of the manifest's ``attempts``
table and an ``ATTEMPT`` line in the progress file; a failed attempt's session is
released before the next one is rented, and :meth:`Provisioning.release_all`
releases whatever is left at teardown.

Before each session is rented, the spend cap is checked and the session's
expected cost reserved, in one manifest transaction (:mod:`.budget`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..aio import run as run_async
from ..cloud.budget import admission, expected_session_seconds
from ..errors import ApiError, AttemptsFailed, BudgetRefused, ClaimLost, NoEligibleOffer, Stage, StageError
from ..matrix.cells import Cell
from ..cloud.offers import next_offer
from ..store.progress import ProgressWriter
from ..cloud.provider import (Constraints, CreatedSession, Offer, OfferChoice, Provider, Session, SshDetails,
                              consumer_id)
from .record import CellRecorder
from ..cloud.reuse_split import disk_gb_for, estimated_cell_seconds, planned_benchmark_seconds, reservation_seconds
from .run_context import RunContext
from ..settings import MIN_SCALED_TIMEOUT, SEED_TOTAL_TIMEOUT, Settings
from ..cloud.ssh_wait import SshWait, entrypoint_wait, heavy_stage_seconds, ssh_wait_for, stage_timeout

T = TypeVar("T")
#: Seconds of slack on top of a stage timeout for the bridge into the loop.
BRIDGE_SLACK = 10.0
#: API answers that are about this offer or host, or a passing server problem:
#: another offer may well work. Other 4xx answers (a bad request, too little
#: disk for the model) would fail the same way on every offer.
_RETRYABLE_STATUSES = frozenset({404, 408, 409, 429})


def reservation_hours(settings: Settings, duration: float) -> int:
    """Hours to reserve: the seed's total budget plus the benchmark, rounded up.

    The server ends the session on its own once this passes, even if the
    machine running pytest dies.
    """
    seconds = settings.scaled(SEED_TOTAL_TIMEOUT) + duration
    return min(12, max(1, math.ceil(seconds / 3600)))


def can_fail_over(error: StageError) -> bool:
    """Whether another offer may succeed where this provisioning error happened."""
    if isinstance(error, ClaimLost):
        return False  # the cell is another controller's now: no offer can fix that
    if isinstance(error, ApiError):
        return error.status >= 500 or error.status in _RETRYABLE_STATUSES or error.retry_suggested
    return error.stage in (Stage.PROVISION, Stage.SSH_WAIT)


@dataclass
class Attempt:
    """One offer tried, and the session rented for it."""

    number: int
    offer: Offer
    consumer_id: str
    session_id: str | None = None
    error: StageError | None = None
    released: bool = False

    def line(self) -> str:
        where = ", ".join(str(part) for part in (self.offer.location, self.offer.machine_id) if part)
        what = f"[{self.error.stage}] {self.error.message}" if self.error else "ready"
        return f"#{self.number} {self.offer.id}{f' ({where})' if where else ''}: {what}"


@dataclass
class Ready:
    """The running session the cell goes on with."""

    attempt: Attempt
    created: CreatedSession
    session: Session
    ssh: SshDetails
    #: The session's Docker image, when known (a template's or an entrypoint launch's).
    image: str | None = None


@dataclass
class Provisioning:
    """One cell's provisioning: attempts, their sessions, and releasing them."""

    run: RunContext
    recorder: CellRecorder
    cell: Cell
    choice: OfferChoice
    wanted: Constraints
    #: The cells the session is for, this one first: its reuse group's cells still to
    #: run here (session reuse), or just this one. Sizes its reservation, disk and budget.
    planned: list[Cell] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    #: For tests: the clock the budget reads.
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))

    def __post_init__(self) -> None:
        self.planned = self.planned or [self.cell]

    @property
    def provider(self) -> Provider:
        """The provider the cell's ``cloud:`` names."""
        return self.run.provider_for(self.cell.cloud)

    @property
    def shared(self) -> bool:
        """Whether the session is rented for more than this cell."""
        return len(self.planned) > 1

    @property
    def max_attempts(self) -> int:
        return self.run.settings.max_attempts or self.cell.offer.max_attempts

    @property
    def expected_seconds(self) -> float:
        """The session lifetime the budget reserves: this cell's, plus the later cells' of its group."""
        settings = self.run.settings
        first = expected_session_seconds(planned_benchmark_seconds(self.cell, settings.runs), 1, settings.time_scale)
        return first + sum(estimated_cell_seconds(cell, settings.runs, settings.time_scale)
                           for cell in self.planned[1:])

    def run_until_ready(self) -> Ready:
        """Try offers until a session is ``running``; raise the reason when none is.

        Raises :class:`BudgetRefused` when the budget stops the first attempt, the
        attempt's own error when failover is off or cannot help, and
        :class:`AttemptsFailed` listing every attempt when several were made.
        """
        wait = self._ssh_wait()
        eligible, offer = list(self.choice.eligible), self.choice.offer
        # A cell run again in the same run (--gpubench-resume) keeps its earlier attempts'
        # rows (their money was spent) and numbers on: consumer ids stay unique too.
        earlier = self.recorder.store.attempts(row_id=self.recorder.row_id)
        base = max((found.attempt for found in earlier), default=0)
        while True:
            number = base + len(self.attempts) + 1
            attempt = Attempt(number, offer, consumer_id(self.run.run_id, self.recorder.record_key, number))
            refused = self._start(attempt)
            if refused:
                if not self.attempts:
                    raise BudgetRefused(refused)
                raise self._give_up(f"attempt {len(self.attempts) + 1} not started: {refused}", refused=True)
            self.attempts.append(attempt)
            try:
                return self._try(attempt, wait)
            except StageError as exc:
                self._failed(attempt, exc)
                if not can_fail_over(exc):
                    raise self._give_up("not a failure another offer can fix") from None
            if len(self.attempts) >= self.max_attempts:
                raise self._give_up(f"max attempts ({self.max_attempts}) reached")
            eligible = self._refresh(eligible)
            offer = next_offer(eligible, [a.offer for a in self.attempts])
            if offer is None:
                raise self._give_up("no other eligible offer")

    # ------------------------------------------------------------------ one attempt

    def _ssh_wait(self) -> SshWait:
        launch, template = self.cell.launch, self.cell.offer.template
        if launch is not None and launch.image:  # only an entrypoint launch (never with a template)
            return entrypoint_wait(launch.image)
        image = None
        if template:
            provider, timeout = self.provider, self.run.settings.stage_timeout(Stage.PROVISION)
            try:
                image = run_async(provider.template_image(template), timeout + BRIDGE_SLACK)
            except TimeoutError:
                image = None  # the rule then assumes the template's default, not a heavy image
        return ssh_wait_for(template, image)

    def _start(self, attempt: Attempt) -> str | None:
        """Reserve the attempt in the manifest (and the budget); the refusal reason, if any."""
        refused = self._reserve(attempt)
        if refused and self.shared and not self.attempts:
            # No room for the whole group's session: rent one for this cell alone.
            self.planned = [self.cell]
            refused = self._reserve(attempt)
        if not refused:
            self.recorder.attempts = len(self.attempts) + 1
        return refused

    def _reserve(self, attempt: Attempt) -> str | None:
        settings, offer = self.run.settings, attempt.offer
        expected = self.expected_seconds
        return self.recorder.store.start_attempt(
            self.recorder.row_id, attempt.number, counted_as=len(self.attempts) + 1,
            admit=admission(settings.budget, offer.price_per_hour, expected, self.clock),
            offer_id=offer.id, provider=offer.provider, gpu_type=offer.gpu_type, location=offer.location,
            machine_id=offer.machine_id, price_per_hour=offer.price_per_hour, consumer_id=attempt.consumer_id,
            expected_seconds=expected, worker=self.recorder.worker,
        )

    def _try(self, attempt: Attempt, wait: SshWait) -> Ready:
        recorder, settings, provider = self.recorder, self.run.settings, self.provider
        offer = attempt.offer
        recorder.enter(Stage.PROVISION)
        timeout = stage_timeout(settings, Stage.PROVISION, wait.image)
        ssh_timeout = settings.scaled(wait.seconds, MIN_SCALED_TIMEOUT)
        if heavy_stage_seconds(wait.image) and len(self.attempts) == 1:
            recorder.progress.status("HEAVY_IMAGE", image=wait.image, provision_s=round(timeout, 1),
                                     ssh_wait_s=round(ssh_timeout, 1),
                                     runtime_setup_s=round(stage_timeout(settings, Stage.RUNTIME_SETUP,
                                                                          wait.image), 1))
        hours = reservation_hours(settings, reservation_seconds(self.planned, settings.runs))
        created = self._bridge(provider.create(offer, attempt.consumer_id, hours, template=self.cell.offer.template,
                                               ssh_timeout_minutes=wait.server_minutes,
                                               disk_gb=disk_gb_for(self.planned), launch=self.cell.launch,
                                               runtime=self.cell.lease_runtime, model=self.cell.model),
                               timeout, Stage.PROVISION, "creating the session")
        session = created.session
        if created.placed is not None:  # the provider placed the session on another offer (hosts_provider)
            offer = attempt.offer = created.placed
            recorder.store.update_attempt(recorder.row_id, attempt.number, offer_id=offer.id,
                                          location=offer.location, machine_id=offer.machine_id,
                                          price_per_hour=offer.price_per_hour)
        attempt.session_id = session.id
        recorder.session_created(session.id, attempt.consumer_id, offer.id, offer.price_per_hour)
        recorder.store.update_attempt(recorder.row_id, attempt.number, session_id=session.id)
        recorder.progress.status("PROVISIONING", session_id=session.id, offer_id=offer.id, attempt=attempt.number,
                                 location=offer.location or None)

        def polled(current: Session, waited: float) -> None:
            recorder.enter(Stage.SSH_WAIT)
            recorder.progress.progress(stage="provision", status=current.status, waited_s=round(waited, 1))

        recorder.enter(Stage.SSH_WAIT)
        running = self._bridge(provider.wait_running(session.id, polled, timeout=ssh_timeout),
                               ssh_timeout, Stage.SSH_WAIT, "waiting for SSH")
        recorder.store.update_attempt(recorder.row_id, attempt.number, status="ready")
        recorder.store.update_cell(recorder.row_id, instance_ip=running.ssh_host, ssh_port=running.ssh_port)
        recorder.progress.status("SSH_READY", host=running.ssh_host, port=running.ssh_port)
        if running.launch_mode == "entrypoint":
            recorder.progress.status("API_READY", endpoint=running.api_endpoint or None,
                                     api_port=running.api_port or None)
        recorder.progress.status("ATTEMPT", attempt=attempt.number, offer_id=offer.id, outcome="ready",
                                 ssh_wait=wait.reason)
        return Ready(attempt, created, running, provider.ssh_details(created, running), image=wait.image)

    def _bridge(self, coro: Coroutine[Any, Any, T], timeout: float, stage: Stage, what: str) -> T:
        """Run ``coro`` on the loop; a bridge timeout is this stage's error (so failover can act)."""
        try:
            return run_async(coro, timeout + BRIDGE_SLACK)
        except TimeoutError:
            raise StageError(stage, f"{what} did not finish within {timeout:.0f} s") from None

    def _failed(self, attempt: Attempt, error: StageError) -> None:
        """Record the failed attempt and release its session now, before another is rented."""
        attempt.error = error
        recorder = self.recorder
        recorder.store.update_attempt(recorder.row_id, attempt.number, status="failed", stage=error.stage,
                                         error=error.message)
        recorder.progress.status("ATTEMPT", attempt=attempt.number, offer_id=attempt.offer.id, outcome="failed",
                                 stage=error.stage, error=error.message)
        self._release(attempt)

    def _refresh(self, eligible: list[Offer]) -> list[Offer]:
        """The eligible offers now: refreshed from the inventory (stale ones drop out)."""
        provider, timeout = self.provider, self.run.settings.stage_timeout(Stage.INVENTORY)
        try:
            return run_async(provider.choose_offer(self.wanted), timeout + BRIDGE_SLACK).eligible
        except NoEligibleOffer:
            return []
        except (StageError, TimeoutError):
            return eligible  # the inventory did not answer: go on with what it said before

    def _give_up(self, why: str, *, refused: bool = False) -> StageError:
        """The cell's error once no further attempt is made (every attempt so far failed)."""
        last = self.attempts[-1].error
        assert last is not None, "only failed attempts are given up on"
        if len(self.attempts) == 1 and not refused:
            return last  # a single attempt: its own error, word for word
        tried = "; ".join(a.line() for a in self.attempts)
        return AttemptsFailed(last.stage, f"{len(self.attempts)} offer(s) tried, none came up ({why}): {tried}",
                              hint=last.hint)

    # ------------------------------------------------------------------ releasing

    def release_all(self, progress: ProgressWriter | None = None) -> None:
        """Stage ``cleanup``: release every attempt's session not released yet (never raises).

        ``progress`` is where to say so, when another cell than the one that rented
        the session releases it (session reuse).
        """
        for attempt in self.attempts:
            if not attempt.released:
                self._release(attempt, progress)

    def _release(self, attempt: Attempt, progress: ProgressWriter | None = None) -> None:
        recorder, provider = self.recorder, None
        progress = progress or recorder.progress
        timeout = self.run.settings.stage_timeout(Stage.CLEANUP) + BRIDGE_SLACK
        try:
            provider = self.provider
            ids = [attempt.session_id] if attempt.session_id else []
            if not ids:  # the create may have reached the server before it broke off
                found = run_async(provider.owned_sessions(attempt.consumer_id), timeout)
                ids = [s.id for s in found]
            status, api_cost, holding = None, None, []
            for session_id in ids:
                released = run_async(provider.release(session_id), timeout)
                cost = run_async(provider.session_cost(session_id), timeout)
                status = released.final_status
                api_cost = (api_cost or 0.0) + cost if cost is not None else api_cost
                progress.status("CLEANUP", session_id=session_id, attempt=attempt.number, status=status)
                if released.still_holding:
                    holding.append(f"session {session_id} is still {status} after done and DELETE: "
                                   "check it on the provider's console")
            if attempt.session_id and attempt.session_id == recorder.session_id:
                recorder.session_released(status, api_cost)  # the cell's current session
            recorder.store.end_attempt(recorder.row_id, attempt.number, session_status=status,
                                          api_cost_usd=api_cost)
            attempt.released = True
            if holding:
                raise StageError(Stage.CLEANUP, "; ".join(holding))
        except Exception as exc:  # noqa: BLE001 - cleanup reports, it does not mask the cell's error
            progress.error(Stage.CLEANUP, f"releasing attempt {attempt.number}'s session failed: {exc}")
            recorder.cleanup_error = str(exc)
