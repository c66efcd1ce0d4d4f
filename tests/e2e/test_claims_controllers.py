"""Controllers sharing one run id on one store (plugin/claims.py):
a cell another controller ran is reported ``claimed`` (exit 0, nothing written), runs again
only with ``--gpubench-rerun``; a cell another live controller holds is put aside, the other
cells run first, and it is taken over once its lease runs out, each item reported once."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET

import pytest

from e2e_helpers import run_pytest
from pytest_gpubench.plugin.claims import ENDED
from pytest_gpubench.run.record import progress_path
from pytest_gpubench.store.opening import open_store
from pytest_gpubench.store.record_keys import row_id

MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0}
matrix:
  - gpu: RTX 4090
    provider: vastai
    models: [qwen2:7b, qwen2:1.5b]
"""
CELLS = ("RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:1.5b")
RUN = "shared"


@pytest.fixture
def store_location(shared_store):
    """The store the controllers share; each test names the kinds it runs on (``store_kind``):
    every scenario runs on one kind, SQLite and PostgreSQL taking turns, to keep the tier quick
    (the stores' own claim semantics are the contract suite's, on every kind)."""
    return shared_store


def controller(tmp_path, store_location, name, *args):
    """One controller process over the matrix on the shared store and run id; its JUnit testcases."""
    matrix = tmp_path / "gpubench_claims.yaml"
    matrix.write_text(MATRIX)
    junit = tmp_path / f"{name}.xml"
    # The sandbox's clock at 0.01 (as the in-process sandbox's default), not the flag's 0.02: these
    # tests time nothing, and eight controller runs each wait out a provisioning and an install.
    done = run_pytest(tmp_path, str(matrix), "--gpubench-sandbox", "--gpubench-time-scale", "0.01",
                      "--gpubench-store", store_location,
                      "--gpubench-run-id", RUN, "--junitxml", str(junit), *args, timeout=300)
    cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else []
    return done, {case.get("name"): case for case in cases}


#: The lease of the stand-in holder that dies (stops renewing) once the other cells ended.
LIVE_LEASE = 3.0


def hold_until_the_others_end(store_location, held, stop):
    """A live holder of ``held``: renews its lease until every other cell of the run ended
    (the controller put the cell aside and ran the others), then dies silently."""
    with open_store(store_location) as store:
        while not stop.wait(LIVE_LEASE / 3):
            others = [c for c in store.cells(RUN) if c.row_id != held]
            if len(others) == len(CELLS) - 1 and all(c.status in ENDED for c in others):
                return
            store.renew_cell_lease(held, "gone-host:4242", LIVE_LEASE)


def rows(store_location):
    with open_store(store_location) as store:
        return {cell.cell_id: cell for cell in store.cells(RUN)}, store.results(RUN), store.attempts(RUN)


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_second_controller_reports_every_cell_claimed_and_writes_nothing_unless_rerun(tmp_path, store_location):
    first, _ = controller(tmp_path, store_location, "first")
    assert first.returncode == 0, first.stdout[-3000:]
    before, results, attempts = rows(store_location)
    assert {c.status for c in before.values()} == {"success"} and len(results) == 2
    holder = before[CELLS[0]].worker
    assert holder.count(":") == 2 and holder.split(":")[1].isdigit()  # host:pid:nonce

    second, cases = controller(tmp_path, store_location, "second")
    assert second.returncode == 0, second.stdout[-3000:]
    assert "2 claimed" in second.stdout and "passed" not in second.stdout.splitlines()[-1]
    assert f"claimed by {holder} (success)" in second.stdout  # the summary table says who
    after, results_after, attempts_after = rows(store_location)
    assert after == before and len(results_after) == 2 and len(attempts_after) == len(attempts)
    assert set(cases) == set(CELLS)
    for case in cases.values():
        skipped = case.find("skipped")
        assert skipped is not None and skipped.get("message").startswith(f"claimed elsewhere: {holder} since ")
        assert skipped.get("message").endswith(", success")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["gpubench_claimed_by"] == holder and props["gpubench_status"] == "claimed"

    third, cases = controller(tmp_path, store_location, "third", "--gpubench-rerun")
    assert third.returncode == 0, third.stdout[-3000:]
    assert "2 passed" in third.stdout
    rerun, results_rerun, _ = rows(store_location)
    assert {c.status for c in rerun.values()} == {"success"} and len(results_rerun) == 4
    assert {c.worker for c in rerun.values()} != {holder}
    assert all(case.find("skipped") is None for case in cases.values())


@pytest.mark.parametrize("store_kind", ["postgresql"])
def test_two_controllers_asked_to_rerun_at_once_run_each_cell_once_more(tmp_path, store_location):
    """A rerun means once per request, not once per controller: two controllers started together
    with --gpubench-rerun after a first run each run some cells and report the rest claimed."""
    from pytest_gpubench.store.progress import read_progress

    first, _ = controller(tmp_path, store_location, "first")
    assert first.returncode == 0, first.stdout[-3000:]
    done = {}
    both = [threading.Thread(target=lambda n=n: done.__setitem__(n, controller(tmp_path, store_location, n,
                                                                                "--gpubench-rerun")))
            for n in ("a", "b")]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join()
    for name, (run, _) in done.items():
        assert run.returncode == 0, (name, run.stdout[-3000:])
    cells, results, _ = rows(store_location)
    assert {c.status for c in cells.values()} == {"success"} and len(results) == 4  # 2 first + 2 rerun
    # Executions, not results (a run whose result was discarded counts): started twice each, not 3 times.
    for cell in CELLS:
        path = progress_path(tmp_path / "reports" / "progress", RUN, cell)
        assert sum(1 for line in read_progress(path) if line.label == "STARTING") == 2, path.read_text()
    ran = sum(int(run.stdout.rsplit(" passed", 1)[0].rsplit(" ", 1)[-1].strip("="))
              for run, _ in done.values() if " passed" in run.stdout)
    assert ran == len(CELLS)  # the other controller reported each of them claimed


@pytest.mark.parametrize(("store_kind", "spread"), [("postgresql", []),
                                                    pytest.param("sqlite", ["-n", "2"], marks=pytest.mark.slow)],
                         ids=["one-process-postgresql", "xdist-sqlite"])
def test_a_cell_held_elsewhere_is_put_aside_then_taken_over_when_its_lease_runs_out(tmp_path, store_location,
                                                                                   spread):
    """The first cell is held by a controller that stopped renewing: it runs last, taken over;
    every item is reported once (the terminal, JUnit), and the run's rows end once each."""
    with open_store(store_location) as store:
        store.start_run(RUN, [], [])
        held = store.add_cell(RUN, CELLS[0], gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                              matrix_file="gpubench_claims.yaml")
        assert held == row_id(RUN, CELLS[0])
        store.claim_cell(held, "gone-host:4242", lease_seconds=LIVE_LEASE)
    stop = threading.Event()
    renewer = threading.Thread(target=hold_until_the_others_end, args=(store_location, held, stop))
    renewer.start()
    try:
        done, cases = controller(tmp_path, store_location, "run", *spread)
    finally:
        stop.set()
        renewer.join()
    assert done.returncode == 0, done.stdout[-4000:]
    assert "2 passed" in done.stdout
    assert set(cases) == set(CELLS) and len(list(cases.values())) == 2
    assert all(case.find("skipped") is None and case.find("failure") is None for case in cases.values())
    cells, results, _ = rows(store_location)
    assert {c.status for c in cells.values()} == {"success"} and len(results) == 2
    assert cells[CELLS[0]].worker != "gone-host:4242"
    # Put aside: it started after the others had ended (they ran while it was held).
    assert all(cells[c].completed_at <= cells[CELLS[0]].started_at for c in CELLS[1:])
    log = progress_path(tmp_path / "reports" / "progress", RUN, CELLS[0]).read_text()
    assert "TAKEN_OVER" in log and "taken_from=gone-host:4242" in log

#: A store that refuses one cell's claim (a git claim that lost every push round, a
#: database blip), injected where the claim hooks call it.
FAILING_CLAIM = """
from pytest_gpubench.errors import StoreProblem
from pytest_gpubench.plugin import claims

_admit = claims.ProcessClaims.admit


def admit(self, row_id, add_row, now=None):
    if row_id.endswith("qwen2:7b"):
        raise StoreProblem("git claim: lost 60 push rounds")
    return _admit(self, row_id, add_row, now)


claims.ProcessClaims.admit = admit
"""


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_store_error_while_claiming_fails_that_cell_and_the_others_run(tmp_path, store_location):
    (tmp_path / "conftest.py").write_text(FAILING_CLAIM)
    done, cases = controller(tmp_path, store_location, "run")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "INTERNALERROR" not in done.stdout + done.stderr
    assert "1 passed, 1 error" in done.stdout, done.stdout[-3000:]  # failed in setup: never started
    failure = cases[CELLS[0]].find("error")
    assert failure is not None and "could not claim cell" in failure.get("message", "") + (failure.text or "")
    assert "lost 60 push rounds" in done.stdout
    cells, results, _ = rows(store_location)
    assert cells[CELLS[1]].status == "success" and len(results) == 1
    assert CELLS[0] not in cells or cells[CELLS[0]].status == "pending"  # nothing left running under it


@pytest.mark.parametrize("store_kind", ["postgresql"])
def test_a_controller_that_ends_while_another_runs_a_cell_leaves_the_run_s_end_to_it(tmp_path, store_location):
    """Only the last controller of a shared run records its end: cleanup treats a finished run's
    sessions as nobody's, so the first one to end must not mark it finished."""
    with open_store(store_location) as store:
        store.start_run(RUN, ["pytest"], [])
        other = store.add_cell(RUN, "A100_80GB-vastai-qwen2:7b", gpu_type="A100 80GB", provider="vastai",
                               model="qwen2:7b", matrix_file="elsewhere.yaml")
        assert store.claim_cell(other, "otherhost:777:abcd", lease_seconds=600).won
    done, _ = controller(tmp_path, store_location, "first")
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"run {RUN} goes on under otherhost:777:abcd: its end is theirs to record" in done.stdout
    with open_store(store_location) as store:
        run = store.run(RUN)
        assert run is not None and run.finished_at is None, run
        assert store.finish_cell(other, status="success", if_held_by="otherhost:777:abcd")


def test_the_claim_ttl_option_is_scaled_with_a_floor(tmp_path):
    from pytest_gpubench.settings import MIN_CLAIM_SECONDS, Settings

    assert Settings(claim_ttl=60, time_scale=1).claim_seconds == 60
    assert Settings(claim_ttl=60, time_scale=0.01).claim_seconds == MIN_CLAIM_SECONDS
