"""An old manifest (schema version 0, as pytest-gpubench wrote it before issue 9) opens,
is migrated in place, and reads right everywhere: report, export, compare, resume."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

import pytest

from pytest_gpubench.store.sqlite_store import SqliteStore
from pytest_gpubench.figures import parse_compare_fail
from pytest_gpubench.measure.compare import compare, figures_of
from pytest_gpubench.errors import UsageProblem
from pytest_gpubench.store.export import export_results
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.errors import ManifestTooNew
from pytest_gpubench.store.schema import SCHEMA_VERSION
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.measure.results import BenchmarkResult
from pytest_gpubench.store.opening import plan_resume

OLD_SQL = Path(__file__).parents[1] / "data" / "manifest_schema_v0.sql"
RUN, CELL = "20261120T100000Z-old", "RTX_4090-vastai-qwen2:7b-c4"
#: The old file's c4 cell: 8 measured requests of 256 tokens in 3.2 s; a mean decode rate of 178.9.
OUTPUT, DECODE = 8 * 256 / 3.2, 178.9


@pytest.fixture
def old_manifest(tmp_path) -> Path:
    path = tmp_path / "manifest.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SQL.read_text(encoding="utf-8"))
    conn.close()
    return path


def _columns(path: Path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def test_the_old_file_is_version_0_with_the_ambiguous_column(old_manifest):
    conn = sqlite3.connect(old_manifest)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert conn.execute("SELECT tokens_per_second FROM benchmark_manifest WHERE cell_id = ?",
                        [CELL]).fetchone()[0] == pytest.approx(DECODE, abs=0.05)
    conn.close()


def test_opening_renames_and_fills_in_the_figures(old_manifest):
    with Manifest(old_manifest) as m:
        assert m.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1
        cell = m.cell(f"{RUN}/{CELL}")
        assert cell["decode_tokens_per_second"] == pytest.approx(DECODE, abs=0.05)
        assert cell["output_tokens_per_second"] == pytest.approx(OUTPUT)
        [bench] = m.benchmarks(RUN)
        assert bench["decode_tokens_per_second"] == pytest.approx(DECODE, abs=0.05)
        assert bench["output_tokens_per_second"] == pytest.approx(OUTPUT)
        [run] = m.benchmark_runs(bench["id"])
        assert run["decode_tokens_per_second"] == 178.9 and run["output_tokens_per_second"] is None
        assert m.cell(f"{RUN}/RTX_3090-vastai-qwen2:7b")["output_tokens_per_second"] is None  # it failed
    for table in ("benchmark_manifest", "benchmarks", "benchmark_runs"):
        assert "tokens_per_second" not in _columns(old_manifest, table)
    # Seed 001's column stays where the seed put it, under its new name.
    assert _columns(old_manifest, "benchmark_manifest")[13] == "decode_tokens_per_second"
    with Manifest(old_manifest) as again:  # a second open changes nothing
        assert again.cell(f"{RUN}/{CELL}")["output_tokens_per_second"] == pytest.approx(OUTPUT)


def test_the_report_export_compare_and_resume_read_the_migrated_file(old_manifest):
    with Manifest(old_manifest) as m:
        report = build_report(SqliteStore(m))
        [row] = report.results
        assert row.output_tokens_per_second == pytest.approx(OUTPUT)
        assert row.decode_tokens_per_second == pytest.approx(DECODE, abs=0.05)
        assert row.figures["ttft_p99_ms"] == 48.9  # read from the old details
        out = io.StringIO()
        assert export_results(SqliteStore(m), RUN, "csv", out) == 1
        [exported] = list(csv.DictReader(io.StringIO(out.getvalue())))
        assert float(exported["output_tokens_per_second"]) == pytest.approx(OUTPUT)
        assert float(exported["decode_tokens_per_second"]) == pytest.approx(DECODE, abs=0.05)
        assert float(exported["ttft_p99_ms"]) == 48.9 and float(exported["itl_p99_ms"]) == 7.0
        assert exported["concurrency"] == "4" and exported["run_id"] == RUN
        baseline = m.baseline(CELL, "last", exclude_run="now")
        assert baseline is not None and baseline["run_id"] == RUN
        stored = BenchmarkResult.model_validate_json(baseline["benchmark"]["result_json"])
        slower = stored.model_copy(update={"results": stored.results.model_copy(
            update={"p50_tokens_per_second": stored.results.p50_tokens_per_second * 0.5})})
        comparison = compare(figures_of(slower, "now"), baseline, parse_compare_fail("tps:10%"))
        assert comparison.failed and comparison.change("tps").baseline == pytest.approx(
            stored.results.p50_tokens_per_second)
    plan = plan_resume(old_manifest, RUN)
    assert plan.run_id == RUN and plan.done == (CELL,)


def test_a_seed_001_file_kept_output_throughput_in_tokens_per_second(tmp_path):
    path = tmp_path / "seed.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE benchmark_manifest (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, created_at TEXT NOT "
                 "NULL, gpu_type TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, status TEXT NOT NULL, "
                 "benchmark_id TEXT, tokens_per_second REAL)")
    conn.execute("INSERT INTO benchmark_manifest VALUES ('r/c', 'r', '2026-01-01', 'RTX 4090', 'vastai', "
                 "'llama3:70b', 'success', NULL, 41.6)")
    conn.commit()
    conn.close()
    with Manifest(path) as m:
        row = m.cell("r/c")
        # The seed's script wrote total_tokens / duration there.
        assert row["output_tokens_per_second"] == 41.6 and row["decode_tokens_per_second"] is None


def test_a_manifest_from_a_newer_version_is_refused_clearly(tmp_path):
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ManifestTooNew) as info:
        Manifest(path)
    assert isinstance(info.value, UsageProblem)
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this pytest-gpubench understands" in str(info.value)
    assert str(path) in str(info.value)


def test_gpubench_browse_leaves_an_old_file_to_gpubench_migrate_then_serves_it(old_manifest, capsys):
    """Issue 21 item 10: browse only reads; it says the file needs `gpubench migrate` (it used to
    migrate it in place), and serves it once migrated."""
    from pytest_gpubench.commands.browse import _QUERIES, datasette_metadata, read_schema
    from pytest_gpubench.commands.cli import main
    from pytest_gpubench.errors import CommandProblem

    before = old_manifest.read_bytes()
    with pytest.raises(CommandProblem, match=r"older pytest-gpubench .*gpubench migrate --store"):
        read_schema(old_manifest)
    assert old_manifest.read_bytes() == before
    assert main(["migrate", "--store", str(old_manifest)]) == 0
    assert "brought up to date (schema version 1)" in capsys.readouterr().out
    assert main(["migrate", "--store", str(old_manifest)]) == 0  # again: nothing to do, nothing changed
    assert "is up to date" in capsys.readouterr().out
    schema = read_schema(old_manifest)
    assert "output_tokens_per_second" in schema["benchmarks"] and "tokens_per_second" not in schema["benchmarks"]
    metadata = datasette_metadata("manifest", schema)
    assert "output_tokens_per_second" in metadata["databases"]["manifest"]["tables"]["benchmarks"]["columns"]
    conn = sqlite3.connect(old_manifest)
    try:
        [row] = conn.execute(_QUERIES["leaderboard"][1]["sql"]).fetchall()
    finally:
        conn.close()
    assert row[4] == pytest.approx(OUTPUT, abs=0.05)  # avg_output_tokens_per_second
