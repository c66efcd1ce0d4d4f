"""Stage names (issue 22 item 3): today's names everywhere the project speaks, the seed's tokens in the
seed-000 progress file, and every reader of a stored or written name mapping the seed's/older name to
today's through one table (errors.SEED_STAGE_NAMES). docs/metrics.md "Stage names" documents it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pytest_gpubench.commands.browse import _QUERIES
from pytest_gpubench.errors import SEED_STAGE_NAMES, Stage, StageError, current_stage_name, seed_stage_name
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.progress import ProgressWriter, read_progress
from pytest_gpubench.store.records import AttemptRecord, CellRecord
from pytest_gpubench.store.sqlite_store import SqliteStore

#: Seed 000's stage names ("Common failure stages", the stage timeouts), in its order. CONTRACTS.md
#: "Seed facts worth keeping exact" lists them too.
SEED_000_STAGES = ["inventory", "provision", "ssh_wait", "ssh_connect", "ollama_install", "model_pull",
                   "benchmark", "results", "cleanup"]


def test_every_stage_has_a_seed_name_in_the_seeds_order():
    assert [seed_stage_name(stage) for stage in Stage] == SEED_000_STAGES
    assert Stage.RUNTIME_SETUP.value == "runtime_setup" and SEED_STAGE_NAMES == {Stage.RUNTIME_SETUP: "ollama_install"}


def test_a_seed_or_older_name_reads_as_todays_and_anything_else_as_it_is():
    assert current_stage_name("ollama_install") == "runtime_setup"
    assert [current_stage_name(name) for name in SEED_000_STAGES] == [stage.value for stage in Stage]
    assert current_stage_name("claim") == "claim"  # stage_seconds' own key: kept
    assert StageError("ollama_install", "x").stage is Stage.RUNTIME_SETUP  # a caller with the old name
    assert seed_stage_name("ollama_install") == seed_stage_name(Stage.RUNTIME_SETUP) == "ollama_install"


def test_the_progress_file_writes_the_seeds_token_and_reads_it_back_as_todays(tmp_path):
    path = tmp_path / "cell.log"
    with ProgressWriter(path) as progress:
        line = progress.error(Stage.RUNTIME_SETUP, "vllm is not installed on the instance")
        progress.error(Stage.MODEL_PULL, "pull failed")
    assert line.endswith('ERROR: stage=ollama_install message="vllm is not installed on the instance"')
    assert [record.stage for record in read_progress(path)] == ["runtime_setup", "model_pull"]
    assert read_progress(path)[0].fields["stage"] == "ollama_install"  # the file itself: the seed's


def _old_manifest(path: Path) -> str:
    """A manifest as a version before the rename wrote it (the seed's name in every stage column) beside
    a row written today; the old row's id."""
    with Manifest(path) as m:
        m.start_run("run-1", ["pytest"], [])
        rows = {}
        for cell in ("old", "new"):
            rows[cell] = m.add_cell("run-1", cell, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                                    matrix_file="m.yaml")
            m.start_attempt(rows[cell], 1, offer_id="vastai-1", price_per_hour=0.3)
            m.update_attempt(rows[cell], 1, stage=Stage.RUNTIME_SETUP)
            m.finish_cell(rows[cell], status="failed", failure_stage=Stage.RUNTIME_SETUP, error_message="no vllm")
        m.db["benchmark_manifest"].update(rows["old"], {
            "failure_stage": "ollama_install", "stage_seconds": '{"ssh_connect": 2.0, "ollama_install": 20.5}'})
        m.db["attempts"].update((rows["old"], 1), {"stage": "ollama_install"})
    return rows["old"]


def test_an_old_manifests_rows_read_by_todays_names(tmp_path):
    path = tmp_path / "manifest.db"
    old = _old_manifest(path)
    with SqliteStore.open(path) as store:
        raw = store.manifest.db.conn.execute("SELECT failure_stage FROM benchmark_manifest").fetchall()
        assert sorted(row[0] for row in raw) == ["ollama_install", "runtime_setup"]  # stored as written
        assert sorted(row[0] for row in store.manifest.db.conn.execute("SELECT stage FROM attempts")) == [
            "ollama_install", "runtime_setup"]
        cells = {c.cell_id: c for c in store.cells("run-1")}
        assert cells["old"].failure_stage == cells["new"].failure_stage == "runtime_setup"
        assert cells["old"].stage_seconds == {"ssh_connect": 2.0, "runtime_setup": 20.5}
        assert [a.stage for a in store.attempts("run-1")] == ["runtime_setup", "runtime_setup"]
        # A writer given the old name stores today's.
        store.finish_cell(old, status="failed", failure_stage="ollama_install")
        store.update_attempt(old, 1, stage="ollama_install")
        assert store.manifest.db.conn.execute(
            "SELECT count(*) FROM benchmark_manifest WHERE failure_stage = 'ollama_install'").fetchone()[0] == 0
        assert store.manifest.db.conn.execute(
            "SELECT count(*) FROM attempts WHERE stage = 'ollama_install'").fetchone()[0] == 0


def test_records_map_the_old_name_whatever_store_built_them():
    cell = CellRecord.model_validate({"row_id": "r", "run_id": "run-1", "cell_id": "c", "gpu_type": "g",
                                      "provider": "p", "model": "m", "status": "failed",
                                      "failure_stage": "ollama_install", "stage_seconds": {"ollama_install": 1.0}})
    assert (cell.failure_stage, cell.stage_seconds) == ("runtime_setup", {"runtime_setup": 1.0})
    attempt = AttemptRecord.model_validate({"row_id": "r", "attempt": 1, "run_id": "run-1", "status": "failed",
                                            "stage": "ollama_install", "started_at": "2026-01-01T00:00:00Z"})
    assert attempt.stage == "runtime_setup"


def test_browse_groups_the_old_and_the_new_name_as_one_stage(tmp_path):
    path = tmp_path / "manifest.db"
    _old_manifest(path)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(row) for row in conn.execute(_QUERIES["failures_by_stage"][1]["sql"])]
    finally:
        conn.close()
    assert [(r["failure_stage"], r["cells"]) for r in rows] == [("runtime_setup", 2)]
