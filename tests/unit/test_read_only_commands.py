"""The commands that only read (report, export, status, plan's estimates) leave a SQLite file as it is
(issue 21 item 10): a file that is no manifest is refused in one line, an older manifest is said to need
``gpubench migrate``, and a current one is read without a byte or its mtime changing."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from pytest_gpubench.commands.cli import main
from pytest_gpubench.measure.results import BenchmarkResult
from pytest_gpubench.store.manifest import Manifest

OLD_SQL = Path(__file__).parents[1] / "data" / "manifest_schema_v0.sql"

READERS = {
    "report": ["report", "--reports", "{out}"],
    "export": ["export", "--format", "json"],
    "export-csv-to-file": ["export", "--format", "csv", "-o", "{out}/results.csv"],
    "export-to": ["export", "--to", "{out}/copy.db"],
    "status": ["status"],
}


def _file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "store" / "manifest.db"
    path.parent.mkdir()
    if kind == "foreign":  # another program's SQLite database
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('mine')")
        conn.commit()
        conn.close()
    elif kind == "junk":
        path.write_bytes(b"not a database at all\n" * 200)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "old":  # what pytest-gpubench wrote before schema version 1
        conn = sqlite3.connect(path)
        conn.executescript(OLD_SQL.read_text(encoding="utf-8"))
        conn.close()
    else:
        raise AssertionError(kind)
    return path


def _state(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


def _run(reader: str, path: Path, out: Path) -> int:
    return main([*(arg.format(out=out) for arg in READERS[reader]), "--store",
                 str(path)])


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("kind", ["foreign", "junk", "empty", "old"])
def test_a_reader_refuses_a_file_it_cannot_read_in_one_line_and_changes_nothing(tmp_path, capsys, reader, kind):
    path = _file(tmp_path, kind)
    before = _state(path)
    out = tmp_path / "out"
    assert _run(reader, path, out) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpubench {READERS[reader][0]}: error: "), captured.err
    if kind == "old":
        assert "written by an older pytest-gpubench" in lines[0]
        assert f"gpubench migrate --store {path}" in lines[0]
    else:
        assert f"{path} is not a pytest-gpubench manifest" in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert _state(path) == before  # not a byte, not the mtime, no -wal/-shm/-journal left beside it
    assert not out.exists() or not any(out.iterdir())  # and nothing written from it


@pytest.mark.parametrize("reader", list(READERS))
def test_a_reader_reads_a_current_manifest_without_touching_it(tmp_path, capsys, reader):
    path = tmp_path / "store" / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-1", ["pytest"], [])
        row_id = m.add_cell("run-1", "cell-a", gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                            matrix_file="m.yaml")
        m.add_benchmark(row_id, BenchmarkResult(), [])
        m.finish_cell(row_id, status="success", failure_stage=None, error_message=None, cost_usd=0.1)
        m.finish_run("run-1", "passed")
    before = _state(path)[:2]
    assert _run(reader, path, tmp_path / "out") == 0, capsys.readouterr().err
    # The file itself is untouched (a WAL file's reader may leave SQLite's empty -wal/-shm beside it).
    assert _state(path)[:2] == before


def test_plan_estimates_leave_an_old_manifest_as_it_is_and_say_why(tmp_path):
    from pytest_gpubench.commands.plan import StageHistory

    path = _file(tmp_path, "old")
    before = _state(path)
    history = StageHistory.from_manifest(path, sandbox=True)
    assert not history.samples and "gpubench migrate" in history.description
    assert _state(path) == before


def test_gpubench_migrate_brings_an_old_manifest_up_to_date_and_refuses_other_files(tmp_path, capsys):
    old = _file(tmp_path, "old")
    assert main(["migrate", "--store", str(old)]) == 0
    assert capsys.readouterr().out.strip() == f"gpubench migrate: {old} brought up to date (schema version 1)"
    assert main(["report", "--store", str(old), "--reports", str(tmp_path / "out")]) == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    other = _file(foreign, "foreign")
    before = _state(other)
    assert main(["migrate", "--store", str(other)]) == 2
    assert "is not a pytest-gpubench manifest" in capsys.readouterr().err
    assert _state(other) == before
    assert main(["migrate", "--store", str(tmp_path / "nothing.db")]) == 2
    assert not (tmp_path / "nothing.db").exists()
    assert os.listdir(foreign / "store") == ["manifest.db"]


@pytest.mark.parametrize("command", [["upload", "--run", "last"], ["cleanup", "--dry-run"], ["import", "{json}"],
                                     ["export", "--store", "{good}", "--to"]])
def test_a_writer_never_turns_another_programs_sqlite_file_into_a_manifest(tmp_path, capsys, command):
    """The commands that write migrate an older manifest, but refuse a file that is no manifest."""
    path = _file(tmp_path, "foreign")
    good = tmp_path / "good.db"
    with Manifest(good) as m:
        m.start_run("run-1", ["pytest"], [])
    (tmp_path / "r.json").write_text("[]")
    before = _state(path)
    args = [arg.format(json=tmp_path / "r.json", good=good) for arg in command]
    assert main([*args, str(path)] if args[-1] == "--to" else [*args, "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} is not a pytest-gpubench manifest" in err and len(err.splitlines()) == 1, err
    assert _state(path) == before


def test_gpubench_migrate_on_a_postgresql_store_leaves_it_to_its_own_migrations(postgres_url, capsys):
    from pytest_gpubench.store.opening import open_store

    with open_store(postgres_url) as store:
        store.start_run("run-1", ["pytest"], [])
    assert main(["migrate", "--store", postgres_url]) == 0
    assert capsys.readouterr().out.startswith("gpubench migrate: postgresql://")
    assert main(["status", "--store", postgres_url]) == 0  # a reader of a server store: as before
