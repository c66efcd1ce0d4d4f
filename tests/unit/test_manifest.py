"""Tests of pytest_gpubench.store.manifest: schema, cell lifecycle, results, several writers."""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from datetime import datetime

import pytest

from pytest_gpubench.errors import Stage
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, summarize
from pytest_gpubench.remote.readings import HardwareInfo, RequestRecord

SEED_001_COLUMNS = [
    "id", "run_id", "created_at", "gpu_type", "provider", "model", "session_id",
    "instance_ip", "ssh_port", "status", "started_at", "completed_at", "benchmark_id",
    "tokens_per_second", "total_requests", "error_count", "failure_reason", "failure_stage",
    "error_message", "notes",
]
#: Seed 001's columns in a manifest of schema version 1: its tokens_per_second renamed for what
#: this project stores there, the per-request mean decode rate (docs/metrics.md).
SEED_001_COLUMNS_V1 = ["decode_tokens_per_second" if c == "tokens_per_second" else c for c in SEED_001_COLUMNS]
ADDED_COLUMNS = [
    "cell_id", "matrix_file", "offer_id", "price_per_hour", "cost_usd", "api_cost_usd",
    "session_status", "consumer_id", "worker", "ttft_p50_ms", "cost_per_million_tokens",
    "progress_file", "output_tokens_per_second",
]
KEY = "-----BEGIN " "OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----"


@pytest.fixture
def manifest(tmp_path):
    with Manifest(tmp_path / "reports" / "manifest.db") as m:
        m.start_run("run-1", ["pytest", "matrix/", "-n", "8"], ["matrix/gpubench_seed.yaml"])
        yield m


def add(manifest: Manifest, cell: str = "rtx4090-vastai-qwen2_7b", run: str = "run-1") -> str:
    return manifest.add_cell(run, cell, gpu_type="RTX 4090", provider="vastai",
                             model="qwen2:7b", matrix_file="matrix/gpubench_seed.yaml")


def records() -> list[RequestRecord]:
    rows = [RequestRecord(index=0, warmup=True, prompt_index=0, started_at=1.0, ttft_ms=900.0,
                          latency_ms=3000.0, output_tokens=50, tokens_per_second=20.0)]
    for i in range(1, 5):
        rows.append(RequestRecord(index=i, prompt_index=i % 2, started_at=1.0 + i,
                                  ttft_ms=100.0 * i, latency_ms=1000.0 * i, output_tokens=100,
                                  eval_count=101, prompt_tokens=20,
                                  tokens_per_second=100.0 + i))
    rows.append(RequestRecord(index=5, prompt_index=1, started_at=7.0, latency_ms=10.0,
                              output_tokens=0, error="HTTP 500: model runner crashed"))
    return rows


def result(**fields) -> BenchmarkResult:
    return BenchmarkResult(
        hardware=HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_mib=24564,
                              gpu_count=1),
        model=ModelInfo(name="qwen2:7b", runtime="ollama"),
        results=summarize(records(), duration_seconds=60.0),
        provider="vastai", location="US", price_per_hour=0.4, **fields,
    )


# -------------------------------------------------------------------------- schema


def test_schema(manifest, tmp_path):
    columns = [c.name for c in manifest.db["benchmark_manifest"].columns]
    assert columns[: len(SEED_001_COLUMNS_V1)] == SEED_001_COLUMNS_V1
    assert set(ADDED_COLUMNS) <= set(columns)
    indexed = {tuple(i.columns) for i in manifest.db["benchmark_manifest"].indexes}
    assert {("run_id",), ("status",), ("session_id",)} <= indexed
    assert set(manifest.db.table_names()) >= {"runs", "benchmark_manifest", "benchmarks",
                                              "requests"}
    assert {c.name for c in manifest.db["runs"].columns} == {
        "run_id", "started_at", "finished_at", "argv", "matrix_files", "host", "status",
        "pid", "pid_start", "api", "clouds", "sandbox", "resumed_at"}
    benchmark_columns = {c.name for c in manifest.db["benchmarks"].columns}
    assert {"id", "manifest_id", "run_id", "gpu_name", "gpu_type", "decode_tokens_per_second",
            "output_tokens_per_second",
            "p95_latency_ms", "avg_ttft_ms", "cost_per_million_tokens",
            "result_json"} <= benchmark_columns
    request_columns = {c.name for c in manifest.db["requests"].columns}
    assert set(RequestRecord.model_fields) | {"benchmark_id", "manifest_id"} == request_columns
    assert manifest.db.journal_mode == "wal"
    assert manifest.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30_000
    assert (tmp_path / "reports").is_dir()


def test_an_older_file_gains_the_new_columns(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE benchmark_manifest ({', '.join(SEED_001_COLUMNS)},"
                     " PRIMARY KEY (id))")
        conn.execute("INSERT INTO benchmark_manifest (id, run_id, created_at, gpu_type,"
                     " provider, model, status) VALUES ('old/1', 'old', '2026-01-01', 'RTX 3090',"
                     " 'vastai', 'qwen2:7b', 'success')")
    conn.close()
    with Manifest(path) as m:
        assert set(ADDED_COLUMNS) <= {c.name for c in m.db["benchmark_manifest"].columns}
        assert m.cell("old/1")["status"] == "success"


# ---------------------------------------------------------------------------- runs


def test_runs(manifest):
    first = manifest.run("run-1")
    manifest.start_run("run-1", ["other"], [])  # an xdist worker: no change
    assert manifest.run("run-1") == first
    assert first["status"] == "running" and first["finished_at"] is None
    assert first["argv"] == '["pytest", "matrix/", "-n", "8"]'
    manifest.finish_run("run-1", "passed")
    done = manifest.run("run-1")
    assert done["status"] == "passed" and done["finished_at"]
    datetime.fromisoformat(done["finished_at"])
    with pytest.raises(KeyError):
        manifest.finish_run("nope", "passed")


def test_latest_run_id(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        assert m.latest_run_id() is None
        m.start_run("a", [], [])
        m.start_run("b", [], [])
        assert m.latest_run_id() == "b"


# --------------------------------------------------------------------------- cells


def test_add_cell_is_idempotent(manifest):
    row_id = add(manifest)
    assert row_id == "run-1/rtx4090-vastai-qwen2_7b"
    before = manifest.cell(row_id)
    assert before["status"] == "pending" and before["cell_id"] == "rtx4090-vastai-qwen2_7b"
    assert manifest.add_cell("run-1", "rtx4090-vastai-qwen2_7b", gpu_type="RTX 5090",
                             provider="x", model="y", matrix_file="z") == row_id
    manifest.update_cell(row_id, status="running")
    add(manifest)
    assert len(manifest.cells("run-1")) == 1
    after = manifest.cell(row_id)
    assert after["gpu_type"] == "RTX 4090" and after["status"] == "running"
    assert after["created_at"] == before["created_at"]


def test_cells_filter_and_lookup(manifest):
    add(manifest, "a")
    add(manifest, "b")
    add(manifest, "c", run="run-2")
    assert [c["cell_id"] for c in manifest.cells("run-1")] == ["a", "b"]
    assert len(manifest.cells()) == 3
    assert manifest.cell("run-1/zzz") is None


def test_status_and_column_validation(manifest):
    row_id = add(manifest)
    with pytest.raises(ValueError, match="status"):
        manifest.update_cell(row_id, status="done")
    with pytest.raises(ValueError, match="status"):
        manifest.finish_cell(row_id, status="timeout")
    with pytest.raises(ValueError, match="finished"):
        manifest.finish_cell(row_id, status="running")
    with pytest.raises(ValueError, match="colour"):
        manifest.update_cell(row_id, colour="red")
    with pytest.raises(ValueError, match="run_id"):
        manifest.update_cell(row_id, run_id="other")
    with pytest.raises(ValueError):
        manifest.finish_cell(row_id, status="failed", failure_stage="setup")
    with pytest.raises(KeyError):
        manifest.update_cell("run-1/missing", status="running")
    assert manifest.cell(row_id)["status"] == "pending"


def test_running_stamps_started_at_once(manifest):
    row_id = add(manifest)
    assert manifest.cell(row_id)["started_at"] is None
    manifest.update_cell(row_id, status="running", worker="gw3", instance_ip="10.0.0.5",
                         ssh_port=2222)
    first = manifest.cell(row_id)
    assert first["started_at"] and first["worker"] == "gw3" and first["ssh_port"] == 2222
    manifest.update_cell(row_id, status="running")
    assert manifest.cell(row_id)["started_at"] == first["started_at"]


def test_finish_cell_failure(manifest):
    row_id = add(manifest)
    manifest.update_cell(row_id, status="running")
    manifest.finish_cell(row_id, status="failed", failure_stage=Stage.MODEL_PULL,
                         failure_reason="timeout", error_message="pull took > 15 min",
                         progress_file="reports/progress/x.log")
    row = manifest.cell(row_id)
    assert row["status"] == "failed" and row["failure_stage"] == "model_pull"
    assert row["failure_reason"] == "timeout" and row["error_message"] == "pull took > 15 min"
    assert row["completed_at"] >= row["started_at"]
    assert row["cost_usd"] is None  # no session, no cost
    assert row["progress_file"] == "reports/progress/x.log"


def test_skipped_cell(manifest):
    row_id = add(manifest)
    manifest.finish_cell(row_id, status="skipped", failure_stage="inventory",
                         failure_reason="no eligible offer")
    row = manifest.cell(row_id)
    assert row["status"] == "skipped" and row["started_at"] is None and row["completed_at"]


def test_session_cost(manifest):
    row_id = add(manifest)
    manifest.record_session(row_id, session_id="3f1c-uuid", consumer_id="gpubench-run-1-a",
                            offer_id="vastai-12345", price_per_hour=0.4,
                            session_status="provisioning")
    manifest.finish_cell(row_id, status="success")
    row = manifest.cell(row_id)
    assert row["session_id"] == "3f1c-uuid" and row["offer_id"] == "vastai-12345"
    assert row["session_started_at"] <= row["completed_at"]
    assert 0 <= row["cost_usd"] < 0.01
    other = add(manifest, "other")
    manifest.record_session(other, session_id="s2", consumer_id="c2", offer_id="o2",
                            price_per_hour=1.0)
    manifest.finish_cell(other, status="partial", cost_usd=0.25, api_cost_usd=0.0)
    assert manifest.cell(other)["cost_usd"] == 0.25


def test_open_sessions(manifest):
    pending = add(manifest, "no-session")
    live = add(manifest, "live")
    stopped = add(manifest, "stopped")
    failed = add(manifest, "failed")
    done_but_unreleased = add(manifest, "done")
    elsewhere = add(manifest, "elsewhere", run="run-2")
    for row_id in (live, stopped, failed, done_but_unreleased, elsewhere):
        manifest.record_session(row_id, session_id=f"s-{row_id}", consumer_id="c",
                                offer_id="o", price_per_hour=0.5)
    manifest.update_cell(live, session_status="running")
    manifest.update_cell(stopped, session_status="stopped")
    manifest.update_cell(failed, session_status="failed")
    manifest.finish_cell(done_but_unreleased, status="success")
    assert pending not in {r["id"] for r in manifest.open_sessions()}
    assert [r["id"] for r in manifest.open_sessions("run-1")] == [live, done_but_unreleased]
    assert {r["id"] for r in manifest.open_sessions()} == {live, done_but_unreleased, elsewhere}


# ---------------------------------------------------------------------- benchmarks


def test_add_benchmark(manifest):
    row_id = add(manifest)
    bench = result()
    benchmark_id = manifest.add_benchmark(row_id, bench, records())
    assert benchmark_id and not bench.id  # the caller's value is not changed

    [row] = manifest.benchmarks("run-1")
    assert row["id"] == benchmark_id and row["manifest_id"] == row_id
    assert row["gpu_name"] == "NVIDIA GeForce RTX 4090" and row["gpu_type"] == "RTX 4090"
    assert row["model"] == "qwen2:7b" and row["provider"] == "vastai" and row["location"] == "US"
    assert row["decode_tokens_per_second"] == pytest.approx(102.5)
    assert row["output_tokens_per_second"] == pytest.approx(404 / 60)
    assert row["total_requests"] == 5 and row["total_errors"] == 1
    assert row["total_tokens"] == 404
    assert row["p50_ttft_ms"] == pytest.approx(250.0)
    # The cost of a delivered token: 404 tokens in the 60 s window.
    assert row["cost_per_million_tokens"] == pytest.approx(0.4 / (404 / 60 * 3600) * 1e6)
    stored = BenchmarkResult.model_validate_json(row["result_json"])
    assert stored == bench.model_copy(update={"id": benchmark_id})

    requests = manifest.requests(benchmark_id)
    assert [r["index"] for r in requests] == [0, 1, 2, 3, 4, 5]
    assert requests[0]["warmup"] == 1 and requests[5]["error"].startswith("HTTP 500")

    cell = manifest.cell(row_id)
    assert cell["benchmark_id"] == benchmark_id
    assert cell["decode_tokens_per_second"] == pytest.approx(102.5)
    assert cell["output_tokens_per_second"] == pytest.approx(404 / 60)
    assert cell["total_requests"] == 5 and cell["error_count"] == 1
    assert cell["ttft_p50_ms"] == pytest.approx(250.0)
    assert cell["price_per_hour"] == 0.4
    assert cell["cost_per_million_tokens"] == pytest.approx(row["cost_per_million_tokens"])


def test_add_benchmark_again_replaces(manifest):
    row_id = add(manifest)
    first = manifest.add_benchmark(row_id, result(id="bench-1"), records())
    again = manifest.add_benchmark(row_id, result(id="bench-1"), records()[:2])
    assert first == again == "bench-1"
    assert len(manifest.benchmarks()) == 1
    assert len(manifest.requests("bench-1")) == 2


def test_add_benchmark_for_unknown_cell_writes_nothing(manifest):
    with pytest.raises(KeyError):
        manifest.add_benchmark("run-1/missing", result(), records())
    assert manifest.benchmarks() == []
    assert manifest.db["requests"].count == 0


def test_key_material_is_refused(manifest):
    row_id = add(manifest)
    with pytest.raises(ValueError, match="key material"):
        manifest.update_cell(row_id, notes=f"key was {KEY}")
    with pytest.raises(ValueError, match="key material"):
        manifest.finish_cell(row_id, status="failed", error_message=KEY)
    leaky = records() + [RequestRecord(index=9, prompt_index=0, started_at=9.0, latency_ms=1.0,
                                       output_tokens=0, error=KEY)]
    with pytest.raises(ValueError, match="key material"):
        manifest.add_benchmark(row_id, result(), leaky)
    with pytest.raises(ValueError, match="key material"):
        manifest.add_cell("run-1", "x", gpu_type="A", provider="b", model=KEY, matrix_file="m")
    assert manifest.benchmarks() == []
    assert manifest.cell(row_id)["notes"] is None
    dump = "\n".join(manifest.db.iterdump())
    assert "PRIVATE KEY" not in dump


# ----------------------------------------------------------------- several writers

WORKERS = 8
CELLS_PER_WORKER = 25


def _hammer(path: str, worker: int, start, outcomes) -> None:
    """One xdist-like worker: opens the manifest with the others, then writes its cells."""
    try:
        start.wait()
        manifest = Manifest(path)
        manifest.start_run("run-c", ["pytest", "-n", str(WORKERS)], ["matrix/x.yaml"])
        for i in range(CELLS_PER_WORKER):
            row_id = manifest.add_cell("run-c", f"w{worker}-c{i}", gpu_type="RTX 4090",
                                       provider="vastai", model="qwen2:7b",
                                       matrix_file="matrix/x.yaml")
            manifest.update_cell(row_id, status="running", worker=f"gw{worker}")
            manifest.record_session(row_id, session_id=f"s-{worker}-{i}", consumer_id="c",
                                    offer_id="o", price_per_hour=0.5)
            manifest.finish_cell(row_id, status="success", session_status="stopped")
        manifest.close()
        outcomes.put((worker, "ok"))
    except BaseException:
        outcomes.put((worker, traceback.format_exc()))


def test_many_processes_write_at_once(tmp_path):
    path = str(tmp_path / "shared" / "manifest.db")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WORKERS)
    outcomes = ctx.Queue()
    processes = [ctx.Process(target=_hammer, args=(path, n, start, outcomes))
                 for n in range(WORKERS)]
    for process in processes:
        process.start()
    results = dict(outcomes.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    assert results == {n: "ok" for n in range(WORKERS)}, "\n".join(
        v for v in results.values() if v != "ok")
    with Manifest(path) as manifest:
        rows = manifest.cells("run-c")
        assert len(rows) == WORKERS * CELLS_PER_WORKER
        assert len({r["id"] for r in rows}) == len(rows)
        assert all(r["status"] == "success" and r["completed_at"] for r in rows)
        assert manifest.open_sessions("run-c") == []
        assert len(manifest.db.execute("SELECT * FROM runs").fetchall()) == 1


# ------------------------------------------------- telemetry, repeated runs, uploads


def test_new_tables_and_columns(manifest):
    tables = set(manifest.db.table_names())
    assert {"gpu_samples", "benchmark_runs"} <= tables
    assert {c.name for c in manifest.db["gpu_samples"].columns} == {
        "benchmark_id", "manifest_id", "t", "gpu", "utilization_pct", "memory_used_mib", "temperature_c",
        "power_draw_w"}
    assert {c.name for c in manifest.db["benchmark_runs"].columns} == {
        "benchmark_id", "run_index", "decode_tokens_per_second", "output_tokens_per_second", "ttft_p50_ms",
        "requests", "duration_seconds", "outlier"}
    assert {"upload_status", "upload_error", "remote_id", "uploaded_at"} <= {
        c.name for c in manifest.db["benchmarks"].columns}


def test_an_older_benchmarks_table_gains_upload_and_request_columns(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE benchmark_manifest ({', '.join(SEED_001_COLUMNS)}, PRIMARY KEY (id))")
        conn.execute("INSERT INTO benchmark_manifest (id, run_id, created_at, gpu_type, provider, model, status)"
                     " VALUES ('old/1', 'old', '2026-01-01', 'RTX 3090', 'vastai', 'qwen2:7b', 'success')")
        conn.execute("CREATE TABLE benchmarks (id TEXT PRIMARY KEY, manifest_id TEXT, run_id TEXT,"
                     " tokens_per_second FLOAT, result_json TEXT)")
        conn.execute("INSERT INTO benchmarks VALUES ('b-old', 'old/1', 'old', 99.0, '{}')")
        conn.execute("CREATE TABLE requests (benchmark_id TEXT, manifest_id TEXT, \"index\" INTEGER,"
                     " latency_ms FLOAT)")
    conn.close()
    with Manifest(path) as m:
        assert {"upload_status", "remote_id", "p95_latency_ms"} <= {c.name for c in m.db["benchmarks"].columns}
        assert {"ttft_ms", "itl_mean_ms", "done_reason"} <= {c.name for c in m.db["requests"].columns}
        assert m.benchmark("b-old")["decode_tokens_per_second"] == 99.0
        assert m.benchmark("b-old")["upload_status"] is None
        m.mark_upload("b-old", status="pending")
        assert [r["id"] for r in m.pending_uploads()] == ["b-old"]


def test_upload_bookkeeping(manifest):
    first = manifest.add_benchmark(add(manifest, "a"), result(id="b-a"), records())
    second = manifest.add_benchmark(add(manifest, "b"), result(id="b-b"), records())
    other_run = manifest.add_benchmark(add(manifest, "c", run="run-2"), result(id="b-c"), records())
    assert manifest.pending_uploads() == []  # nothing was asked for
    assert manifest.benchmark(first)["upload_status"] is None

    manifest.mark_upload(first, status="pending")
    manifest.mark_upload(other_run, status="pending")
    assert [r["id"] for r in manifest.pending_uploads()] == [first, other_run]
    assert [r["id"] for r in manifest.pending_uploads("run-1")] == [first]

    manifest.mark_upload(first, status="failed", error="POST /api/v1/benchmarks failed: connection refused")
    row = manifest.benchmark(first)
    assert row["upload_status"] == "failed" and "connection refused" in row["upload_error"]
    assert row["uploaded_at"] is None
    assert [r["id"] for r in manifest.pending_uploads("run-1")] == [first]  # failed ones are retried

    manifest.mark_upload(first, status="uploaded", remote_id="remote-1")
    row = manifest.benchmark(first)
    assert (row["upload_status"], row["remote_id"], row["upload_error"]) == ("uploaded", "remote-1", None)
    datetime.fromisoformat(row["uploaded_at"])
    assert [r["id"] for r in manifest.pending_uploads()] == [other_run]

    assert manifest.request_uploads("run-1") == 1  # only the never-asked one of run-1
    assert manifest.benchmark(second)["upload_status"] == "pending"
    assert manifest.benchmark(first)["upload_status"] == "uploaded"

    # Storing a result again keeps its upload state.
    manifest.add_benchmark(manifest.cell("run-1/a")["id"], result(id="b-a"), records())
    assert manifest.benchmark(first)["remote_id"] == "remote-1"

    with pytest.raises(ValueError, match="pending, uploaded, failed"):
        manifest.mark_upload(first, status="done")
    with pytest.raises(KeyError):
        manifest.mark_upload("missing", status="pending")
    manifest.mark_upload(second, status="failed", error=f"server echoed {KEY}")
    assert "PRIVATE KEY" not in manifest.benchmark(second)["upload_error"]


def test_benchmark_runs(manifest):
    benchmark_id = manifest.add_benchmark(add(manifest), result(id="b-1"), records())

    class Run:  # any object with the fields, e.g. the results helper's model
        def __init__(self, tps, outlier=False):
            self.decode_tokens_per_second, self.ttft_p50_ms, self.requests = tps, 40.0, 10
            self.duration_seconds, self.outlier = 30.0, outlier

    assert manifest.add_benchmark_runs(benchmark_id, [Run(100.0), Run(101.0), Run(60.0, outlier=True)]) == 3
    runs = manifest.benchmark_runs(benchmark_id)
    assert [(r["run_index"], r["decode_tokens_per_second"], r["outlier"]) for r in runs] == [
        (0, 100.0, False), (1, 101.0, False), (2, 60.0, True)]
    assert runs[0]["requests"] == 10 and runs[0]["duration_seconds"] == 30.0
    # Storing again replaces; mappings with their own run_index work too.
    manifest.add_benchmark_runs(benchmark_id, [{"run_index": 5, "decode_tokens_per_second": 99.0, "outlier": 0}])
    assert [(r["run_index"], r["decode_tokens_per_second"], r["ttft_p50_ms"]) for r in
            manifest.benchmark_runs(benchmark_id)] == [(5, 99.0, None)]
    # Storing the benchmark again keeps its runs.
    manifest.add_benchmark(manifest.cell("run-1/rtx4090-vastai-qwen2_7b")["id"], result(id="b-1"), records())
    assert len(manifest.benchmark_runs(benchmark_id)) == 1
    with pytest.raises(KeyError):
        manifest.add_benchmark_runs("missing", [Run(1.0)])


def test_gpu_samples(manifest):
    row_id = add(manifest)
    samples = [{"t": 10.0 + i, "gpu": 0, "utilization_pct": 95.0, "memory_used_mib": 5420,
                "temperature_c": 70.0, "power_draw_w": None} for i in range(3)]
    assert manifest.add_gpu_samples(row_id, None, samples[:1]) == 1  # before the result exists
    benchmark_id = manifest.add_benchmark(row_id, result(), records())
    assert manifest.add_gpu_samples(row_id, benchmark_id, samples[1:]) == 2
    assert [s["t"] for s in manifest.gpu_samples(benchmark_id)] == [11.0, 12.0]
    assert [s["t"] for s in manifest.gpu_samples(row_id=row_id)] == [10.0, 11.0, 12.0]
    assert manifest.gpu_samples(benchmark_id)[0]["power_draw_w"] is None
    with pytest.raises(KeyError):
        manifest.add_gpu_samples("run-1/missing", None, samples)
    with pytest.raises(ValueError):
        manifest.gpu_samples()


# ----------------------------------------------------------------------- baseline


def _finished_cell(m: Manifest, run: str, cell: str, status: str, tps: float | None, started: str) -> str:
    m.start_run(run, [], [])
    m.db["runs"].update(run, {"started_at": started})
    row_id = m.add_cell(run, cell, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b", matrix_file="m")
    if tps is not None:
        bench = result().model_copy(update={"results": result().results.model_copy(
            update={"avg_tokens_per_second": tps})})
        m.add_benchmark(row_id, bench, [])
    m.finish_cell(row_id, status=status)
    return row_id


def test_baseline_is_the_latest_earlier_run_with_that_cell_done(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        _finished_cell(m, "r1", "cell", "success", 100.0, "2026-11-20T03:00:00.000+00:00")
        _finished_cell(m, "r2", "cell", "partial", 90.0, "2026-11-21T03:00:00.000+00:00")
        _finished_cell(m, "r3", "cell", "failed", None, "2026-11-22T03:00:00.000+00:00")
        _finished_cell(m, "r3", "other", "success", 50.0, "2026-11-22T03:00:00.000+00:00")
        _finished_cell(m, "r4", "cell", "success", 120.0, "2026-11-23T03:00:00.000+00:00")  # the current run

        found = m.baseline("cell", "last", exclude_run="r4")
        assert found["run_id"] == "r2" and found["status"] == "partial"
        assert found["decode_tokens_per_second"] == 90.0
        assert found["benchmark"]["id"] == found["benchmark_id"] and found["benchmark"]["error_rate"] == 0.2
        assert m.baseline("cell")["run_id"] == "r4"  # nothing excluded
        assert m.baseline("cell", None, exclude_run="r4")["run_id"] == "r2"
        assert m.baseline("cell", "r1")["decode_tokens_per_second"] == 100.0
        assert m.baseline("cell", "r3") is None  # failed there
        assert m.baseline("cell", "nope") is None
        assert m.baseline("missing-cell") is None
        assert m.baseline("other", exclude_run="r3") is None
        assert m.run_ids() == ["r4", "r3", "r2", "r1"]


def test_baseline_from_a_manifest_without_benchmarks_rows(tmp_path):
    with Manifest(tmp_path / "m.db") as m:
        row_id = m.add_cell("seed", "cell", gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                            matrix_file="m")
        m.finish_cell(row_id, status="success", decode_tokens_per_second=77.0)
        found = m.baseline("cell", exclude_run="now")
        assert found["run_id"] == "seed" and found["decode_tokens_per_second"] == 77.0 and found["benchmark"] is None
        assert m.run_ids() == ["seed"]
