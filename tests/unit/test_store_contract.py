"""The ``Store`` contract: every promise of pytest_gpubench.store.base.Store, held to each
implementation (parametrized, so the next store gets this suite for free).

SQLite runs on a real file, PostgreSQL on a real server (tests/postgres_server.py: a fresh
database per test; skipped where PostgreSQL is not installed, required in CI). A new
implementation adds itself to ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from result_helpers import make_result

from pytest_gpubench.cloud.processes import ProcessIdentity
from pytest_gpubench.errors import Stage, UnknownRun
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.store.base import Store
from pytest_gpubench.store.opening import LAST, SHOWN_RUNS, resolve_run
from pytest_gpubench.store.records import AttemptRecord, CellRecord, ResultRecord
from pytest_gpubench.store.schema import ATTEMPT_COLUMNS, BENCHMARK_COLUMNS, MANIFEST_COLUMNS, RUN_COLUMNS
from pytest_gpubench.store.sqlite_store import SqliteStore

RUN = "run-1"
CELL = "rtx4090-vastai-qwen2_7b"


def _sqlite(path: Path) -> Store:
    return SqliteStore.open(path / "reports" / "manifest.db")


def _git(path: Path) -> Store:
    """A bare repository under ``path`` (created by the first open), a clone per store and one local
    manifest: several stores on one machine, as the plugin's controller and xdist workers are."""
    from pytest_gpubench.store.git_store import GitStore

    return GitStore.open(f"git+file://{path}/results.git", manifest=path / "reports" / "manifest.db",
                         cache_dir=path / "git-cache")


def _postgresql(path: Path, request: pytest.FixtureRequest) -> Store:
    from pytest_gpubench.store.postgres_store import PostgresStore

    return PostgresStore.open(request.getfixturevalue("postgres_url"))


#: name -> opens a fresh store under a directory (a second call on the same one opens
#: the same store again, as a second process would).
IMPLEMENTATIONS: dict[str, Callable[[Path, pytest.FixtureRequest], Store]] = {
    "sqlite": lambda path, request: _sqlite(path), "git": lambda path, request: _git(path),
    "postgresql": _postgresql}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def opener(request, tmp_path) -> Callable[[], Store]:
    opened: list[Store] = []

    def open_store() -> Store:
        opened.append(IMPLEMENTATIONS[request.param](tmp_path, request))
        return opened[-1]

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(opener) -> Iterator[Store]:
    store = opener()
    store.start_run(RUN, ["pytest", "matrix/"], ["matrix/gpubench_seed.yaml"])
    yield store


def add(store: Store, cell: str = CELL, run: str = RUN) -> str:
    return store.add_cell(run, cell, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                          matrix_file="matrix/gpubench_seed.yaml")


def requests() -> list[RequestRecord]:
    return [RequestRecord(index=i, prompt_index=i % 2, started_at=1.0 + i, ttft_ms=40.0 + i, latency_ms=900.0,
                          output_tokens=100, tokens_per_second=70.0 + i, warmup=i == 0) for i in range(4)]


def test_it_is_a_store(store):
    assert isinstance(store, Store)
    assert store.location


def test_a_store_writes_only_the_methods_without_a_body_and_inherits_the_rest(store):
    """What ``bench/architecture.py`` counts is what each store defines itself: none leans on a
    bodiless protocol method (it would answer None), and the count stays small (issue 22)."""
    from import_graph import store_methods

    required = store_methods()
    assert 10 <= len(required) <= 20, required
    kind = type(store)
    assert Store in kind.__mro__  # it subclasses the protocol, so it inherits the shared rules
    for name in required:
        owner = next(klass for klass in kind.__mro__ if name in vars(klass))
        assert owner is not Store and not getattr(owner, "_is_protocol", False), f"{kind.__name__}.{name}"


# ---------------------------------------------------------------------- runs


def test_a_run_reads_back_and_finishes(store):
    run = store.run(RUN)
    assert run is not None and run.run_id == RUN and run.status == "running"
    assert run.argv == ["pytest", "matrix/"] and run.matrix_files == ["matrix/gpubench_seed.yaml"]
    assert run.started_at and run.finished_at is None
    store.finish_run(RUN, "passed")
    finished = store.run(RUN)
    assert finished.status == "passed" and finished.finished_at
    assert store.run("no-such-run") is None


def test_starting_a_run_twice_changes_nothing_and_a_new_owner_takes_it_over(store):
    me = ProcessIdentity(pid=101, host="here", start="boot:1")
    store.start_run("owned", ["pytest"], [], owner=me, api="http://api", sandbox=True)
    store.start_run("owned", ["pytest", "again"], [], owner=me)
    run = store.run("owned")
    assert run.owner == me and run.api == "http://api" and run.sandbox and run.argv == ["pytest"]
    assert run.resumed_at is None
    store.finish_run("owned", "failed")
    store.start_run("owned", ["pytest"], [], owner=me)  # its own process opening the store late: still ended
    ended = store.run("owned")
    assert (ended.status, ended.resumed_at) == ("failed", None) and ended.finished_at
    other = ProcessIdentity(pid=202, host="here", start="boot:2")
    store.start_run("owned", ["pytest"], [], owner=other)
    taken = store.run("owned")
    assert taken.owner == other and taken.status == "running" and taken.finished_at is None and taken.resumed_at


def test_run_ids_are_most_recent_first(store):
    store.start_run("run-2", [], [])
    store.start_run("run-3", [], [])
    assert store.run_ids() == ["run-3", "run-2", RUN]


def test_a_run_name_resolves_to_a_run_the_store_knows(store):
    store.start_run("run-2", [], [])
    assert resolve_run(store, LAST) == "run-2"
    assert resolve_run(store, RUN) == RUN
    with pytest.raises(UnknownRun, match=r"no run 'run-9' in the manifest .*most recent first: run-2, run-1$"):
        resolve_run(store, "run-9")
    for n in range(3, SHOWN_RUNS + 3):
        store.start_run(f"run-{n}", [], [])
    with pytest.raises(UnknownRun, match=r": run-12, run-11, .*, run-3 \(and 2 more\)$"):
        resolve_run(store, "run-0")


# --------------------------------------------------------------------- cells


def test_a_cell_is_added_pending_once(store):
    row_id = add(store)
    assert row_id == f"{RUN}/{CELL}"
    assert add(store) == row_id
    cells = store.cells(RUN)
    assert [c.row_id for c in cells] == [row_id]
    cell = store.cell(row_id)
    assert isinstance(cell, CellRecord)
    assert (cell.run_id, cell.cell_id, cell.status, cell.gpu_type, cell.provider, cell.model) == (
        RUN, CELL, "pending", "RTX 4090", "vastai", "qwen2:7b")
    assert store.cell(f"{RUN}/nope") is None


def test_cells_of_one_run_or_all_in_the_order_added(store):
    store.start_run("run-2", [], [])
    first, second, other = add(store, "b"), add(store, "a"), add(store, "c", run="run-2")
    assert [c.row_id for c in store.cells(RUN)] == [first, second]
    assert [c.row_id for c in store.cells()] == [first, second, other]


def test_statuses_move_as_documented(store):
    row_id = add(store)
    store.update_cell(row_id, status="running", worker="gw0")
    running = store.cell(row_id)
    assert running.status == "running" and running.started_at and running.worker == "gw0"
    store.update_cell(row_id, status="running")
    assert store.cell(row_id).started_at == running.started_at  # stamped once
    store.finish_cell(row_id, status="failed", failure_stage=Stage.BENCHMARK, failure_reason="timeout",
                      error_message="[benchmark] too slow")
    failed = store.cell(row_id)
    assert (failed.status, failed.failure_stage, failed.failure_reason) == ("failed", "benchmark", "timeout")
    assert failed.completed_at
    store.finish_cell(row_id, status="success")
    succeeded = store.cell(row_id)
    assert succeeded.status == "success" and succeeded.failure_stage is None and succeeded.error_message is None
    assert store.restart_cell(row_id) is True
    restarted = store.cell(row_id)
    assert restarted.status == "pending" and restarted.completed_at is None and restarted.worker is None
    assert store.restart_cell(row_id) is False


def test_bad_statuses_fields_and_rows_are_refused(store):
    row_id = add(store)
    with pytest.raises(ValueError):
        store.update_cell(row_id, status="exploded")
    with pytest.raises(ValueError):
        store.update_cell(row_id, no_such_field=1)
    with pytest.raises(ValueError):
        store.finish_cell(row_id, status="running")
    with pytest.raises(KeyError):
        store.update_cell(f"{RUN}/nope", status="running")
    with pytest.raises(ValueError):
        # Joined here so the repository holds no key-shaped line of its own.
        store.update_cell(row_id, notes="-----BEGIN " + "OPENSSH PRIVATE KEY-----")


def test_finishing_prices_the_session(store):
    row_id = add(store)
    store.record_session(row_id, session_id="s-1", consumer_id="gpubench-run-1-x", offer_id="o-1",
                         price_per_hour=3600.0)
    store.finish_cell(row_id, status="success")
    cell = store.cell(row_id)
    assert cell.session_id == "s-1" and cell.price_per_hour == 3600.0
    assert cell.cost_usd is not None and cell.cost_usd >= 0
    store.finish_cell(row_id, status="success", cost_usd=1.25)
    assert store.cell(row_id).cost_usd == 1.25


# --------------------------------------------------------------------- claims


def test_a_pending_cell_is_claimed_by_one_worker(store):
    row_id = add(store)
    first = store.claim_cell(row_id, "gw0")
    second = store.claim_cell(row_id, "gw1")
    assert first.won and first.holder == "gw0"
    assert not second.won and second.holder == "gw0"
    assert store.claim_cell(row_id, "gw0").won  # the holder again
    cell = store.cell(row_id)
    assert cell.status == "running" and cell.worker == "gw0" and cell.started_at


def race(opener, claim: Callable[[Store, str], object], stores: int = 4) -> list:
    """``claim(store, worker)`` from ``stores`` stores (as many processes would) at once; every answer."""
    others = [opener() for _ in range(stores)]
    start = threading.Barrier(len(others))
    answers = []

    def one(other: Store, worker: str) -> None:
        start.wait(timeout=30)
        answers.append(claim(other, worker))

    threads = [threading.Thread(target=one, args=(other, f"gw{i}")) for i, other in enumerate(others)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == len(others)
    return answers


def test_two_stores_racing_for_one_cell_one_wins(store, opener):
    row_id = add(store)
    claims = race(opener, lambda other, worker: other.claim_cell(row_id, worker))
    winners = [claim for claim in claims if claim.won]
    assert len(winners) == 1
    assert {claim.holder for claim in claims} == {winners[0].holder}
    assert store.cell(row_id).worker == winners[0].holder


def test_a_finished_cell_cannot_be_claimed(store):
    row_id = add(store)
    store.finish_cell(row_id, status="skipped")
    assert not store.claim_cell(row_id, "gw0").won
    with pytest.raises(KeyError):
        store.claim_cell(f"{RUN}/nope", "gw0")


def test_an_abandoned_cell_is_taken_over_by_one_claimant_and_runs_again(store, opener):
    """Cleanup found its holder's process gone and marked the cell failed as abandoned (issue 21
    item 15): the run never failed it, so one next claimant takes it over, as it would a cell
    whose lease ran out, and the row runs again without its recorded end."""
    row_id, own_failure = add(store), add(store, "failed-by-its-run")
    for row in (row_id, own_failure):
        assert store.claim_cell(row, "dead", lease_seconds=3600).won
    assert store.record_session(row_id, session_id="s-dead", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="dead")
    assert store.finish_cell(row_id, status="failed", failure_stage=Stage.BENCHMARK, failure_reason="abandoned",
                             error_message="its run's process went away before this cell finished",
                             if_held_by="dead")
    assert store.finish_cell(own_failure, status="failed", failure_stage=Stage.BENCHMARK,
                             failure_reason="interrupted", if_held_by="dead")
    assert not store.claim_cell(own_failure, "gw0", lease_seconds=60).won  # its run's own end stays

    claims = race(opener, lambda other, worker: other.claim_cell(row_id, worker, lease_seconds=60), stores=3)
    (winner,) = [claim for claim in claims if claim.won]
    assert winner.taken_over_from == "dead" and winner.lease_expires_at is not None
    assert all(claim.holder == winner.holder for claim in claims)
    cell = store.cell(row_id)
    assert (cell.status, cell.worker, cell.completed_at, cell.failure_stage, cell.failure_reason,
            cell.error_message) == ("running", winner.holder, None, None, None, None)
    assert not store.renew_cell_lease(row_id, "dead", 60)  # the dead holder's claim is gone
    assert store.finish_cell(row_id, status="success", if_held_by=winner.holder)
    assert not store.claim_cell(row_id, "gw9", lease_seconds=60).won  # ended for good now
    assert store.cell(row_id).status == "success"


# ------------------------------------------------------ leases and guarded writes
# The lease semantics of store/base.py, once for every store: a holder that lost its
# claim (taken over, finished, restarted) writes nothing over the row any more.

T0 = 1_000_000.0


def test_an_expired_lease_is_taken_over_and_the_old_holder_can_no_longer_renew(store):
    row_id = add(store)
    assert store.claim_cell(row_id, "gw0", lease_seconds=60, now=T0).won
    held = store.claim_cell(row_id, "gw1", lease_seconds=60, now=T0 + 30)
    assert not held.won and held.holder == "gw0" and held.lease_expires_at == T0 + 60
    assert store.renew_cell_lease(row_id, "gw0", 60, now=T0 + 40)  # holds on to T0 + 100
    assert not store.claim_cell(row_id, "gw1", lease_seconds=60, now=T0 + 90).won
    taken = store.claim_cell(row_id, "gw1", lease_seconds=60, now=T0 + 101)
    assert taken.won and taken.holder == "gw1" and taken.taken_over_from == "gw0"
    assert taken.lease_expires_at == T0 + 161
    assert not store.renew_cell_lease(row_id, "gw0", 60, now=T0 + 102)
    assert store.renew_cell_lease(row_id, "gw1", 60, now=T0 + 102)
    cell = store.cell(row_id)
    assert (cell.status, cell.worker) == ("running", "gw1")


def test_guarded_writes_apply_for_the_holder_only(store):
    row_id = add(store)
    assert store.claim_cell(row_id, "gw0", lease_seconds=60).won
    assert store.update_cell(row_id, if_held_by="gw1", progress_file="/tmp/theirs") is False
    assert store.update_cell(row_id, if_held_by="gw0", progress_file="/tmp/mine") is True
    assert store.record_session(row_id, session_id="s-theirs", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="gw1") is False
    assert store.record_session(row_id, session_id="s-mine", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="gw0") is True
    assert store.finish_cell(row_id, status="failed", failure_reason="interrupted", if_held_by="gw1") is False
    cell = store.cell(row_id)
    assert (cell.status, cell.worker, cell.progress_file, cell.session_id) == (
        "running", "gw0", "/tmp/mine", "s-mine")
    assert store.finish_cell(row_id, status="success", if_held_by="gw0") is True
    finished = store.cell(row_id)
    assert finished.status == "success" and finished.completed_at and finished.failure_reason is None
    # Finished: not running under anyone, so no guarded write applies any more; unguarded ones do.
    assert store.update_cell(row_id, if_held_by="gw0", notes="late") is False
    assert store.finish_cell(row_id, status="failed", if_held_by="gw0") is False
    assert store.cell(row_id).status == "success"
    assert store.update_cell(row_id, notes="by hand") is True
    assert store.finish_cell(row_id, status="skipped") is True
    assert store.cell(row_id).status == "skipped"


def test_a_holder_that_was_taken_over_writes_nothing_over_the_new_holder(store):
    row_id = add(store)
    assert store.claim_cell(row_id, "gw0", lease_seconds=60, now=T0).won
    assert store.record_session(row_id, session_id="s-0", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="gw0")
    assert store.claim_cell(row_id, "gw1", lease_seconds=60, now=T0 + 61).won
    assert store.record_session(row_id, session_id="s-1", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="gw1")
    assert store.record_session(row_id, session_id="s-late", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="gw0") is False
    assert store.finish_cell(row_id, status="success", if_held_by="gw0") is False
    cell = store.cell(row_id)
    assert (cell.status, cell.worker) == ("running", "gw1")
    assert store.finish_cell(row_id, status="partial", if_held_by="gw1") is True
    assert store.cell(row_id).status == "partial"


def test_restart_never_touches_a_running_cell(store):
    row_id = add(store)
    assert store.restart_cell(row_id) is False  # pending
    assert store.claim_cell(row_id, "gw0", lease_seconds=60, now=T0).won
    assert store.restart_cell(row_id) is False  # running, live lease
    assert store.restart_cell(row_id, ended_before="2999-01-01T00:00:00+00:00") is False
    cell = store.cell(row_id)
    assert (cell.status, cell.worker) == ("running", "gw0")
    # Even with its lease long expired: a dead holder is the claims' business (a takeover), not a restart's.
    assert store.restart_cell(row_id) is False
    assert store.renew_cell_lease(row_id, "gw0", 60)
    assert store.finish_cell(row_id, status="failed", if_held_by="gw0")
    assert store.restart_cell(row_id) is True
    assert store.cell(row_id).status == "pending"


def test_restart_with_ended_before_restarts_only_what_ended_earlier(store):
    row_id = add(store)
    assert store.claim_cell(row_id, "gw0").won
    assert store.finish_cell(row_id, status="success", if_held_by="gw0")
    ended = store.cell(row_id).completed_at
    assert store.restart_cell(row_id, ended_before="2000-01-01T00:00:00+00:00") is False  # ended since then
    assert store.restart_cell(row_id, ended_before=ended) is False  # ended at that very moment: not before
    assert store.cell(row_id).status == "success"
    assert store.restart_cell(row_id, ended_before="2999-01-01T00:00:00+00:00") is True
    restarted = store.cell(row_id)
    assert restarted.status == "pending" and restarted.completed_at is None and restarted.worker is None


def test_of_many_controllers_rerunning_one_cell_one_restarts_it(store, opener):
    """The rerun race (review 13, finding 1): each controller restarts what ended before it
    started and then claims; the cell runs once, not once per controller."""
    row_id = add(store)
    assert store.claim_cell(row_id, "gw-first").won
    assert store.finish_cell(row_id, status="success", if_held_by="gw-first")
    started = "2999-01-01T00:00:00+00:00"  # every controller started after the cell ended

    def rerun(other: Store, worker: str) -> tuple[bool, bool]:
        restarted = other.restart_cell(row_id, ended_before=started)
        return restarted, other.claim_cell(row_id, worker, lease_seconds=60).won

    answers = race(opener, rerun, stores=3)
    assert sum(won for _, won in answers) == 1
    cell = store.cell(row_id)
    assert cell.status == "running" and cell.worker in {"gw0", "gw1", "gw2"}


# ---------------------------------------------------- attempts and sessions


def test_attempts_read_back_end_once_and_admission_sees_the_run(store):
    row_id = add(store)
    other = add(store, "other-cell")
    assert store.start_attempt(other, 1, offer_id="o-0", price_per_hour=1.0, expected_seconds=60.0) is None
    seen: list[list[AttemptRecord]] = []

    def admit(attempts: list[AttemptRecord]) -> str | None:
        seen.append(attempts)
        return None

    assert store.start_attempt(row_id, 1, admit=admit, offer_id="o-1", price_per_hour=0.5) is None
    assert [a.row_id for a in seen[0]] == [other]
    assert store.start_attempt(row_id, 2, admit=lambda attempts: "budget used up", offer_id="o-2") == "budget used up"
    store.update_attempt(row_id, 1, session_id="s-1")
    store.end_attempt(row_id, 1, session_status="stopped")
    attempts = store.attempts(row_id=row_id)
    assert len(attempts) == 1  # the refused attempt wrote nothing
    ended = attempts[0]
    assert (ended.attempt, ended.offer_id, ended.session_id, ended.session_status) == (1, "o-1", "s-1", "stopped")
    assert ended.session_started_at and ended.ended_at and ended.cost_usd is not None
    store.end_attempt(row_id, 1, session_status="failed")
    assert store.attempts(row_id=row_id)[0].ended_at == ended.ended_at  # the first end stays
    assert store.cell(row_id).attempts == 1
    assert {a.row_id for a in store.attempts(RUN)} == {row_id, other}
    with pytest.raises(KeyError):
        store.end_attempt(row_id, 9)


def test_a_recorded_session_is_owned_until_its_release(store):
    row_id = add(store)
    store.start_attempt(row_id, 1, offer_id="o-1", price_per_hour=0.5)
    store.update_attempt(row_id, 1, session_id="s-old", consumer_id="gpubench-run-1-x-a1")
    store.start_attempt(row_id, 2, offer_id="o-2", price_per_hour=0.5)
    store.record_session(row_id, session_id="s-1", consumer_id="gpubench-run-1-x-a2", offer_id="o-2",
                         price_per_hour=0.5, worker="gw0")
    owned = {found.session_id: found for found in store.unreleased_sessions(RUN)}
    assert set(owned) == {"s-old", "s-1"}
    assert owned["s-1"].row_id == row_id and owned["s-1"].worker == "gw0" and owned["s-1"].cell_id == CELL
    assert owned["s-old"].attempt == 1
    store.record_release(row_id, "s-old", session_status="stopped", released_by="cleanup", attempt=1)
    assert [found.session_id for found in store.unreleased_sessions()] == ["s-1"]
    store.record_release(row_id, "s-1", session_status="stopped", released_by="cleanup")
    assert store.unreleased_sessions(RUN) == []
    cell = store.cell(row_id)
    assert cell.released_by == "cleanup" and cell.session_released_at and cell.session_status == "stopped"


def test_a_shared_session_ends_for_every_cell_on_it(store):
    rows = [add(store, name) for name in ("a", "b")]
    for row_id in rows:
        store.record_session(row_id, session_id="shared", consumer_id="gpubench-run-1-a", offer_id="o",
                             price_per_hour=1.0)
    assert store.end_shared_session("shared", session_status="stopped", released_by="pool") == 2
    assert store.end_shared_session("shared", session_status="stopped", released_by="pool") == 0
    assert store.unreleased_sessions() == []


# -------------------------------------------------- results and requests


def test_a_result_written_reads_back_equal(store):
    row_id = add(store)
    result = make_result(72.5)
    result_id = store.add_result(row_id, result, requests())
    stored = store.result(result_id)
    assert isinstance(stored, ResultRecord)
    assert stored.result == result.model_copy(update={"id": result_id}).model_dump(mode="json")
    assert stored.figures == result.results
    assert (stored.row_id, stored.run_id, stored.gpu_type, stored.provider, stored.model) == (
        row_id, RUN, "RTX 4090", "vastai", "qwen2:7b")
    assert stored.decode_tokens_per_second == 72.5
    assert stored.output_tokens_per_second == pytest.approx(4000 / 60.0)
    assert stored.cost_per_million_tokens == pytest.approx(result.cost_analysis().cost_per_million_tokens)
    assert store.requests(result_id) == requests()
    cell = store.cell(row_id)
    assert cell.benchmark_id == result_id and cell.decode_tokens_per_second == 72.5
    assert [r.id for r in store.results(RUN)] == [result_id] and store.results("other-run") == []
    assert store.result("nope") is None


def test_a_result_written_again_replaces_it_and_keeps_its_upload(store):
    row_id = add(store)
    result_id = store.add_result(row_id, make_result(70.0), requests())
    store.mark_upload(result_id, status="uploaded", remote_id="remote-7")
    store.add_result(row_id, make_result(80.0).model_copy(update={"id": result_id}), requests()[:2])
    stored = store.result(result_id)
    assert stored.decode_tokens_per_second == 80.0 and len(store.requests(result_id)) == 2
    assert (stored.upload_status, stored.remote_id) == ("uploaded", "remote-7")
    assert store.known_result("remote-7").id == result_id and store.known_result(result_id).id == result_id
    assert store.known_result("unknown") is None


def test_an_unpriced_result_has_no_cost_per_token(store):
    result_id = store.add_result(add(store), make_result(70.0), unpriced=True)
    assert store.result(result_id).cost_per_million_tokens is None


def test_details_repeats_and_samples_are_kept_with_a_result(store):
    row_id = add(store)
    result_id = store.add_result(row_id, make_result(70.0))
    store.set_result_details(result_id, {"fingerprint": {"hash": "abc", "fields": {}}, "metrics": {"x": 1}})
    stored = store.result(result_id)
    assert stored.details["metrics"] == {"x": 1} and stored.workload_fingerprint == "abc"
    runs = [{"decode_tokens_per_second": 70.0 + i, "output_tokens_per_second": 60.0, "ttft_p50_ms": 40.0,
             "requests": 10, "duration_seconds": 30.0, "outlier": i == 2} for i in range(3)]
    assert store.add_repeats(result_id, runs) == 3
    samples = [{"t": 1.0 + i, "gpu": 0, "utilization_pct": 90.0, "memory_used_mib": 5000,
                "temperature_c": 70.0, "power_draw_w": 300.0} for i in range(2)]
    assert store.add_gpu_samples(row_id, result_id, samples) == 2
    with pytest.raises(KeyError):
        store.add_repeats("nope", runs)
    with pytest.raises(KeyError):
        store.set_result_details("nope", {})


def test_microbench_figures_read_back_per_run_and_replace_the_cells_earlier_ones(store):
    from pytest_gpubench.measure.microbench import figures_from_events

    row_id = store.add_cell(RUN, "RTX_4090-vastai-microbench", gpu_type="RTX 4090", provider="vastai",
                            model="microbench", matrix_file="matrix/gpubench_seed.yaml")
    run = figures_from_events([
        {"event": "device", "name": "NVIDIA GeForce RTX 4090", "capability": [8, 9], "torch": "2.5.1"},
        {"event": "figure", "kind": "memory_bandwidth", "precision": None, "unit": "GB/s", "values": [900.0, 910.0]},
        {"event": "skipped", "kind": "matmul", "precision": "fp8", "reason": "needs 8.9"},
    ])
    assert store.add_microbench(row_id, run) == 2
    memory, fp8 = store.microbench(RUN)
    assert (memory.row_id, memory.label, memory.unit, memory.values, memory.n) == (
        row_id, "memory_bandwidth", "GB/s", (900.0, 910.0), 2)
    assert memory.value == pytest.approx(905.0) and memory.ci_low <= 905.0 <= memory.ci_high
    assert (memory.gpu_type, memory.provider, memory.device, memory.capability) == (
        "RTX 4090", "vastai", "NVIDIA GeForce RTX 4090", "8.9")
    assert (fp8.label, fp8.precision, fp8.value, fp8.skipped, fp8.values) == (
        "matmul_fp8", "fp8", None, "needs 8.9", ())
    assert store.add_microbench(row_id, run.model_copy(update={"figures": run.figures[:1]})) == 1
    assert [f.label for f in store.microbench()] == ["memory_bandwidth"]
    assert store.microbench("another-run") == []
    with pytest.raises(KeyError):
        store.add_microbench("nope", run)


def test_uploads_are_asked_for_once_and_tracked(store):
    row_id = add(store)
    first, second = (store.add_result(row_id, make_result(tps)) for tps in (70.0, 71.0))
    assert store.pending_uploads() == []
    assert store.request_uploads(RUN) == 2
    assert store.request_uploads(RUN) == 0
    assert [r.id for r in store.pending_uploads(RUN)] == [first, second]
    store.mark_upload(first, status="uploaded", remote_id="r-1")
    store.mark_upload(second, status="failed", error="HTTP 500")
    pending = store.pending_uploads()
    assert [(r.id, r.upload_status, r.upload_error) for r in pending] == [(second, "failed", "HTTP 500")]
    assert store.result(first).uploaded_at
    with pytest.raises(ValueError):
        store.mark_upload(first, status="lost")
    with pytest.raises(KeyError):
        store.mark_upload("nope", status="pending")


# ---------------------------------------------------------------- baselines


def _finished(store: Store, run: str, status: str, tps: float | None) -> str:
    store.start_run(run, [], [])
    row_id = add(store, run=run)
    if tps is not None:
        store.add_result(row_id, make_result(tps))
    store.finish_cell(row_id, status=status)
    return row_id


def test_a_baseline_is_the_latest_comparable_success(store):
    assert store.baseline(CELL) is None
    _finished(store, "old", "success", 60.0)
    _finished(store, "partial", "partial", 65.0)
    _finished(store, "failed", "failed", 10.0)
    _finished(store, "no-figures", "success", None)
    current = _finished(store, "current", "success", 70.0)
    baseline = store.baseline(CELL, exclude_run="current")
    assert baseline is not None and baseline.run_id == "partial"
    assert baseline.cell.status == "partial" and baseline.result.decode_tokens_per_second == 65.0
    assert store.baseline(CELL, "old").result.decode_tokens_per_second == 60.0
    assert store.baseline(CELL).cell.row_id == current  # nothing excluded: the latest
    assert store.baseline(CELL, "failed") is None
    assert store.baseline("other-cell") is None


# ------------------------------------------------ the SQLite store's mapping


def test_sqlite_every_column_reaches_a_record():
    """Each manifest column is a field of its record (renamed where the record says so)."""
    renamed = {"id": "row_id", "manifest_id": "row_id", "pid": "owner", "pid_start": "owner",
               "result_json": "result", "details_json": "details"}
    from pytest_gpubench.measure.results import PerformanceResults
    from pytest_gpubench.store.records import RunRecord

    def fields(columns, record, extra=()):
        return {renamed.get(name, name) for name in columns} - set(extra) - set(record.model_fields)

    assert fields(RUN_COLUMNS, RunRecord) == set()
    assert fields(MANIFEST_COLUMNS, CellRecord) == set()
    assert fields(ATTEMPT_COLUMNS, AttemptRecord) == set()
    assert fields(BENCHMARK_COLUMNS, ResultRecord, PerformanceResults.model_fields) == set()


def test_a_baseline_s_figures_compare_and_carry_its_fingerprint(store):
    from pytest_gpubench.measure.compare import compare, figures_of
    from pytest_gpubench.measure.compare import fingerprint, incomparable, stored_fingerprint

    row_id = _finished(store, "old", "success", 60.0)
    result_id = store.cell(row_id).benchmark_id
    stored = fingerprint(prompts=["hi"], max_tokens=64, concurrency=1, rate=None, think=None,
                         warmup_requests=0, runtime="ollama", runtime_version="0.5.7")
    store.set_result_details(result_id, {"fingerprint": stored.model_dump(mode="json")})
    figures = store.baseline(CELL, exclude_run="now").figures()
    assert figures["run_id"] == "old" and stored_fingerprint(figures) == stored
    assert incomparable(stored, figures) is None
    comparison = compare(figures_of(make_result(30.0), "now"), figures)
    baseline = {change.metric: change.baseline for change in comparison.changes}
    assert comparison.baseline_run == "old"
    assert baseline["ttft"] == 40.0 and baseline["error_rate"] == 0.05
    assert baseline["cost"] == pytest.approx(store.result(result_id).cost_per_million_tokens)


def test_sqlite_a_baseline_s_figures_compare_as_the_manifest_s_row_did(tmp_path):
    """The typed baseline changes no comparison: the same figures as the raw row, also
    where an older manifest left a figure NULL (the fallback column applies)."""
    from pytest_gpubench.measure.compare import compare, figures_of

    with SqliteStore.open(tmp_path / "m.db") as store:
        _finished(store, "old", "success", 60.0)
        store.manifest.db.execute("UPDATE benchmarks SET p50_tokens_per_second = NULL")
        store.manifest.db.conn.commit()
        current = figures_of(make_result(30.0), "now")
        raw = compare(current, store.manifest.baseline(CELL, exclude_run="now"))
        typed = compare(current, store.baseline(CELL, exclude_run="now").figures())
        assert typed == raw
        assert {c.metric: c.baseline for c in typed.changes}["tps"] == 60.0  # the fallback: decode tok/s


# ------------------------------------------------------------------ systems


def _system(source: str = "nvml", cores: int = 32):
    from pytest_gpubench.remote.sysinfo import GpuDevice, HostFacts, SystemInfo

    gpu = GpuDevice(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-a", memory_total_mib=24564,
                    compute_capability="8.9", sm_clock_max_mhz=2520, mem_clock_max_mhz=10501, power_limit_w=450.0)
    return SystemInfo(source=source, driver_version="550.54.15", cuda_version="12.4", gpus=(gpu,),
                      machine_gpu_count=2, host=HostFacts(cpu_model="EPYC", cpu_cores=cores, ram_mib=65536,
                                                          os="Ubuntu 22.04.4 LTS", kernel="6.8.0",
                                                          disk_total_bytes=50 << 30, disk_free_bytes=30 << 30))


def test_a_system_reads_back_equal_once_per_session(store):
    first, second = add(store), add(store, "rtx4090-vastai-llama3_8b")
    store.record_system(first, "sess-1", _system())
    # A reused session detected again (a second cell): still one record, the later one.
    store.record_system(second, "sess-1", _system(cores=64))
    store.record_system(first, "sess-2", _system("nvidia-smi-csv"))
    (one, two) = store.systems(RUN)
    assert (one.session_id, one.row_id, one.gpu_type, one.provider) == ("sess-1", second, "RTX 4090", "vastai")
    assert one.system == _system(cores=64) and one.recorded_at
    assert (two.session_id, two.system.source) == ("sess-2", "nvidia-smi-csv")


def test_systems_of_one_run_or_all_and_unknown_cells(store):
    store.start_run("run-2", ["pytest"], [])
    store.record_system(add(store), "sess-1", _system())
    store.record_system(add(store, run="run-2"), "sess-1", _system("nvidia-smi-xml"))
    assert [r.run_id for r in store.systems("run-2")] == ["run-2"]
    assert {r.run_id for r in store.systems()} == {RUN, "run-2"}
    assert store.systems("no-such-run") == []
    with pytest.raises(KeyError):
        store.record_system(f"{RUN}/no-such-cell", "sess-9", _system())


def test_sqlite_a_manifest_from_before_systems_gains_the_table(tmp_path):
    import sqlite_utils

    path = tmp_path / "manifest.db"
    with SqliteStore.open(path) as store:
        store.start_run(RUN, [], [])
        row = add(store)
    sqlite_utils.Database(path)["systems"].drop()
    with SqliteStore.open(path) as store:
        store.record_system(row, "sess-1", _system())
        assert [r.session_id for r in store.systems()] == ["sess-1"]


def test_sqlite_the_manifest_itself_keeps_systems_as_it_keeps_microbench_figures(tmp_path):
    from pytest_gpubench.store.manifest import Manifest

    with Manifest(tmp_path / "manifest.db") as manifest:
        store = SqliteStore(manifest)
        store.start_run(RUN, [], [])
        row = add(store)
        manifest.record_system(row, "sess-1", _system())
        (stored,) = manifest.system_rows(RUN)
        assert (stored["session_id"], stored["manifest_id"]) == ("sess-1", row)
        assert [r.system for r in store.systems(RUN)] == [_system()]


# ----------------------------------------------------------------- GPU leases


def test_a_gpu_lease_takes_the_lowest_free_gpus_and_none_is_held_twice(store):
    first = store.claim_gpus("lab1", [0, 1, 2], 2, holder="run-1/gw0", ttl=60, run_id=RUN, now=1000.0)
    assert first is not None and first.gpu_indices == (0, 1) and first.machine == "lab1"
    assert first.acquired_at == 1000.0 and first.expires_at == 1060.0 and first.run_id == RUN
    assert store.claim_gpus("lab1", [0, 1, 2], 2, holder="run-1/gw1", ttl=60, now=1001.0) is None
    second = store.claim_gpus("lab1", [0, 1, 2], 1, holder="run-1/gw1", ttl=60, now=1001.0)
    assert second is not None and second.gpu_indices == (2,)
    # Another machine's GPU 0 is another GPU.
    assert store.claim_gpus("lab2", [0], 1, holder="run-1/gw1", ttl=60, now=1001.0).gpu_indices == (0,)
    held = store.gpu_leases("lab1", active_at=1002.0)
    assert [lease.lease_id for lease in held] == [first.lease_id, second.lease_id]
    with pytest.raises(ValueError):
        store.claim_gpus("lab1", [0], 0, holder="x", ttl=60)


def test_a_released_gpu_lease_frees_its_gpus_and_cannot_be_renewed(store):
    lease = store.claim_gpus("lab1", [0], 1, holder="a", ttl=60, now=1000.0)
    store.release_gpu_lease(lease.lease_id, now=1010.0)
    store.release_gpu_lease(lease.lease_id, now=1020.0)  # idempotent: the first release is its end
    (ended,) = store.gpu_leases("lab1")
    assert ended.released_at == 1010.0 and not ended.active(1011.0)
    assert not store.renew_gpu_lease(lease.lease_id, 60, now=1011.0)
    assert store.claim_gpus("lab1", [0], 1, holder="b", ttl=60, now=1011.0) is not None


def test_a_gpu_lease_expires_unless_renewed(store):
    lease = store.claim_gpus("lab1", [0], 1, holder="a", ttl=30, now=1000.0)
    assert store.renew_gpu_lease(lease.lease_id, 30, now=1020.0)  # the heartbeat: held until 1050
    assert store.claim_gpus("lab1", [0], 1, holder="b", ttl=30, now=1040.0) is None
    # Not renewed again: a dead run's lease ends by itself.
    taken = store.claim_gpus("lab1", [0], 1, holder="b", ttl=30, now=1051.0)
    assert taken is not None and taken.gpu_indices == (0,)
    assert not store.renew_gpu_lease(lease.lease_id, 30, now=1052.0)  # expired: its GPU is another's now
    store.release_gpu_lease(lease.lease_id, now=1060.0)
    old = next(found for found in store.gpu_leases("lab1") if found.lease_id == lease.lease_id)
    # It stopped holding at its expiry, not at the late release.
    assert old.expires_at == 1050.0 and old.released_at in (None, 1050.0)


def test_stores_racing_for_one_gpu_one_wins(store, opener):
    leases = race(opener, lambda other, worker: other.claim_gpus("lab1", [0], 1, holder=worker, ttl=60))
    won = [lease for lease in leases if lease is not None]
    assert len(won) == 1
    assert [lease.holder for lease in store.gpu_leases("lab1")] == [won[0].holder]
