"""Three controllers, one matrix, one run on one shared store, one controller SIGKILLed mid-cell:
every cell ends exactly once (one result each) and was started once (its STARTING lines and
rented sessions: a second run whose result was thrown away counts too), except the killed
controller's cell, started once more by its taker; none is lost or left running, the killed
controller's cell is taken over by a survivor once its lease runs out (its session released
first), and no sandbox session is left running."""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter

import pytest

from e2e_helpers import PytestRun, active_sessions
from polling import wait_for
from pytest_gpubench.run.record import progress_path
from pytest_gpubench.store.opening import open_store

MATRIX = """
workload: {duration: 2s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
reuse: cell
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
  - {gpu: RTX 3090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
  - {gpu: RTX 5090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
  - {gpu: A100 80GB, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
"""
CELLS = 8
RUN = "shared"


def holding_a_session(store_location: str, holder: str):
    """A cell the controller ``holder`` (``host:pid``, its nonce unknown) runs on a session it
    rented (mid-cell), or None."""
    try:
        with open_store(store_location) as store:
            cells = store.cells(RUN)
    except Exception:  # noqa: BLE001 - the store may not exist yet
        return None
    return next((c for c in cells if c.status == "running" and c.session_id and of(c.worker, holder)), None)


def of(worker: str | None, process: str) -> bool:
    """Whether the claim holder ``worker`` (``host:pid:nonce``) is the process ``host:pid``."""
    return (worker or "").startswith(f"{process}:")


def starts(tmp_path, cell_id: str) -> int:
    """How many times a controller started the cell (its progress file's STARTING lines)."""
    from pytest_gpubench.store.progress import read_progress

    path = progress_path(tmp_path / "reports" / "progress", RUN, cell_id)
    return sum(1 for line in read_progress(path) if line.kind == "STATUS" and line.label == "STARTING")


@pytest.mark.slow
@pytest.mark.parametrize("store_kind", ["postgresql"])  # the case; SQLite's takeover: test_claims_controllers
def test_three_controllers_one_killed_mid_cell_every_cell_ends_once(tmp_path, standalone_sandbox, shared_store):
    store_location = shared_store
    matrix = tmp_path / "gpubench_many.yaml"
    matrix.write_text(MATRIX)
    runs = [PytestRun(tmp_path, standalone_sandbox, "--gpubench-store", store_location, "--gpubench-run-id", RUN,
                      "--gpubench-claim-ttl", "60s", name=f"c{n}", target=matrix) for n in range(3)]
    victim = runs[0]
    holder = f"{socket.gethostname()}:{victim.process.pid}"
    cell = wait_for(lambda: holding_a_session(store_location, holder), 120, "the first controller to be mid-cell")
    os.killpg(victim.process.pid, signal.SIGKILL)
    victim.process.wait(30)
    outputs = [run.finish(timeout=240) for run in runs[1:]]
    for run, output in zip(runs[1:], outputs, strict=True):
        assert run.process.returncode == 0, output[-4000:]

    with open_store(store_location) as store:
        cells = {c.row_id: c for c in store.cells(RUN)}
        results = store.results(RUN)
        attempts = store.attempts(RUN)
    assert len(cells) == CELLS
    assert {c.status for c in cells.values()} == {"success"}, [(c.cell_id, c.status) for c in cells.values()]
    assert Counter(r.row_id for r in results) == Counter(list(cells))  # exactly one result each: none lost, none twice
    # Executions, not results: a duplicate run whose result was discarded (a lost claim) shows here.
    expected = {row: 2 if row == cell.row_id else 1 for row in cells}  # the killed cell: the victim, then its taker
    assert Counter(a.row_id for a in attempts) == Counter(expected), [(a.row_id, a.worker) for a in attempts]
    assert {c.row_id: starts(tmp_path, c.cell_id) for c in cells.values()} == expected
    survivors = {f"{socket.gethostname()}:{run.process.pid}" for run in runs[1:]}
    assert all(any(of(c.worker, p) for p in survivors | {holder}) for c in cells.values())

    taken = cells[cell.row_id]
    assert any(of(taken.worker, p) for p in survivors)  # taken over once its lease ran out
    log = progress_path(tmp_path / "reports" / "progress", RUN, cell.cell_id).read_text()
    assert f"TAKEN_OVER taken_from={cell.worker}" in log and f"released_sessions={cell.session_id}" in log, log
    assert f"CLEANUP session_id={cell.session_id} status=stopped by=takeover" in log, log
    own = sorted((a for a in attempts if a.row_id == cell.row_id), key=lambda a: a.attempt)
    assert own[0].worker == cell.worker and own[0].session_id == cell.session_id and own[0].session_status == "stopped"
    assert own[-1].worker == taken.worker and own[-1].attempt > own[0].attempt  # numbering goes on
    assert len({a.consumer_id for a in attempts}) == len(attempts)

    # Each survivor ran some cells and reported the others' as claimed; every cell ran once in all.
    passed = sum(int(out.rsplit(" passed", 1)[0].rsplit(" ", 1)[-1].strip("=")) for out in outputs
                 if " passed" in out)
    assert passed == CELLS - sum(1 for c in cells.values() if of(c.worker, holder)), outputs[0][-2000:]
    assert active_sessions(standalone_sandbox) == []
