"""``gpubench browse``: the data dictionary against the real schema, the generated
Datasette metadata and canned queries, and Datasette really serving a manifest.

Tests that need Datasette skip without it, unless ``GPUBENCH_REQUIRE_DATASETTE=1``
(CI sets it and installs the ``[browse]`` extra), where they fail instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from result_helpers import make_result

from pytest_gpubench.commands.browse import _QUERIES, datasette_metadata, read_schema
from pytest_gpubench.commands.cli import main
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.data_dictionary import TABLES, schema_of, undocumented

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def datasette() -> None:
    """Skip without Datasette, or fail when CI said it must be there."""
    if importlib.util.find_spec("datasette") is None:
        if os.environ.get("GPUBENCH_REQUIRE_DATASETTE") == "1":
            pytest.fail("GPUBENCH_REQUIRE_DATASETTE=1 but Datasette is not installed", pytrace=False)
        pytest.skip("Datasette is not installed (pip install 'pytest-gpubench[browse]')")


def _cell(m: Manifest, run: str, cell: str, *, gpu: str = "RTX 4090", model: str = "qwen2:7b",
          tps: float | None = None, price: float = 0.36, failure: tuple[str, str, str] | None = None,
          cost: float | None = None) -> str:
    """A cell of ``run``: a result at ``tps`` tokens/s, or a failure (status, stage, message);
    with ``cost``, one provisioning attempt that billed that much."""
    row_id = m.add_cell(run, cell, gpu_type=gpu, provider="vastai", model=model, matrix_file="m.yaml")
    if cost is not None:
        m.start_attempt(row_id, 1, offer_id="vastai-1", price_per_hour=price)
        m.update_attempt(row_id, 1, session_id=f"sess-{cell}")
        m.db["attempts"].update((row_id, 1), {"cost_usd": cost, "api_cost_usd": round(cost * 2, 2)})
    if failure is not None:
        status, stage, message = failure
        m.finish_cell(row_id, status=status, failure_stage=stage, failure_reason="InstanceLost",
                      error_message=message)
        return row_id
    result = make_result(tps, model=model).model_copy(update={"price_per_hour": price})
    m.add_benchmark(row_id, result, [])
    m.finish_cell(row_id, status="success", cost_usd=cost)
    return row_id


@pytest.fixture
def manifest_path(tmp_path) -> Path:
    """run-1: two models on two GPUs and three failures; run-2 (later): one result."""
    path = tmp_path / "reports" / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-1", ["pytest"], [])
        m.db["runs"].update("run-1", {"started_at": "2026-11-22T03:00:00.000+00:00"})
        _cell(m, "run-1", "a", tps=195.3, cost=0.25)
        _cell(m, "run-1", "b", gpu="RTX 3090", tps=120.0, price=0.2, cost=0.5)
        _cell(m, "run-1", "c", model="llama3:8b", tps=100.0)
        _cell(m, "run-1", "d", failure=("failed", "benchmark", "the instance went away"), cost=0.125)
        _cell(m, "run-1", "e", failure=("failed", "provision", "no capacity"))
        _cell(m, "run-1", "f", failure=("partial", "benchmark", "stalled stream"))
        m.start_run("run-2", ["pytest"], [])
        m.db["runs"].update("run-2", {"started_at": "2026-11-23T03:00:00.000+00:00"})
        _cell(m, "run-2", "a", tps=180.1)
    return path


def _real_schema(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        return schema_of(conn)
    finally:
        conn.close()


# ------------------------------------------------------------ the dictionary


def test_every_table_and_column_of_the_real_schema_is_described(tmp_path):
    """A column someone adds to manifest_schema.py without a description fails here."""
    path = tmp_path / "manifest.db"
    Manifest(path).close()
    conn = sqlite3.connect(path)
    try:
        missing = undocumented(conn)
        schema = schema_of(conn)
    finally:
        conn.close()
    assert not missing, f"describe these in pytest_gpubench/store/data_dictionary.py: {', '.join(missing)}"
    assert {"runs", "benchmark_manifest", "benchmarks", "requests", "gpu_samples", "benchmark_runs",
            "attempts"} <= set(schema)
    assert sum(len(columns) for columns in schema.values()) > 150  # the real thing, not an empty file


def test_an_undescribed_table_or_column_is_reported(tmp_path):
    path = tmp_path / "manifest.db"
    Manifest(path).close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("ALTER TABLE benchmark_manifest ADD COLUMN mystery TEXT")
        conn.execute("CREATE TABLE imports (id TEXT)")
        assert undocumented(conn) == ["benchmark_manifest.mystery", "imports"], undocumented(conn)
    finally:
        conn.close()


def test_the_dictionary_describes_no_column_that_does_not_exist(tmp_path):
    """A typo or a column gone from the schema leaves a description behind."""
    path = tmp_path / "manifest.db"
    Manifest(path).close()
    schema = _real_schema(path)
    stale = [f"{table}.{column}" for table, doc in TABLES.items() for column in doc.columns
             if column not in schema.get(table, [])]
    assert not stale
    for table, doc in TABLES.items():
        shown = [c for c in (doc.sort, doc.sort_desc, *doc.facets) if c is not None]
        assert set(shown) <= set(schema[table]), table


@pytest.mark.parametrize(("pattern", "unit"), [
    (r"_ms$", "milliseconds"), (r"_ns$", "nanoseconds"), (r"(^|_)seconds$", "seconds"),
    (r"usd$|per_million_tokens$|per_hour$", "USD"), (r"tokens_per_second$", "tokens/s"),
    (r"_mib$", "MiB"), (r"_pct$", "percent"), (r"_w$", "watts"),
])
def test_descriptions_give_units(pattern, unit):
    lacking = [f"{table}.{column}" for table, doc in TABLES.items() for column, text in doc.columns.items()
               if re.search(pattern, column) and unit not in text]
    assert not lacking, f"no {unit!r} in the description of {', '.join(lacking)}"


# ------------------------------------------------------------- the metadata


def test_metadata_describes_what_the_file_has(manifest_path):
    schema = read_schema(manifest_path)
    metadata = datasette_metadata("manifest", schema, source=str(manifest_path))
    database = metadata["databases"]["manifest"]
    assert set(database["tables"]) == set(schema) and "license" not in metadata
    cells = database["tables"]["benchmark_manifest"]
    assert set(cells["columns"]) == set(schema["benchmark_manifest"])
    assert cells["sort_desc"] == "created_at"
    assert {"status", "failure_stage", "gpu_type", "provider", "model"} <= set(cells["facets"])
    assert set(database["queries"]) == {"leaderboard", "failures_by_stage", "spend_per_run"}
    json.dumps(metadata)  # what Datasette reads


def test_metadata_of_an_older_file_leaves_out_what_it_lacks():
    schema = {"benchmark_manifest": ["id", "run_id", "status", "gpu_type"], "benchmarks": ["id", "model"]}
    database = datasette_metadata("old", schema)["databases"]["old"]
    cells = database["tables"]["benchmark_manifest"]
    assert set(cells["columns"]) == {"id", "run_id", "status", "gpu_type"}
    assert cells["facets"] == ["status", "gpu_type", "run_id"] and "sort_desc" not in cells
    assert "sort_desc" not in database["tables"]["benchmarks"]  # no tokens_per_second column to sort by
    assert set(database["queries"]) == {"leaderboard", "failures_by_stage"}  # no runs or attempts table


def _query(path: Path, name: str) -> list[dict]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(_QUERIES[name][1]["sql"])]
    finally:
        conn.close()


def test_leaderboard_ranks_by_output_tokens_per_second_within_each_model(manifest_path):
    rows = _query(manifest_path, "leaderboard")
    assert [(r["model"], r["gpu_type"]) for r in rows] == [
        ("llama3:8b", "RTX 4090"), ("qwen2:7b", "RTX 4090"), ("qwen2:7b", "RTX 3090")]
    best = rows[1]
    # make_result: 4000 tokens in 60 s everywhere, so equal output throughput; the decode rate breaks the tie.
    assert best["results"] == 2 and best["avg_output_tokens_per_second"] == pytest.approx(4000 / 60, abs=0.05)
    assert best["avg_decode_tokens_per_second"] == pytest.approx((195.3 + 180.1) / 2, abs=0.05)
    # make_result: 4000 tokens in 60 s, output throughput 66.67 tokens/s; $0.36/h -> $1.50 per million.
    assert best["best_usd_per_million_tokens"] == pytest.approx(0.36 / (4000 / 60 * 3600) * 1e6, abs=1e-4)
    assert rows[2]["best_usd_per_million_tokens"] == pytest.approx(0.2 / (4000 / 60 * 3600) * 1e6, abs=1e-4)


def test_failures_are_grouped_in_stage_order(manifest_path):
    rows = _query(manifest_path, "failures_by_stage")
    assert [(r["failure_stage"], r["status"], r["cells"]) for r in rows] == [
        ("provision", "failed", 1), ("benchmark", "failed", 1), ("benchmark", "partial", 1)]
    assert rows[0]["latest_message"] == "no capacity" and rows[0]["failure_reason"] == "InstanceLost"


def test_spend_per_run_sums_the_attempts(manifest_path):
    rows = _query(manifest_path, "spend_per_run")
    assert [r["run_id"] for r in rows] == ["run-2", "run-1"]
    run1 = rows[1]
    assert (run1["cells"], run1["succeeded"], run1["sessions"]) == (6, 3, 3)
    assert run1["spend_usd"] == pytest.approx(0.875) and run1["api_billed_usd"] == pytest.approx(1.75)
    assert rows[0]["spend_usd"] == 0 and rows[0]["sessions"] == 0


# -------------------------------------------------------------- the command


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_without_datasette_the_command_says_how_to_install_it(manifest_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasette", None)  # import datasette now raises ImportError
    monkeypatch.setitem(sys.modules, "datasette.cli", None)
    assert main(["browse", "--store", str(manifest_path), "--no-open"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("gpubench browse: error: ") and "pip install 'pytest-gpubench[browse]'" in line


@pytest.mark.parametrize(("args", "message"), [
    (["--store", "{missing}"], "no manifest at {missing}"),
    (["--store", "{foreign}"], "is not a pytest-gpubench manifest"),
    (["--store", "{junk}"], "is not a pytest-gpubench manifest (file is not a database)"),
    (["--store", "{manifest}", "extra.db"], "unexpected argument 'extra.db'"),
    (["--store", "{manifest}", "--port", "70000"], "--port must be 0-65535"),
])
def test_usage_problems_are_one_line_and_exit_2(datasette, manifest_path, tmp_path, capsys, args, message):
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    (tmp_path / "junk.db").write_text("not a database " * 100)
    names = {"missing": str(tmp_path / "nope.db"), "foreign": str(foreign), "junk": str(tmp_path / "junk.db"),
             "manifest": str(manifest_path)}
    assert main(["browse", "--no-open", *(a.format(**names) for a in args)]) == 2
    assert message.format(**names) in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "nope.db").exists()  # looking did not create one


def test_a_port_in_use_is_one_line(datasette, manifest_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["browse", "--store", str(manifest_path), "--no-open", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in _one_line(capsys.readouterr().err)


def test_datasette_options_pass_through(datasette, manifest_path, capsys):
    """Everything after -- goes to `datasette serve`: here --get, which answers one request and exits."""
    with pytest.raises(SystemExit) as exited:
        main(["browse", "--store", str(manifest_path), "--no-open", "--port", "0",
              "--", "--get", "/manifest/failures_by_stage.json?_shape=array"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index("["):])
    assert [r["failure_stage"] for r in rows] == ["provision", "benchmark", "benchmark"]


def test_a_bad_datasette_option_is_one_line(datasette, manifest_path, capsys):
    assert main(["browse", "--store", str(manifest_path), "--no-open", "--port", "0", "--", "--bogus"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("gpubench browse: error: Datasette: ") and "--bogus" in line


# ------------------------------------------------------ Datasette, serving


def test_datasette_serves_the_described_manifest_while_a_run_writes(datasette, manifest_path, tmp_path):
    # Files, not pipes: uvicorn logs every request to stdout, and a full pipe would stall it.
    out, log = tmp_path / "browse.out", tmp_path / "datasette.log"
    scratch = tmp_path / "tmp"  # where the metadata file goes while serving
    scratch.mkdir()
    with open(out, "w") as stdout, open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_gpubench.commands.cli", "browse", "--store", str(manifest_path),
             "--no-open", "--port", "0"],
            cwd=REPO, stdout=stdout, stderr=stderr, text=True, env={**os.environ, "TMPDIR": str(scratch)})
    try:
        found = wait_for(lambda: re.search(r"read-only at (http://127\.0\.0\.1:\d+)/manifest ", out.read_text()),
                         timeout=60, what="gpubench browse to print its URL")
        base = found[1]
        with httpx.Client(base_url=base, timeout=30) as client:

            def up():
                if proc.poll() is not None:
                    raise AssertionError(f"gpubench browse exited {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    return client.get("/-/metadata.json").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(up, timeout=60, what="Datasette to answer")
            metadata = client.get("/-/metadata.json").json()
            tables = metadata["databases"]["manifest"]["tables"]
            assert tables["benchmark_manifest"]["columns"]["failure_stage"].startswith("Stage at which the cell")
            assert "tokens/s" in tables["benchmarks"]["columns"]["p95_tokens_per_second"]

            rows = client.get("/manifest/benchmark_manifest.json", params={"_shape": "array"}).json()
            assert len(rows) == 7 and {r["status"] for r in rows} == {"success", "failed", "partial"}
            page = client.get("/manifest/benchmark_manifest").text
            assert "Cells (benchmark manifest)" in page and "Median time to first token, milliseconds." in page
            for name in ("leaderboard", "failures_by_stage", "spend_per_run"):
                answer = client.get(f"/manifest/{name}.json", params={"_shape": "array"})
                assert answer.status_code == 200 and answer.json(), name

            # A run writing meanwhile: its writes go through, and show on the next request.
            with Manifest(manifest_path, busy_timeout=5, retry_seconds=5) as live:
                live.start_run("run-3", ["pytest"], [])
                _cell(live, "run-3", "late", tps=150.0)
                rows = client.get("/manifest/benchmark_manifest.json", params={"_shape": "array"}).json()
                assert "run-3/late" in {r["id"] for r in rows}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            raise
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert "gpubench browse: stopped" in out.read_text()
    assert list(scratch.iterdir()) == []  # SIGTERM too removes the metadata file
