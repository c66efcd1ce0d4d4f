"""Many controllers, one run: which cell this process runs, puts aside or leaves to another.

Several ``pytest`` processes (controllers, on one machine or many, each maybe with
xdist workers) may run the same matrix into one run id on one shared store. Every
cell runs exactly once; the store's atomic claim with a lease
(:meth:`~pytest_gpubench.store.base.Store.claim_cell`) decides who runs it:

* A cell is claimed just before its item runs (:meth:`ProcessClaims.admit`). Won:
  it runs here, and a heartbeat thread (:class:`ClaimHeartbeat`, one per process)
  renews its lease every third of ``--gpubench-claim-ttl`` from that moment until its
  outcome is on the row. A renewal refused means another controller took the cell
  over (this one was presumed dead): the cell fails at its next stage; the writes
  that change the row are guarded (``if_held_by``), so nothing lands on the new
  holder's row.
* Won over an expired lease (a dead controller's cell): the old holder's sessions of
  that cell are released first (:func:`release_for_takeover`), then it runs.
* Abandoned (cleanup found its holder's process gone, released its session and marked it
  ``failed`` as ``abandoned``): taken over like an expired lease, and run here.
* Held by another live controller: put aside (:data:`Verdict.DEFER`); after every
  other item, this process waits for it (polling the store) until it ends there
  (reported ``claimed``) or its lease runs out (taken over, run here).
* Ended already in this run: reported ``claimed`` (a report category of its own,
  "c"/"CLAIMED", and a skipped JUnit testcase saying who ran it), unless
  ``--gpubench-rerun`` (every ended cell) or ``--gpubench-resume`` (the failed ones)
  asks to run it again: only a cell that ended before this controller started
  (``ended_before``, the same for its xdist workers), so N controllers asked to rerun
  run each cell once, and a running cell is never restarted.

The hooks that call this logic (:class:`ClaimHooks`, registered as ``gpubench-claims``) come last.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..run.cleanup import Action, Leftover, ReleaseOutcome, record, release
from ..cloud.provider import consumer_id
from ..store.claim_rule import abandoned
from ..store.records import CellRecord, Claim
from ..aio import run as run_async
from ..errors import ApiUnreachable
from ..settings import SEED_TOTAL_TIMEOUT
from ..store.progress import ProgressWriter
from ..store.record_keys import row_id as row_id_of  # `row_id` is the claims' name for a row's id
from ..run.live import own_line
from ..run.record import progress_path
from .internals import report_as, teardown_for
from .stash import CELL_KEY, RECORD_KEY, RECORDER_KEY, RESUME_KEY, run_context

if TYPE_CHECKING:
    from ..cloud.provider import Provider
    from ..store.base import Store

#: Final statuses: a cell in one of them has ended in its run.
ENDED = ("success", "partial", "failed", "skipped")
#: How the put-aside wait polls the store: this fraction of the claim's time to live.
POLL_FRACTION = 0.25
#: ``user_properties`` names a claimed cell's reports carry (JUnit, the summary table).
CLAIMED_BY = "gpubench_claimed_by"
CLAIMED_STATUS = "gpubench_claimed_status"
#: ``item.stash`` key: the cell's row id, once the item was first admitted.
ROW_KEY = pytest.StashKey[str]()
#: The report category, its letter and word (``pytest_report_teststatus``).
CATEGORY = ("claimed", "c", "CLAIMED")


class Verdict(str, Enum):
    """What this process does with a cell it is about to run."""

    RUN = "run"          # pending, ours already, or a dead holder's (expired lease, abandoned): claim and run it
    RESTART = "restart"  # ended in this run, and asked to run again: restart the row, then claim it
    DEFER = "defer"      # running under another live holder: come back to it after the other cells
    CLAIMED = "claimed"  # ended in this run (or held with no lease): report who has it, do not run it


def peek(record: CellRecord | None, holder: str, now: float, *, rerun: bool = False,
         resume: bool = False, ended_before: str | None = None) -> Verdict:
    """The verdict on a cell from its row as the store has it (None: not recorded yet).

    ``rerun``: every ended cell runs again; ``resume``: the ended ones that did not succeed;
    either only when it ended before ``ended_before`` (ISO 8601; another controller's rerun
    of it since then counts as this one's).
    A cell running elsewhere without a lease (a holder that takes none, or a row an older
    version left) is reported claimed at once: no lease will ever run out to wait for.
    An abandoned cell (its holder died; cleanup marked it failed) is a dead holder's: run.
    """
    if record is None or record.status == "pending" or abandoned(record.status, record.failure_reason):
        return Verdict.RUN
    if record.status in ENDED:
        if (rerun or (resume and record.status != "success")) and ended_earlier(record, ended_before):
            return Verdict.RESTART
        return Verdict.CLAIMED
    if record.worker == holder:
        return Verdict.RUN
    expires = record.lease_expires_at
    if expires is None:
        return Verdict.CLAIMED
    return Verdict.RUN if expires <= now else Verdict.DEFER


def ended_earlier(record: CellRecord, instant: str | None) -> bool:
    """Whether the ended cell ``record`` ended before ``instant`` (ISO 8601; None: always; a row
    without ``completed_at``, as an older version left, counts as ended long ago)."""
    if instant is None or not record.completed_at:
        return True
    return _instant(record.completed_at) < _instant(instant)


def _instant(text: str) -> datetime:
    found = datetime.fromisoformat(text)
    return found if found.tzinfo is not None else found.replace(tzinfo=timezone.utc)


def item_row(item: pytest.Item) -> str:
    """The row id :meth:`ProcessClaims.admit` found for ``item``."""
    return item.stash[ROW_KEY]


def claimed_message(holder: str | None, since: str | None, status: str) -> str:
    """What a claimed cell's report says: ``claimed elsewhere: host:123 since <t>, success``."""
    return f"claimed elsewhere: {holder or 'another controller'} since {since or '?'}, {status}"


def claimed_properties(record_key: str, holder: str | None, status: str) -> list[tuple[str, Any]]:
    """The report properties of a cell this process did not run (JUnit, the summary table)."""
    return [("gpubench_cell", record_key), ("gpubench_status", "claimed"),
            (CLAIMED_BY, holder or ""), (CLAIMED_STATUS, status)]


def report_claimed(item: pytest.Item, message: str, properties: list[tuple[str, Any]]) -> None:
    """Report ``item`` as claimed elsewhere, never run here: a skipped setup (JUnit writes a
    skipped testcase with ``message``) and a passed teardown carrying ``properties``."""
    path, lineno, _ = item.location
    _report_unrun(item, "skipped", (str(path), (lineno or 0) + 1, message), properties)


def report_failed(item: pytest.Item, message: str) -> None:
    """Report ``item`` failed in setup with ``message``, never run (the store could not say
    whether it is this process's to run)."""
    _report_unrun(item, "failed", message, [])


def _report_unrun(item: pytest.Item, setup: str, longrepr: Any, properties: list[tuple[str, Any]]) -> None:
    """The reports of an item answered without pytest's protocol: ``setup``, then a passed teardown."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    keywords = {name: 1 for name in item.keywords}
    for when, outcome, longrepr in (("setup", setup, longrepr), ("teardown", "passed", None)):
        report = pytest.TestReport(item.nodeid, item.location, keywords, outcome, longrepr, when,
                                   user_properties=list(properties))
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


class ClaimHeartbeat:
    """One thread per process renewing every claim it holds, every third of the claim's time to live.

    A renewal the store refuses (the cell was taken over: this process was presumed dead)
    calls the claim's ``lost`` callback with the new holder, once, and stops renewing it.
    """

    def __init__(self, store: Callable[[], Store], holder: str, lease_seconds: float) -> None:
        self.store, self.holder, self.lease_seconds = store, holder, lease_seconds
        self.interval = lease_seconds / 3
        self._held: dict[str, Callable[[str | None], None]] = {}
        #: Seconds spent renewing each held claim (the cell's ``claim`` overhead).
        self._spent: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, row_id: str, lost: Callable[[str | None], None]) -> None:
        """Renew ``row_id``'s claim until :meth:`drop`; ``lost(new_holder)`` when it is taken over."""
        with self._lock:
            self._held[row_id] = lost
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpubench-claim-heartbeat", daemon=True)
                self._thread.start()

    def drop(self, row_id: str) -> float:
        """Stop renewing ``row_id``'s claim; the seconds its renewals took."""
        with self._lock:
            self._held.pop(row_id, None)
            return self._spent.pop(row_id, 0.0)

    def spent(self, row_id: str) -> float:
        """The seconds ``row_id``'s renewals took so far."""
        with self._lock:
            return self._spent.get(row_id, 0.0)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def beat(self) -> None:
        """Renew every held claim once (the thread's loop; tests call it directly)."""
        for row_id in self.held():
            started = time.perf_counter()
            try:
                renewed = self.store().renew_cell_lease(row_id, self.holder, self.lease_seconds)
            except Exception:  # noqa: BLE001 - a busy store: the next beat tries again, well within the lease
                continue
            finally:
                with self._lock:
                    if row_id in self._held:
                        self._spent[row_id] = self._spent.get(row_id, 0.0) + time.perf_counter() - started
            if not renewed:
                with self._lock:
                    lost = self._held.pop(row_id, None)
                if lost is not None:
                    try:
                        current = self.store().cell(row_id)
                    except Exception:  # noqa: BLE001 - only for the message
                        current = None
                    lost(current.worker if current is not None else None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def takeover_consumers(run_id: str, record_key: str) -> re.Pattern[str]:
    """The consumer ids every attempt of the cell rents under (``...-a1``, ``...-a2``, ...)."""
    base = consumer_id(run_id, record_key, 1).removesuffix("-a1")
    return re.compile(re.escape(base) + r"-a(\d+)")


async def release_for_takeover(store: Store, provider: Provider | None, cell: CellRecord,
                               old_holder: str | None, progress_dir: Path | None = None) -> list[Action]:
    """Release the sessions a dead holder left of ``cell``: those recorded on its row and
    those the provider knows by the cell's consumer ids; each release is recorded
    (``released_by="takeover"``), with a line in the cell's progress file under ``progress_dir``.
    Returns what was done."""
    leftovers = [Leftover.model_validate(found, from_attributes=True)
                 for found in await asyncio.to_thread(store.unreleased_sessions, cell.run_id)
                 if found.row_id == cell.row_id]
    if provider is not None and cell.cell_id:
        known = {lo.session_id for lo in leftovers}
        pattern = takeover_consumers(cell.run_id, cell.cell_id)
        for session in await provider.owned_sessions():
            match = pattern.fullmatch(session.consumer_id or "")
            if match and session.id not in known:
                leftovers.append(Leftover(session_id=session.id, run_id=cell.run_id, consumer_id=session.consumer_id,
                                          row_id=cell.row_id, cell_id=cell.cell_id, worker=old_holder,
                                          progress_file=cell.progress_file, attempt=int(match[1]), found_by="api"))
    actions = []
    for leftover in leftovers:
        if provider is None:
            action = Action(leftover=leftover, outcome=ReleaseOutcome.FAILED, detail="no provider to release it")
        else:
            action = await release(provider, leftover)
        await asyncio.to_thread(record, store, action, "takeover", progress_dir)
        actions.append(action)
    return actions


@dataclass
class Admission:
    """What :meth:`ProcessClaims.admit` decided for one item."""

    verdict: Verdict
    row_id: str
    #: The claim won (RUN), or the row that made the verdict (DEFER, CLAIMED).
    claim: Claim | None = None
    record: CellRecord | None = None

    def claimed_text(self) -> tuple[str | None, str | None, str]:
        """(holder, since, status) of a cell held or ended elsewhere."""
        if self.record is not None:
            return self.record.worker, self.record.started_at, self.record.status
        claim = self.claim
        return (claim.holder, claim.since, claim.status) if claim is not None else (None, None, "running")


@dataclass
class ProcessClaims:
    """This process's side of the run's claims: its holder name, lease, heartbeat and the
    items it put aside."""

    store: Callable[[], Store]
    run_id: str
    holder: str
    lease_seconds: float
    rerun: bool = False
    resume: bool = False
    #: A rerun or resume restarts only cells that ended before this (the controller's start).
    ended_before: str | None = None
    heartbeat: ClaimHeartbeat = field(init=False)
    #: Cells whose claim was taken over before their recorder started: the new holder.
    lost: dict[str, str | None] = field(default_factory=dict)
    #: Items held elsewhere when their turn came, in run order.
    deferred: list[pytest.Item] = field(default_factory=list)
    #: The put-aside pass has begun: nothing is put aside any more.
    final_pass: bool = False

    def __post_init__(self) -> None:
        self.heartbeat = ClaimHeartbeat(self.store, self.holder, self.lease_seconds)

    def admit(self, row_id: str, add_row: Callable[[], str], now: float | None = None) -> Admission:
        """Decide about the cell ``row_id`` (``add_row`` records it when the store lacks it) and,
        when it is to run here, claim it: the claim is the decision that counts, the peek only
        saves a write for cells that are clearly not ours."""
        store = self.store()
        record = store.cell(row_id)
        if record is None:
            row_id = add_row()
            record = store.cell(row_id)
        at = time.time() if now is None else now
        verdict = peek(record, self.holder, at, rerun=self.rerun, resume=self.resume,
                       ended_before=self.ended_before)
        if verdict in (Verdict.DEFER, Verdict.CLAIMED):
            return Admission(verdict, row_id, record=record)
        if verdict is Verdict.RESTART:
            # Refused when another controller restarted (or is running) it since the peek.
            store.restart_cell(row_id, ended_before=self.ended_before)
        claim = store.claim_cell(row_id, self.holder, lease_seconds=self.lease_seconds, now=now)
        if claim.won:
            # Renewed from now on: a take-over's releases or slow fixtures may outlast a lease.
            self.lost.pop(row_id, None)
            self.heartbeat.hold(row_id, lambda new_holder: self.lost.__setitem__(row_id, new_holder))
            return Admission(Verdict.RUN, row_id, claim=claim)
        # Another process was quicker between the peek and the claim.
        later = Verdict.CLAIMED if claim.status in ENDED or claim.lease_expires_at is None else Verdict.DEFER
        return Admission(later, row_id, claim=claim)

    def give_back(self, row_id: str) -> bool:
        """A cell this process won but never started (a skip mark, a fixture that failed
        before the recorder, a store error): stop renewing it and make it ``pending`` again,
        only while it is still this holder's. Whether it was given back."""
        self.heartbeat.drop(row_id)
        return self.store().update_cell(row_id, if_held_by=self.holder, status="pending", worker=None,
                                        lease_expires_at=None)

    def next_ready(self, deadline: float, now: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep) -> pytest.Item | None:
        """Take from :attr:`deferred` the first item whose cell is no longer held by a live
        other holder (it ended there, or its lease ran out), polling the store every
        fraction of the claim's time to live; once ``deadline`` (seconds since the epoch)
        has passed, the first item whatever its state. None when nothing is put aside."""
        interval = max(0.2, self.lease_seconds * POLL_FRACTION)
        while self.deferred:
            for item in self.deferred:
                try:
                    record = self.store().cell(item_row(item))
                except Exception:  # noqa: BLE001 - a store blip: still put aside; admit says why at the deadline
                    continue
                if peek(record, self.holder, now()) is not Verdict.DEFER:
                    self.deferred.remove(item)
                    return item
            if now() >= deadline:
                return self.deferred.pop(0)
            sleep(min(interval, max(0.0, deadline - now())))
        return None

    def close(self) -> None:
        self.heartbeat.close()


# --------------------------------------------------------------------------------------------------
# The hooks of many controllers on one run (the logic is above).
#
# Registered as ``gpubench-claims`` in every process that runs cells (the single
# pytest process, or each xdist worker: xdist's worker loop calls
# ``pytest_runtest_protocol`` for each item as pytest's own loop does).
#
# * ``pytest_runtest_protocol`` (tryfirst) claims a cell just before its item runs;
#   an item not to run here (held elsewhere: put aside; ended elsewhere: reported
#   ``claimed``) is answered here without pytest's own protocol.
# * ``pytest_runtestloop`` (wrapper) runs the put-aside items after the others.
# * ``pytest_runtest_teardown`` (wrapper) gives back the claim of an item that never
#   started its cell (skipped by a mark before any fixture).
#
# Two things have no public pytest or xdist way, and go through :mod:`.internals`: an item
# answered without running still has the previous item's kept fixtures on the stack, and
# what the next item does not share must go (:func:`~.internals.teardown_for`); under xdist, a
# put-aside item's reports are sent under its own index (:func:`~.internals.report_as`).
# ``tests/e2e/test_claims_controllers.py`` runs a put-aside item between items of other
# files and of a class to keep that honest.


#: ``item.stash``: the claim an item won before it ran, and the seconds deciding it took.
CLAIMED_KEY = pytest.StashKey[bool]()
CLAIM_SECONDS_KEY = pytest.StashKey[float]()

class ClaimHooks:
    """This process's claims on the run's cells."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._claims: ProcessClaims | None = None
        #: When the put-aside pass stops waiting for other holders (seconds since the epoch).
        self.deadline: float | None = None

    @property
    def claims(self) -> ProcessClaims:
        if self._claims is None:
            context = run_context(self.config)
            settings = context.settings
            self._claims = ProcessClaims(lambda: context.store, context.run_id, context.worker,
                                         settings.claim_seconds, rerun=settings.rerun,
                                         resume=RESUME_KEY in self.config.stash,
                                         ended_before=context.owner.since)
        return self._claims

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if CELL_KEY not in item.stash or RECORD_KEY not in item.stash:
            return None
        claims, key, cell = self.claims, item.stash[RECORD_KEY], item.stash[CELL_KEY]
        store = run_context(self.config).store

        def add_row() -> str:
            return store.add_cell(claims.run_id, key, gpu_type=cell.gpu, provider=cell.provider,
                                  model=cell.model, matrix_file=cell.source)

        started = time.perf_counter()
        item.stash[ROW_KEY] = row_id_of(claims.run_id, key)
        try:
            admission = claims.admit(item.stash[ROW_KEY], add_row)
        except Exception as exc:  # noqa: BLE001 - a store error fails this item, never the whole session
            return self._unrun(item, nextitem, f"gpubench: could not claim cell {key}: {type(exc).__name__}: {exc}")
        item.stash[CLAIM_SECONDS_KEY] = time.perf_counter() - started
        item.stash[ROW_KEY] = admission.row_id
        if admission.verdict is Verdict.RUN:
            item.stash[CLAIMED_KEY] = True
            if admission.claim is not None and admission.claim.taken_over_from:
                try:
                    self._take_over(item, admission.claim.taken_over_from)
                except Exception as exc:  # noqa: BLE001 - as above; the cell goes back to pending
                    self._give_back(item)
                    return self._unrun(item, nextitem, f"gpubench: cell {key}: could not release what "
                                       f"{admission.claim.taken_over_from} left before taking it over: "
                                       f"{type(exc).__name__}: {exc}; the cell is pending again")
            return None  # pytest's own protocol runs it
        if admission.verdict is Verdict.DEFER and (self.deadline is None or time.time() < self.deadline):
            claims.deferred.append(item)
        else:
            holder, since, status = admission.claimed_text()
            report_claimed(item, claimed_message(holder, since, status), claimed_properties(key, holder, status))
        teardown_for(item, nextitem)
        return True

    def _unrun(self, item: pytest.Item, nextitem: pytest.Item | None, message: str) -> bool:
        """Answer ``item`` failed with ``message`` without running it."""
        item.stash[CLAIMED_KEY] = False
        report_failed(item, message)
        teardown_for(item, nextitem)
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        result = yield
        claims = self._claims
        if claims is None or not claims.deferred:
            return result
        settings = run_context(self.config).settings
        self.deadline = time.time() + settings.scaled(SEED_TOTAL_TIMEOUT, 2 * settings.claim_seconds)
        while claims.deferred and not (session.shouldfail or session.shouldstop):
            item = claims.next_ready(self.deadline)
            if item is None:
                break
            report_as(self.config, session, item)
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None):
        try:
            return (yield)
        finally:
            if item.stash.get(CLAIMED_KEY, False) and RECORDER_KEY not in item.stash:
                self._give_back(item)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._claims is not None:
            self._claims.close()

    # ---------------------------------------------------------------- helpers

    def _give_back(self, item: pytest.Item) -> None:
        """The item never started its cell (a skip mark, a fixture before the recorder failed):
        the row goes back to ``pending`` rather than stay ``running`` under this holder."""
        try:
            self.claims.give_back(item.stash[ROW_KEY])
        except Exception as exc:  # noqa: BLE001 - its lease runs out and another controller takes it
            self._warn(f"gpubench: could not give back cell {item.stash[RECORD_KEY]}: {type(exc).__name__}: {exc}")

    def _warn(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not hasattr(self.config, "workerinput"):
            own_line(self.config, reporter, line, yellow=True)

    def _take_over(self, item: pytest.Item, old_holder: str) -> None:
        """Release what the dead holder left of the cell, and say so in its progress file
        (which the controller's terminal follows) and here."""
        context = run_context(self.config)
        cell = item.stash[CELL_KEY]
        try:
            provider = context.provider_for(cell.cloud)
        except ApiUnreachable:
            provider = None
        record = context.store.cell(item.stash[ROW_KEY])
        actions = []
        if record is not None:
            actions = run_async(release_for_takeover(context.store, provider, record, old_holder,
                                                     context.settings.progress_dir),
                                timeout=3 * max(120.0, context.settings.claim_seconds))
        released = ",".join(action.leftover.session_id for action in actions) or "none"
        path = progress_path(context.settings.progress_dir, context.run_id, item.stash[RECORD_KEY])
        writer = ProgressWriter(path)
        try:
            writer.status("TAKEN_OVER", taken_from=old_holder, by=context.worker, released_sessions=released)
        finally:
            writer.close()
        self._warn(f"gpubench: {item.stash[RECORD_KEY]}: taken over from {old_holder} "
                   f"(its claim expired); released sessions: {released}")


def claim_keeping(item: pytest.Item) -> dict[str, Any]:
    """``CellRecorder.start``'s claim arguments for ``item`` in this process: the lease, the
    heartbeat and the time its claim took so far (none where the claim hooks are not registered)."""
    hooks = item.config.pluginmanager.get_plugin("gpubench-claims")
    if not isinstance(hooks, ClaimHooks):
        return {}
    claims = hooks.claims
    return {"lease_seconds": claims.lease_seconds, "heartbeat": claims.heartbeat,
            "claim_seconds": item.stash.get(CLAIM_SECONDS_KEY, 0.0)}
