"""A cell is claimed in the store before it runs: never run twice at once, run again
cleanly when it finished before (``--gpubench-resume``, a rerun)."""

from __future__ import annotations

import pytest

from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.plugin.record import CellOutcome, CellRecorder
from pytest_gpubench.store.opening import open_store
from pytest_gpubench.store.record_keys import row_id

(CELL,) = expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]", "gpubench_c.yaml"))


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path / "manifest.db") as opened:
        opened.start_run("r1", [], [])
        yield opened


def start(store, tmp_path, worker):
    return CellRecorder.start(store, "r1", CELL, CELL.cell_id, tmp_path / "progress", worker)


def test_a_cell_running_under_one_worker_is_not_started_by_another(store, tmp_path):
    first = start(store, tmp_path, "gw0")
    with pytest.raises(StageError, match=r"already running under worker gw0: not run a second time") as raised:
        start(store, tmp_path, "gw1")
    assert raised.value.stage is Stage.INVENTORY
    record = store.cell(first.row_id)
    assert (record.status, record.worker) == ("running", "gw0")


def test_a_finished_cell_starts_again_clean_under_its_new_worker(store, tmp_path):
    first = start(store, tmp_path, "gw0")
    first.finish(CellOutcome("failed", failure_stage="ssh_wait", error_message="no SSH"))
    assert store.cell(first.row_id).status == "failed"
    again = start(store, tmp_path, "gw1")
    record = store.cell(row_id("r1", CELL.cell_id))
    assert again.row_id == first.row_id
    assert (record.status, record.worker, record.failure_stage, record.error_message) == ("running", "gw1", None, None)
    assert record.started_at and record.progress_file
