"""A cell is claimed in the store before it runs: never run twice at once, never run again in
its run unless asked (``--gpubench-rerun``, ``--gpubench-resume``), taken over when its
holder's lease runs out, put aside while another live holder has it (plugin/claims.py)."""

from __future__ import annotations

import pytest

from pytest_gpubench.cloud.processes import ProcessIdentity, held_by, holder_alive
from pytest_gpubench.errors import ClaimLost, Stage, StageError, StoreProblem
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.plugin.claims import ClaimHeartbeat, ProcessClaims, Verdict, peek
from pytest_gpubench.run.record import CellOutcome, CellRecorder
from pytest_gpubench.store.opening import open_store
from pytest_gpubench.store.record_keys import row_id

(CELL,) = expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]", "gpubench_c.yaml"))
ROW = row_id("r1", CELL.cell_id)
LEASE = 10.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request, tmp_path):
    """The store the controllers share: a SQLite file (one machine) or a PostgreSQL database."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return str(tmp_path / "manifest.db")


@pytest.fixture
def store(store_location):
    with open_store(store_location) as opened:
        opened.start_run("r1", [], [])
        yield opened


def start(store, tmp_path, worker, **claim):
    return CellRecorder.start(store, "r1", CELL, CELL.cell_id, tmp_path / "progress", worker, **claim)


def add(store):
    return store.add_cell("r1", CELL.cell_id, gpu_type=CELL.gpu, provider=CELL.provider, model=CELL.model,
                          matrix_file=CELL.source)


def claims(store, holder, **flags):
    return ProcessClaims(lambda: store, "r1", holder, LEASE, **flags)


def test_holder_names_are_unique_per_process_and_cover_their_xdist_workers():
    me = ProcessIdentity(pid=41, host="box-a")
    assert (me.holder(), me.holder("gw2")) == ("box-a:41", "box-a:41/gw2")
    assert held_by("box-a:41/gw2", "box-a:41") and held_by("box-a:41", "box-a:41")
    assert not held_by("box-a:411", "box-a:41") and not held_by("box-b:41", "box-a:41") and not held_by(None, "x")


def test_a_cell_running_under_one_worker_is_not_started_by_another(store, tmp_path):
    first = start(store, tmp_path, "gw0")
    with pytest.raises(StageError, match=r"already running under worker gw0: not run a second time") as raised:
        start(store, tmp_path, "gw1")
    assert raised.value.stage is Stage.INVENTORY
    record = store.cell(first.row_id)
    assert (record.status, record.worker) == ("running", "gw0")


def test_a_finished_cell_is_not_started_again_unless_restarted_first(store, tmp_path):
    first = start(store, tmp_path, "gw0")
    first.finish(CellOutcome("failed", failure_stage="ssh_wait", error_message="no SSH"))
    with pytest.raises(StageError, match=r"already failed under worker gw0"):
        start(store, tmp_path, "gw1")
    assert store.restart_cell(first.row_id)
    again = start(store, tmp_path, "gw1")
    record = store.cell(ROW)
    assert again.row_id == first.row_id
    assert (record.status, record.worker, record.failure_stage, record.error_message) == ("running", "gw1", None, None)
    assert record.started_at and record.progress_file


@pytest.mark.parametrize(("status", "worker", "lease", "flags", "verdict"), [
    ("pending", None, None, {}, Verdict.RUN),
    ("running", "me", 50.0, {}, Verdict.RUN),                 # ours already (claiming again renews)
    ("running", "other", 150.0, {}, Verdict.DEFER),           # a live holder: put aside
    ("running", "other", None, {}, Verdict.CLAIMED),          # held with no lease: nothing to wait for
    ("running", "other", 100.0, {}, Verdict.RUN),             # its lease ran out (at now): taken over
    ("success", "other", None, {}, Verdict.CLAIMED),
    ("failed", "me", None, {}, Verdict.CLAIMED),              # ended in this run, even here: not run again
    ("failed", "other", None, {"resume": True}, Verdict.RESTART),
    ("success", "other", None, {"resume": True}, Verdict.CLAIMED),
    ("success", "other", None, {"rerun": True}, Verdict.RESTART),
    ("skipped", "other", None, {"rerun": True}, Verdict.RESTART),
])
def test_peek_decides_from_the_row(store, status, worker, lease, flags, verdict):
    add(store)
    if status != "pending":
        store.update_cell(ROW, status=status, worker=worker, lease_expires_at=lease)
    assert peek(store.cell(ROW), "me", now=100.0, **flags) is verdict


def test_peek_runs_a_cell_the_store_does_not_know_yet():
    assert peek(None, "me", now=0.0) is Verdict.RUN


def test_an_abandoned_cell_is_run_by_whoever_claims_it_first_and_only_it(store):
    """Cleanup found its holder gone and marked it failed as abandoned (issue 21 item 15): a dead
    holder's cell, run here (taken over), not reported claimed; a failure of its own run is."""
    add(store)
    store.update_cell(ROW, status="failed", worker="dead", failure_reason="abandoned", lease_expires_at=None)
    assert peek(store.cell(ROW), "me", now=100.0) is Verdict.RUN
    first, second = claims(store, "me"), claims(store, "other")
    try:
        won = first.admit(ROW, lambda: ROW)
        assert won.verdict is Verdict.RUN and won.claim.taken_over_from == "dead"
        assert second.admit(ROW, lambda: ROW).verdict is Verdict.DEFER
    finally:
        first.close()
        second.close()
    store.update_cell(ROW, status="failed", worker="dead", failure_reason="interrupted")
    assert peek(store.cell(ROW), "me", now=100.0) is Verdict.CLAIMED


def test_admit_claims_with_a_lease_and_reports_what_it_did_not_win(store):
    mine, theirs = claims(store, "box-a:1"), claims(store, "box-b:2")
    won = mine.admit(ROW, lambda: add(store), now=1000.0)
    assert won.verdict is Verdict.RUN and won.claim.won and won.claim.lease_expires_at == 1000.0 + LEASE
    held = theirs.admit(ROW, lambda: add(store), now=1005.0)
    assert held.verdict is Verdict.DEFER and held.claimed_text()[0] == "box-a:1"
    taken = theirs.admit(ROW, lambda: add(store), now=1000.0 + LEASE + 1)
    assert taken.verdict is Verdict.RUN and taken.claim.taken_over_from == "box-a:1"
    store.finish_cell(ROW, status="success")
    ended = mine.admit(ROW, lambda: add(store))
    assert ended.verdict is Verdict.CLAIMED
    assert ended.claimed_text()[::2] == ("box-b:2", "success")
    assert store.cell(ROW).status == "success"  # nothing written by a controller that did not win


@pytest.mark.parametrize(("flags", "status", "runs"), [
    ({"rerun": True}, "success", True), ({"resume": True}, "failed", True),
    ({"resume": True}, "success", False), ({}, "failed", False),
])
def test_rerun_and_resume_restart_an_ended_cell_before_claiming_it(store, flags, status, runs):
    add(store)
    store.claim_cell(ROW, "old:1")
    store.finish_cell(ROW, status=status, error_message="before")
    admission = claims(store, "new:2", **flags).admit(ROW, lambda: add(store))
    assert (admission.verdict is Verdict.RUN) is runs
    record = store.cell(ROW)
    if runs:
        assert (record.status, record.worker, record.error_message) == ("running", "new:2", None)
    else:
        assert (record.status, record.worker) == (status, "old:1")


class Clock:
    """Time that moves only when waited on: the put-aside wait without wall-clock luck."""

    def __init__(self, start: float) -> None:
        self.now, self.sleeps = start, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_put_aside_items_come_back_as_their_holders_let_go(store):
    """Cells a, b, c held elsewhere: c ends there first, then a's lease runs out; b stays
    held by a live holder until the deadline, then comes last (to be reported claimed)."""
    from pytest_gpubench.plugin.claims import ROW_KEY

    rows = {}
    for name in "abc":
        rows[name] = store.add_cell("r1", name, gpu_type="g", provider="p", model="m", matrix_file="f")
        store.claim_cell(rows[name], "other:9", lease_seconds=LEASE, now=1000.0)
    items = {name: Item(name) for name in "abc"}
    for name, item in items.items():
        item.stash[ROW_KEY] = rows[name]
    mine = claims(store, "me:1")
    mine.deferred = [items["a"], items["b"], items["c"]]
    clock = Clock(1001.0)
    store.finish_cell(rows["c"], status="success")
    assert mine.next_ready(deadline=2000.0, now=clock, sleep=clock.sleep) is items["c"]
    assert clock.sleeps == []  # ready at once: no wait
    store.renew_cell_lease(rows["b"], "other:9", 5000.0, now=1000.0)  # b's holder lives on
    assert mine.next_ready(deadline=2000.0, now=clock, sleep=clock.sleep) is items["a"]
    assert clock.now >= 1000.0 + LEASE and set(clock.sleeps) <= {LEASE / 4}  # polled at a fraction of the ttl
    assert mine.next_ready(deadline=2000.0, now=clock, sleep=clock.sleep) is items["b"]
    assert clock.now >= 2000.0
    assert mine.next_ready(deadline=2000.0, now=clock, sleep=clock.sleep) is None


class Item:
    """What ``next_ready`` reads of a pytest item: its stash."""

    def __init__(self, name: str) -> None:
        self.name, self.stash = name, {}


def test_the_heartbeat_renews_every_held_claim_and_reports_a_lost_one(store):
    add(store)
    store.claim_cell(ROW, "me:1", lease_seconds=LEASE, now=1000.0)
    lost = []
    beat = ClaimHeartbeat(lambda: store, "me:1", LEASE)
    beat.hold(ROW, lost.append)
    try:
        beat.beat()
        assert store.cell(ROW).lease_expires_at > 1000.0 + LEASE  # renewed from now
        assert lost == []
        store.claim_cell(ROW, "other:2", lease_seconds=LEASE, now=store.cell(ROW).lease_expires_at + 1)
        beat.beat()
        assert lost == ["other:2"] and beat.held() == []
    finally:
        beat.close()


@pytest.fixture
def heartbeat(store):
    beat = ClaimHeartbeat(lambda: store, "me:1", LEASE)
    yield beat
    beat.close()


def take_over(store):
    """Another holder takes the cell over once ``me:1``'s lease ran out."""
    expires = store.cell(ROW).lease_expires_at
    return store.claim_cell(ROW, "other:2", lease_seconds=LEASE, now=expires + 1)


def test_a_taken_over_cell_fails_at_its_next_stage_and_writes_nothing(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    assert heartbeat.held() == [ROW]
    assert take_over(store).taken_over_from == "me:1"
    heartbeat.beat()
    with pytest.raises(StageError, match=r"lost its claim .* taken over by other:2") as raised:
        recorder.enter(Stage.BENCHMARK)
    assert raised.value.stage is Stage.BENCHMARK
    properties = recorder.finish(CellOutcome("success"))
    assert properties["gpubench_status"] == "failed"
    row = store.cell(ROW)
    assert (row.status, row.worker, row.error_message) == ("running", "other:2", None)
    assert "claim_lost" in recorder.progress.path.read_text()


def test_a_claim_lost_unseen_by_the_heartbeat_is_caught_when_the_cell_finishes(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    take_over(store)
    properties = recorder.finish(CellOutcome("success"))
    assert properties["gpubench_status"] == "failed" and recorder.claim_lost
    assert store.cell(ROW).status == "running" and store.results("r1") == []


def test_cleanup_leaves_a_session_alone_while_its_cell_s_claim_is_live(store):
    """A shared run whose recorded owner died: the sessions of cells another controller still
    holds (a live lease, its process running) are left alone; a dead holder's are released."""
    import os
    import socket
    import time

    from pytest_gpubench.run.cleanup import survey

    dead = ProcessIdentity(pid=2 ** 22 + 7, host=socket.gethostname())
    store.start_run("r1", [], [], owner=dead)
    add(store)
    other = store.add_cell("r1", "other-cell", gpu_type="g", provider="p", model="m", matrix_file="f")
    live_holder = ProcessIdentity(pid=os.getpid(), host=socket.gethostname()).holder("gw1")
    store.claim_cell(ROW, live_holder, lease_seconds=60)
    store.claim_cell(other, dead.holder(), lease_seconds=60)
    for row, session in ((ROW, "s-live"), (other, "s-dead")):
        store.record_session(row, session_id=session, consumer_id=f"c-{session}", offer_id="o", price_per_hour=1.0)
    found = survey(store, api=None, run_id="r1")
    assert [lo.session_id for lo in found.to_release] == ["s-dead"]
    (alone,) = found.left_alone
    assert alone.leftover.session_id == "s-live" and f"holder {live_holder} still holds a live claim" in alone.detail
    store.update_cell(ROW, lease_expires_at=time.time() - 1)  # its lease ran out, but its process runs here
    (alone,) = survey(store, api=None, run_id="r1").left_alone
    assert f"holder {live_holder} still runs on this host" in alone.detail


def test_the_time_spent_claiming_and_renewing_is_the_cell_s_claim_seconds(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat, claim_seconds=0.25)
    heartbeat.beat()
    recorder.finish(CellOutcome("success"))
    claim = store.cell(ROW).stage_seconds["claim"]
    assert 0.25 < claim < 5


def test_a_holder_name_carries_a_per_process_nonce_and_keeps_host_pid_first():
    """Two containers with the same hostname and pid still hold claims under different names."""
    import os
    import socket

    me = ProcessIdentity.current()
    assert me.holder() == ProcessIdentity.current().holder()  # one nonce for the whole process
    host, pid, nonce = me.holder().split(":")
    assert (host, pid) == (socket.gethostname(), str(os.getpid())) and len(nonce) >= 8
    twin = ProcessIdentity(pid=me.pid, host=me.host, start=me.start, nonce="0" * 8)
    assert twin.holder() != me.holder() and not held_by(twin.holder("gw0"), me.holder())
    assert holder_alive(me.holder("gw1")) is True and holder_alive(f"{host}:{2 ** 22 + 7}:abc/gw0") is False
    assert holder_alive("elsewhere:1:abc") is None


def test_admit_holds_the_heartbeat_from_the_claim_on_and_give_back_lets_go(store):
    """A take-over's releases and slow fixtures come between the claim and the recorder: the
    lease is renewed from the moment admit wins; a cell never started goes back to pending."""
    mine = claims(store, "box-a:1")
    try:
        assert mine.admit(ROW, lambda: add(store), now=1000.0).verdict is Verdict.RUN
        assert mine.heartbeat.held() == [ROW]
        mine.heartbeat.beat()
        assert store.cell(ROW).lease_expires_at > 1000.0 + LEASE  # renewed from now, not the claim's time
        assert mine.give_back(ROW)
        assert mine.heartbeat.held() == []
        record = store.cell(ROW)
        assert (record.status, record.worker, record.lease_expires_at) == ("pending", None, None)
        store.claim_cell(ROW, "box-b:2", lease_seconds=LEASE)
        assert not mine.give_back(ROW)  # another holder's: left alone
        assert store.cell(ROW).worker == "box-b:2"
    finally:
        mine.close()


def test_a_rerun_asked_of_many_controllers_runs_each_cell_once(store):
    """Two controllers started with --gpubench-rerun after the cell ended: the first restarts
    and claims it; the second never restarts it while it runs, and once it ended again (after
    the second started) reports it claimed rather than running it a third time."""
    add(store)
    store.claim_cell(ROW, "old:1")
    store.finish_cell(ROW, status="success")
    started = _iso_now()
    first, second = (claims(store, holder, rerun=True, ended_before=started) for holder in ("box-a:1", "box-b:2"))
    try:
        assert first.admit(ROW, lambda: add(store)).verdict is Verdict.RUN
        assert second.admit(ROW, lambda: add(store)).verdict is Verdict.DEFER  # running: never restarted
        assert not store.restart_cell(ROW, ended_before=started)
        assert store.cell(ROW).worker == "box-a:1"
        assert store.finish_cell(ROW, status="success", if_held_by="box-a:1")
        assert second.admit(ROW, lambda: add(store)).verdict is Verdict.CLAIMED  # ended since it started
        assert store.cell(ROW).worker == "box-a:1"
    finally:
        first.close(), second.close()


def test_concurrent_reruns_claim_each_cell_once(store_location, tmp_path):
    """Controllers racing to rerun the same ended cell, each with its own connection: exactly
    one runs it, whatever the interleaving of their peeks, restarts and claims."""
    import threading

    with open_store(store_location) as setup:
        setup.start_run("r1", [], [])
        add(setup)
        setup.claim_cell(ROW, "old:1")
        setup.finish_cell(ROW, status="success")
    started = _iso_now()
    gate, verdicts = threading.Barrier(4), []

    def controller(n):
        with open_store(store_location) as own:
            mine = ProcessClaims(lambda: own, "r1", f"box-{n}:{n}", LEASE, rerun=True, ended_before=started)
            try:
                gate.wait(timeout=30)
                verdicts.append(mine.admit(ROW, lambda: add(own)).verdict)
            finally:
                mine.close()

    threads = [threading.Thread(target=controller, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(v.value for v in verdicts).count("run") == 1, verdicts
    assert all(v in (Verdict.RUN, Verdict.DEFER) for v in verdicts)


def _iso_now():
    """Now, as a controller's start, strictly after anything recorded before (ms resolution)."""
    import time
    from datetime import datetime, timezone

    time.sleep(0.002)
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Uploading:
    """A result to store and an upload callback that runs ``during`` while the cell finishes."""

    def __init__(self, recorder, during):
        from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults

        recorder.result = BenchmarkResult(results=PerformanceResults())
        self.held_during = None
        self.during = during
        self.recorder = recorder
        recorder.upload = self

    def __call__(self, benchmark_id):
        self.held_during = list(self.recorder.heartbeat.held())
        self.during()


def test_the_heartbeat_holds_the_claim_through_the_upload_until_the_outcome_is_written(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    upload = Uploading(recorder, heartbeat.beat)  # a renewal during the upload: still ours
    properties = recorder.finish(CellOutcome("success"))
    assert upload.held_during == [ROW] and heartbeat.held() == []
    assert properties["gpubench_status"] == "success" and recorder.claim_lost is None
    row = store.cell(ROW)
    assert (row.status, row.lease_expires_at) == ("success", None)
    heartbeat.hold(ROW, recorder.lose_claim)
    heartbeat.beat()  # refused: the row is finished, by this very worker; not a lost claim
    assert recorder.claim_lost is None


def test_a_cell_taken_over_during_its_upload_writes_no_outcome_over_the_new_holder(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    Uploading(recorder, lambda: take_over(store))  # the upload outlasted the lease
    properties = recorder.finish(CellOutcome("success"))
    assert properties["gpubench_status"] == "failed" and "taken over by other:2" in recorder.claim_lost
    row = store.cell(ROW)
    assert (row.status, row.worker, row.error_message) == ("running", "other:2", None)
    assert heartbeat.held() == []
    assert "claim_lost" in recorder.progress.path.read_text()


def test_a_session_rented_after_the_claim_was_lost_is_not_recorded_and_stops_the_cell(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    recorder.enter(Stage.PROVISION)
    take_over(store)
    with pytest.raises(ClaimLost, match=r"taken over by other:2") as raised:
        recorder.session_created("s-1", "c-1", "o-1", 1.0)
    assert raised.value.stage is Stage.PROVISION
    assert store.cell(ROW).session_id is None  # the attempt that rented it releases it (provisioning)
    from pytest_gpubench.run.provisioning import can_fail_over

    assert not can_fail_over(raised.value)  # and tries no other offer


class RenewalFails:
    """The store as a git store is with an unreachable remote: a renewal raises StoreProblem."""

    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def renew_cell_lease(self, *args, **kwargs):
        raise StoreProblem("git push: could not reach the remote")


def test_a_store_problem_in_the_finish_renewal_keeps_the_result(store, tmp_path, heartbeat):
    recorder = start(store, tmp_path, "me:1", lease_seconds=LEASE, heartbeat=heartbeat)
    recorder.store = RenewalFails(store)
    Uploading(recorder, lambda: None)
    properties = recorder.finish(CellOutcome("success"))
    assert properties["gpubench_status"] == "success"
    assert store.cell(ROW).status == "success" and len(store.results("r1")) == 1


def test_only_the_last_controller_of_a_shared_run_records_its_end_with_every_controller_s_outcome(store):
    """A controller ends while another still runs a cell under a live lease: the run's end is
    not its to record. The last one records it, failed if any controller's cell failed."""
    import time

    from pytest_gpubench.run.cleanup import others_running, shared_run_status

    add(store)
    other = store.add_cell("r1", "other-cell", gpu_type="g", provider="p", model="m", matrix_file="f")
    store.claim_cell(ROW, "box-a:1:aa", lease_seconds=60)
    store.finish_cell(ROW, status="failed", if_held_by="box-a:1:aa")
    store.claim_cell(other, "box-b:2:bb/gw0", lease_seconds=60)
    assert others_running(store, "r1", "box-a:1:aa") == "box-b:2:bb/gw0"
    assert others_running(store, "r1", "box-b:2:bb") is None  # its own xdist worker's cell
    store.update_cell(other, lease_expires_at=time.time() - 1)
    assert others_running(store, "r1", "box-a:1:aa") is None  # a dead holder's lease keeps nothing going
    assert shared_run_status(store, "r1", "passed") == "failed"  # box-a's cell failed, box-b passed
    assert shared_run_status(store, "r1", "interrupted") == "interrupted"
    store.finish_cell(ROW, status="success")
    store.finish_run("r1", "interrupted")
    assert shared_run_status(store, "r1", "passed") == "interrupted"  # an earlier, worse end stays
