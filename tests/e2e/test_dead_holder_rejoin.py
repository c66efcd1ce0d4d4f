"""A controller that joins a shared run after another died mid-cell (docs/scale-out.md, "When a
controller dies"): its start-up cleanup releases the dead holder's session, and the cell is
then taken over and run by the joiner, not reported ``claimed`` as a failure nobody reruns.

The dead holder's lease is long (an hour, 72 s on the sandbox's clock): the joiner does not
wait for it to run out, because the start-up cleanup found the holder dead on this host.
"""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter
from datetime import datetime

import pytest

from e2e_helpers import PytestRun, active_sessions
from polling import wait_for
from pytest_gpubench.run.record import progress_path
from pytest_gpubench.store.opening import open_store
from pytest_gpubench.store.progress import read_progress

MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
reuse: cell
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
"""
RUN = "shared"


def holding_a_session(store_location: str, process: str):
    """The cell the controller ``process`` (``host:pid``) runs on a session it rented, or None."""
    try:
        with open_store(store_location) as store:
            cells = store.cells(RUN)
    except Exception:  # noqa: BLE001 - the store may not exist yet
        return None
    return next((c for c in cells if c.status == "running" and c.session_id
                 and (c.worker or "").startswith(f"{process}:")), None)


def starts(tmp_path, cell_id: str) -> int:
    """How many times a controller started the cell (its progress file's STARTING lines)."""
    path = progress_path(tmp_path / "reports" / "progress", RUN, cell_id)
    return sum(1 for line in read_progress(path) if line.kind == "STATUS" and line.label == "STARTING")


@pytest.mark.slow
# The case, on one store to keep the tier quick (each run takes 20-30 s here): the same
# start-up cleanup and takeover on SQLite, PostgreSQL and git are test_cleanup_claims.py's, and the
# stores' claim on an abandoned cell the contract suite's.
@pytest.mark.parametrize("store_kind", ["postgresql"])
def test_a_controller_joining_after_another_died_mid_cell_takes_the_cell_over_and_runs_it(
        tmp_path, standalone_sandbox, shared_store):
    matrix = tmp_path / "gpubench_rejoin.yaml"
    matrix.write_text(MATRIX)
    args = ("--gpubench-store", shared_store, "--gpubench-run-id", RUN, "--gpubench-claim-ttl", "1h")
    victim = PytestRun(tmp_path, standalone_sandbox, *args, name="victim", target=matrix)
    dead = f"{socket.gethostname()}:{victim.process.pid}"
    cell = wait_for(lambda: holding_a_session(shared_store, dead), 120, "the first controller to be mid-cell",
                    interval=0.3)
    os.killpg(victim.process.pid, signal.SIGKILL)
    victim.process.wait(30)

    joiner = PytestRun(tmp_path, standalone_sandbox, *args, name="joiner", target=matrix)
    output = joiner.finish(timeout=240)
    assert joiner.process.returncode == 0, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert "2 passed" in last and "claimed" not in last, output[-4000:]
    assert f"released session {cell.session_id}" in output, output[-4000:]
    assert f"cell {cell.row_id} marked failed (abandoned: its run's next controller takes it over)" in output

    with open_store(shared_store) as store:
        cells = {c.row_id: c for c in store.cells(RUN)}
        results = store.results(RUN)
        attempts = store.attempts(RUN)
    assert {c.status for c in cells.values()} == {"success"}, [(c.cell_id, c.status, c.error_message)
                                                               for c in cells.values()]
    taken = cells[cell.row_id]
    assert taken.worker.startswith(f"{socket.gethostname()}:{joiner.process.pid}:")
    # Taken over at once: the dead holder's lease (an hour on the run's clock) had not run out.
    assert datetime.fromisoformat(taken.started_at).timestamp() < cell.lease_expires_at, taken
    log = progress_path(tmp_path / "reports" / "progress", RUN, cell.cell_id).read_text()
    assert f"TAKEN_OVER taken_from={cell.worker}" in log, log
    assert starts(tmp_path, cell.cell_id) == 2  # the dead holder, then its taker
    assert Counter(r.row_id for r in results) == Counter(list(cells))  # one result each
    own = sorted((a for a in attempts if a.row_id == cell.row_id), key=lambda a: a.attempt)
    assert own[0].session_id == cell.session_id and own[0].session_status == "stopped"
    assert own[-1].attempt > own[0].attempt  # the attempt numbering goes on
    assert active_sessions(standalone_sandbox) == []
