"""The hooks of many controllers on one run (the logic is :mod:`.claims`'s).

Registered as ``gpubench-claims`` in every process that runs cells (the single
pytest process, or each xdist worker: xdist's worker loop calls
``pytest_runtest_protocol`` for each item as pytest's own loop does).

* ``pytest_runtest_protocol`` (tryfirst) claims a cell just before its item runs;
  an item not to run here (held elsewhere: put aside; ended elsewhere: reported
  ``claimed``) is answered here without pytest's own protocol.
* ``pytest_runtestloop`` (wrapper) runs the put-aside items after the others.
* ``pytest_runtest_teardown`` (wrapper) gives back the claim of an item that never
  started its cell (skipped by a mark before any fixture).

Two things have no public pytest or xdist way, and go through :mod:`.internals`: an item
answered without running still has the previous item's kept fixtures on the stack, and
what the next item does not share must go (:func:`~.internals.teardown_for`); under xdist, a
put-aside item's reports are sent under its own index (:func:`~.internals.report_as`).
``tests/e2e/test_claims_controllers.py`` runs a put-aside item between items of other
files and of a class to keep that honest.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ..aio import run as run_async
from ..errors import ApiUnreachable
from ..settings import SEED_TOTAL_TIMEOUT
from ..store.progress import ProgressWriter
from ..store.records import row_id
from .claims import (CLAIMED_BY, CLAIMED_STATUS, ROW_KEY, ProcessClaims, Verdict, claimed_message,
                     claimed_properties, release_for_takeover, report_claimed, report_failed)
from ..run.live import own_line
from ..run.record import progress_path
from .internals import report_as, teardown_for
from .stash import CELL_KEY, RECORD_KEY, RECORDER_KEY, RESUME_KEY, run_context

#: ``item.stash``: the claim an item won before it ran, and the seconds deciding it took.
CLAIMED_KEY = pytest.StashKey[bool]()
CLAIM_SECONDS_KEY = pytest.StashKey[float]()

__all__ = ["CLAIMED_BY", "CLAIMED_STATUS", "ClaimHooks", "claim_keeping"]


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
        item.stash[ROW_KEY] = row_id(claims.run_id, key)
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
