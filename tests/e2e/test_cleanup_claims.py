"""Cleanup on a run several controllers share (run/cleanup.py with plugin/claims.py).

The run's recorded owner is only one of its controllers, and it is dead here: cleanup
must still leave alone every session a live controller holds (its cell running under a
live lease, a session kept between the cells of a reuse group, one only the API knows),
release a dead holder's, and never mark failed a cell a live controller took over while
cleanup was releasing. Real sessions on the sandbox API; the store is SQLite.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from e2e_helpers import RENTABLE_OFFER, SANDBOX_TOKEN, rent, session_status
from polling import wait_for

import pytest

from pytest_gpubench.run.cleanup import ReleaseOutcome, clean, close_cells
from pytest_gpubench.cloud.processes import ProcessIdentity
from pytest_gpubench.cloud.provider import consumer_id
from pytest_gpubench.cloud.shopper_client import ShopperClient
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.plugin.claims import ProcessClaims, Verdict, release_for_takeover
from pytest_gpubench.settings import Settings
from pytest_gpubench.store.opening import open_store

OFFER = RENTABLE_OFFER
status = session_status

RUN = "shared"
#: A controller on another machine that still renews its claims, and one that died there.
LIVE = "box-b:7:0a0b0c0d"
DEAD = "box-c:9:0e0f1011"


def add(store, cell_id):
    return store.add_cell(RUN, cell_id, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                          matrix_file="m.yaml")


def rented(store, api, row, cell_id, *, record=True):
    """A real session for the cell's first attempt, recorded on its row unless ``record`` is False."""
    session = rent(api, consumer_id(RUN, cell_id, 1))
    if record:
        store.record_session(row, session_id=session, consumer_id=consumer_id(RUN, cell_id, 1), offer_id=OFFER,
                             price_per_hour=0.16)
    return session


async def _clean(url, store):
    provider = ShopperProvider(ShopperClient(url, token=SANDBOX_TOKEN), Settings(api=url, api_token=SANDBOX_TOKEN))
    try:
        return await clean(store, provider, api=url, released_by="test", reason="its controller died",
                           run_id=RUN, check_liveness=True, search_api=True)
    finally:
        await provider.aclose()


def test_cleanup_keeps_every_session_a_live_controller_holds_and_releases_a_dead_one_s(tmp_path, sandbox, api):
    with open_store(str(tmp_path / "shared.db")) as store:
        dead_owner = ProcessIdentity(pid=2 ** 22 + 7, host=socket.gethostname())  # above any pid_max: not running
        store.start_run(RUN, [], [], owner=dead_owner, api=sandbox.url)  # its recorded owner died
        running, kept, unrecorded, dead = (add(store, c) for c in ("running", "kept", "unrecorded", "dead"))
        store.claim_cell(running, LIVE, lease_seconds=600)
        s_running = rented(store, api, running, "running")
        # A reuse group's session, kept for the group's next cell: its cell ended under LIVE.
        store.claim_cell(kept, LIVE, lease_seconds=600)
        s_kept = rented(store, api, kept, "kept")
        assert store.finish_cell(kept, status="success", if_held_by=LIVE)
        # A session LIVE created but had not recorded yet: only the API knows it.
        store.claim_cell(unrecorded, LIVE, lease_seconds=600)
        s_unrecorded = rented(store, api, unrecorded, "unrecorded", record=False)
        store.claim_cell(dead, DEAD, lease_seconds=600, now=time.time() - 1200)  # its lease ran out
        s_dead = rented(store, api, dead, "dead")

        report = asyncio.run(_clean(sandbox.url, store))

        outcomes = {a.leftover.session_id: a.outcome for a in report.actions}
        assert outcomes[s_dead] is ReleaseOutcome.RELEASED
        for session in (s_running, s_kept, s_unrecorded):
            assert outcomes[session] is ReleaseOutcome.LEFT_ALONE
            assert status(api, session) == "running"
        assert status(api, s_dead) == "stopped"
        assert report.closed_cells == [dead]
        assert store.cell(running).status == "running" and store.cell(unrecorded).status == "running"
    for session in (s_running, s_kept, s_unrecorded):
        api.post(f"/api/v1/sessions/{session}/done")
    wait_for(lambda: status(api, s_running) == "stopped", 60, "the sessions to stop")


def test_cleanup_never_marks_failed_a_cell_a_live_controller_took_over_meanwhile(tmp_path):
    """Cleanup found the cell running under its dead holder and released its session; meanwhile
    a survivor took it over: the cell is the survivor's, running, and its lease still renews."""
    with open_store(str(tmp_path / "shared.db")) as store:
        store.start_run(RUN, [], [])
        row = add(store, "x")
        store.claim_cell(row, DEAD, lease_seconds=60, now=time.time() - 120)
        found_under = store.cell(row).worker
        taken = store.claim_cell(row, LIVE, lease_seconds=60)
        assert taken.won and taken.taken_over_from == DEAD
        assert close_cells(store, {row: found_under}, "its controller died", "test") == []
        cell = store.cell(row)
        assert (cell.status, cell.worker, cell.error_message) == ("running", LIVE, None)
        assert store.renew_cell_lease(row, LIVE, 60)
        assert close_cells(store, {row: LIVE}, "its controller died", "test") == [row]  # still its holder's: closed
        assert store.cell(row).status == "failed"


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "git"])
def test_a_dead_holder_s_cell_is_released_and_left_for_the_next_controller_to_take_over(
        tmp_path, sandbox, api, shared_store, monkeypatch):
    """Issue 21 item 15: a controller died mid-cell on this host, its lease still live; the next
    controller's start-up cleanup releases its session and marks the cell failed as abandoned,
    and that controller (or any other that claims it first) takes it over and runs it, instead
    of reporting it claimed by the dead one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the git store's local manifest and clones
    dead = ProcessIdentity(pid=2 ** 22 + 7, host=socket.gethostname(), nonce="0a0b0c0d")  # not running
    joiner = ProcessIdentity(pid=os.getpid(), host=socket.gethostname(), nonce="1a1b1c1d").holder()
    with open_store(shared_store) as store:
        store.start_run(RUN, [], [], owner=dead, api=sandbox.url)
        row = add(store, "x")
        assert store.claim_cell(row, dead.holder(), lease_seconds=3600).won  # its lease runs for an hour
        session = rented(store, api, row, "x")

        report = asyncio.run(_clean(sandbox.url, store))

        assert {a.leftover.session_id: a.outcome for a in report.actions} == {session: ReleaseOutcome.RELEASED}
        assert status(api, session) == "stopped"
        assert report.closed_cells == [row]
        closed = store.cell(row)
        taker, other = (ProcessClaims(lambda: store, RUN, name, 60.0) for name in (joiner, "box-b:7:0a0b0c0d"))
        try:
            taken = taker.admit(row, lambda: row)
            assert taken.verdict is Verdict.RUN and taken.claim.taken_over_from == dead.holder()
            assert other.admit(row, lambda: row).verdict is Verdict.DEFER  # one taker: the cell runs once
        finally:
            taker.close()
            other.close()
        # Until then the record said why: failed, its holder gone, for the next controller to take over.
        assert (closed.status, closed.failure_reason) == ("failed", "abandoned")
        assert f"the next controller of run {RUN} that reaches it takes it over" in closed.error_message
        cell = store.cell(row)
        assert (cell.status, cell.worker, cell.failure_reason, cell.error_message, cell.completed_at) == (
            "running", joiner, None, None, None)
        assert asyncio.run(release_for_takeover(store, None, cell, dead.holder())) == []  # nothing left to release
