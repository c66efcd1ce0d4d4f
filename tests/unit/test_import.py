"""gpubench import: each format into a real manifest file, the figures, duplicates, bad files, the command."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pytest_gpubench.store.sqlite_store import SqliteStore
from pytest_gpubench.commands.cli import main
from pytest_gpubench.store.export import export_results
from pytest_gpubench.gpuinfo import gpu_name_matches, gpu_type_of
from pytest_gpubench.commands.import_formats import (
    BENCHMARK_RESULT,
    CHECKPOINT,
    SEED_RESULT,
    parse_document,
)
from pytest_gpubench.errors import ImportProblem
from pytest_gpubench.commands.importer import Assumed, import_files, load_json
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.measure.results import (
    BenchmarkResult,
    ModelInfo,
    PerformanceResults,
    TestConfig,
    cost_analysis,
    summarize,
)
from pytest_gpubench.remote.readings import HardwareInfo, RequestRecord

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "import"
SEED_RESULT_FILE = DATA / "seed000_result.json"
SEED_CHECKPOINT_FILE = DATA / "seed001_checkpoint.json"
LOADGEN_CHECKPOINT_FILE = DATA / "loadgen_checkpoint.json"
SHOPPER_RESULT_FILE = DATA / "gpushopper_result.json"
SHOPPER_LIST_FILE = DATA / "gpushopper_benchmarks.json"


def cells(path: Path) -> list[dict]:
    with Manifest(path) as m:
        return m.cells()


def benchmarks(path: Path) -> list[dict]:
    with Manifest(path) as m:
        return m.benchmarks()


def run_import(manifest_path: Path, *paths: Path | str, **kwargs):
    with Manifest(manifest_path) as m:
        return import_files([str(p) for p in paths], SqliteStore(m), argv=["gpubench", "import"], **kwargs)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["import", *args])
    out, err = capsys.readouterr()
    return status, out, err


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# ----------------------------------------------------------------- each format


@pytest.mark.parametrize(("sample", "fmt", "count", "status"), [
    (SEED_RESULT_FILE, SEED_RESULT, 1, "success"),
    (SEED_CHECKPOINT_FILE, CHECKPOINT, 1, "partial"),
    (LOADGEN_CHECKPOINT_FILE, CHECKPOINT, 1, "partial"),
    (SHOPPER_RESULT_FILE, BENCHMARK_RESULT, 1, "success"),
    (SHOPPER_LIST_FILE, BENCHMARK_RESULT, 2, "success"),
])
def test_each_format_is_told_from_its_content_whatever_the_name(tmp_path, sample, fmt, count, status):
    # Renamed so that nothing but the content can tell the format.
    renamed = shutil.copy(sample, tmp_path / "results.txt")
    report = run_import(tmp_path / "m.db", renamed)
    assert [f.formats for f in report.files] == [[fmt]] and not report.failed
    rows = cells(tmp_path / "m.db")
    assert len(rows) == count and {r["status"] for r in rows} == {status}
    assert all(r["run_id"] == report.run_id and report.run_id.startswith("import-") for r in rows)
    assert all(r["imported_from"].startswith(str(renamed)) and r["imported_from"].endswith(f"({fmt})")
               for r in rows)
    stored = benchmarks(tmp_path / "m.db")
    assert [b["manifest_id"] for b in stored] == [r["id"] for r in rows]
    assert [r["benchmark_id"] for r in rows] == [b["id"] for b in stored]


def test_the_import_is_a_run_of_its_own_saying_where_it_came_from(tmp_path):
    report = run_import(tmp_path / "m.db", DATA)
    with Manifest(tmp_path / "m.db") as m:
        run = m.run(report.run_id)
        assert m.run_ids() == [report.run_id]
    assert json.loads(run["matrix_files"]) == [str(DATA)]
    assert json.loads(run["argv"]) == ["gpubench", "import"]
    assert run["status"] == "imported" and run["finished_at"]


def test_seed000_result_figures(tmp_path):
    run_import(tmp_path / "m.db", SEED_RESULT_FILE)
    [row] = cells(tmp_path / "m.db")
    [bench] = benchmarks(tmp_path / "m.db")
    result = BenchmarkResult.model_validate_json(bench["result_json"])
    # The seed script counts only successful requests in total_requests; ours counts every one.
    assert (result.results.total_requests, result.results.total_errors) == (49, 1)
    assert result.results.total_tokens == 12480 and result.results.duration_seconds == 300
    assert result.results.avg_tokens_per_second == 41.6
    assert (result.results.p50_tokens_per_second, result.results.p95_tokens_per_second) == (43.12, 47.85)
    assert result.results.error_rate == pytest.approx(1 / 49)
    assert result.results.requests_per_minute == pytest.approx(48 / 300 * 60)
    assert result.results.avg_tokens_per_request == pytest.approx(12480 / 48)
    assert (result.hardware.gpu_name, result.hardware.gpu_memory_mib, result.hardware.gpu_count) == (
        "NVIDIA H100 80GB HBM3", 81559, 1)
    assert (result.model.name, result.model.family, result.model.parameter_count, result.model.runtime) == (
        "llama3:70b", "llama3", "70B", "ollama")
    assert result.timestamp == datetime(2026, 2, 7, 10, 13, tzinfo=timezone.utc)
    assert (row["gpu_type"], row["provider"], row["model"]) == ("H100 80GB", "unknown", "llama3:70b")
    assert row["cell_id"] == "H100_80GB-unknown-llama3:70b"
    assert row["decode_tokens_per_second"] == 41.6 and row["total_requests"] == 49 and row["error_count"] == 1
    assert row["started_at"].startswith("2026-02-07T10:08:00") and row["completed_at"].startswith("2026-02-07T10:13:00")
    # No price in the file: the cost per token is unknown, not free.
    assert row["price_per_hour"] is None and row["cost_per_million_tokens"] is None
    assert bench["cost_per_million_tokens"] is None


def test_what_a_file_does_not_say_comes_from_the_options(tmp_path):
    assumed = Assumed(gpu="RTX 4090", provider="vastai", price_per_hour=2.5, location="US-CA")
    run_import(tmp_path / "m.db", SEED_RESULT_FILE, SEED_CHECKPOINT_FILE, SHOPPER_RESULT_FILE, assumed=assumed)
    seed, checkpoint, shopper = cells(tmp_path / "m.db")
    # The seed result names its GPU (an H100), so --gpu does not replace it; provider and price it lacks.
    assert (seed["gpu_type"], seed["provider"], seed["price_per_hour"]) == ("H100 80GB", "vastai", 2.5)
    assert seed["cell_id"] == "H100_80GB-vastai-llama3:70b"
    assert seed["cost_per_million_tokens"] == pytest.approx(2.5 / (12480 / 300 * 3600) * 1e6)
    # The checkpoint names no GPU at all.
    assert (checkpoint["gpu_type"], checkpoint["provider"]) == ("RTX 4090", "vastai")
    # The GPU Shopper result states all four: nothing is replaced.
    assert (shopper["gpu_type"], shopper["provider"], shopper["price_per_hour"]) == ("RTX 4090", "vastai", 0.35)
    stored = {b["manifest_id"]: b for b in benchmarks(tmp_path / "m.db")}
    assert stored[shopper["id"]]["location"] == "US-TX" and stored[seed["id"]]["location"] == "US-CA"


def test_seed001_checkpoint_is_a_partial_result_with_what_it_holds(tmp_path):
    data = json.loads(SEED_CHECKPOINT_FILE.read_text())
    run_import(tmp_path / "m.db", SEED_CHECKPOINT_FILE)
    [row] = cells(tmp_path / "m.db")
    [bench] = benchmarks(tmp_path / "m.db")
    result = BenchmarkResult.model_validate_json(bench["result_json"])
    tokens = sum(r.get("tokens", 0) for r in data["results"])
    assert tokens == data["summary"]["total_tokens"]
    assert (result.results.total_requests, result.results.total_errors, result.results.total_tokens) == (20, 1, tokens)
    assert result.results.duration_seconds == data["summary"]["duration_seconds"]
    assert result.results.avg_tokens_per_second == pytest.approx(tokens / data["summary"]["duration_seconds"])
    assert result.model.name == "deepseek-r1:14b" and result.test_config.concurrent_reqs == 1
    assert result.timestamp == datetime(2026, 2, 7, 11, 3, 17, 733000, tzinfo=timezone.utc)  # naive: UTC
    assert row["status"] == "partial"
    assert (row["failure_stage"], row["failure_reason"]) == ("benchmark", "checkpoint")
    assert "status running" in row["error_message"] and "had not finished" in row["error_message"]
    assert (row["gpu_type"], row["provider"]) == ("unknown", "unknown")


def test_a_completed_checkpoint_is_a_success(tmp_path):
    data = json.loads(SEED_CHECKPOINT_FILE.read_text())
    data["status"] = "completed"
    run_import(tmp_path / "m.db", write(tmp_path / "done.json", data))
    [row] = cells(tmp_path / "m.db")
    assert row["status"] == "success" and row["failure_stage"] is None


def test_a_checkpoint_of_the_plugins_load_generator_is_summarized_like_a_measurement(tmp_path):
    data = json.loads(LOADGEN_CHECKPOINT_FILE.read_text())
    records = [RequestRecord.model_validate(r) for r in data["results"]]
    run_import(tmp_path / "m.db", LOADGEN_CHECKPOINT_FILE)
    [row] = cells(tmp_path / "m.db")
    [bench] = benchmarks(tmp_path / "m.db")
    result = BenchmarkResult.model_validate_json(bench["result_json"])
    assert result.results == summarize(records, data["summary"]["elapsed"])
    assert result.results.total_tokens == data["summary"]["tokens"]  # the generator's own count agrees
    assert result.test_config.warmup_requests == sum(r.warmup for r in records) == 1
    with Manifest(tmp_path / "m.db") as m:
        assert [RequestRecord.model_validate(r) for r in m.requests(bench["id"])] == records
    assert row["status"] == "partial" and "status interrupted" in row["error_message"]
    assert row["decode_tokens_per_second"] == result.results.avg_tokens_per_second


def test_gpu_shopper_results_are_stored_as_they_are(tmp_path):
    run_import(tmp_path / "m.db", SHOPPER_RESULT_FILE, SHOPPER_LIST_FILE)
    rows = cells(tmp_path / "m.db")
    stored = benchmarks(tmp_path / "m.db")
    single = json.loads(SHOPPER_RESULT_FILE.read_text())
    first = BenchmarkResult.model_validate_json(stored[0]["result_json"])
    # Every Go field is kept; the script's extras (session_id, quality_results) are not part of the shape.
    assert first.model_dump(mode="json", exclude={"id", "timestamp"}) == {
        key: value for key, value in single.items() if key not in ("timestamp", "session_id", "quality_results")}
    assert first.results.match_rate == 0.8 and first.gpu_stats.max_power_draw_w == 402.8
    assert stored[0]["cost_per_million_tokens"] == pytest.approx(
        cost_analysis(0.35, 36850 / 300.42).cost_per_million_tokens)
    assert rows[0]["cost_per_million_tokens"] == stored[0]["cost_per_million_tokens"]
    assert rows[0]["decode_tokens_per_second"] == 131.27  # the plugin's figure: the per-request average
    # The server's ids are kept as the benchmark ids.
    listing = json.loads(SHOPPER_LIST_FILE.read_text())["benchmarks"]
    assert [b["id"] for b in stored[1:]] == [item["id"] for item in listing]
    assert [(r["gpu_type"], r["provider"], r["model"]) for r in rows[1:]] == [
        ("RTX 3090", "tensordock", "deepseek-r1:14b"), ("A100 80GB", "vastai", "deepseek-r1:32b")]
    assert [r["imported_from"].split(" (")[0] for r in rows[1:]] == [
        f"{SHOPPER_LIST_FILE}:benchmarks[0]", f"{SHOPPER_LIST_FILE}:benchmarks[1]"]
    assert rows[2]["cost_per_million_tokens"] == pytest.approx(
        0.89 / (listing[1]["results"]["total_tokens"] / 302.7 * 3600) * 1e6)


def test_gos_zero_time_and_absurd_durations_leave_the_times_unknown(tmp_path):
    data = json.loads(SHOPPER_RESULT_FILE.read_text())
    zero = {**data, "timestamp": "0001-01-01T00:00:00Z"}
    endless = {**data, "results": {**data["results"], "duration_seconds": 1e300}}
    report = run_import(tmp_path / "m.db", write(tmp_path / "odd.json", [zero, endless]))
    assert not report.failed
    first, second = cells(tmp_path / "m.db")
    assert (first["started_at"], first["completed_at"]) == (None, None)
    assert second["started_at"] is None and second["completed_at"].startswith("2026-02-09T14:22:31")


def test_nulls_count_as_absent_like_for_gos_decoder():
    data = json.loads(SHOPPER_RESULT_FILE.read_text())
    data["results"]["p99_tokens_per_second"] = None
    data["location"] = None
    [parsed] = parse_document(data)
    assert parsed.result.results.p99_tokens_per_second == 0.0 and parsed.result.location == ""


def test_a_result_without_an_id_gets_a_stable_id_from_its_content():
    data = json.loads(SHOPPER_RESULT_FILE.read_text())
    [first] = parse_document(data)
    reordered = json.loads(json.dumps(dict(reversed(list(data.items())))))
    reordered["results"]["total_errors"] = 0.0  # 0 and 0.0 are the same number
    [again] = parse_document(reordered)
    assert first.key == again.key
    data["results"]["total_tokens"] += 1
    [changed] = parse_document(data)
    assert changed.key != first.key


# -------------------------------------------------------------------- duplicates


def test_the_same_file_twice_adds_nothing(tmp_path, capsys):
    status, out, _ = cli(capsys, "--store", str(tmp_path / "m.db"), str(SHOPPER_LIST_FILE),
                         str(SHOPPER_LIST_FILE))
    assert status == 0
    [run_id] = {row["run_id"] for row in cells(tmp_path / "m.db")}
    assert len(cells(tmp_path / "m.db")) == 2
    assert f"skipped 2 duplicates (already in run {run_id})" in out.splitlines()[1]
    status, out, _ = cli(capsys, "--store", str(tmp_path / "m.db"), str(DATA))
    assert status == 0 and len(cells(tmp_path / "m.db")) == 6
    assert "imported 4 results from 5 files" in out and f"skipped 2 duplicates (already in run {run_id})" in out
    status, out, _ = cli(capsys, "--store", str(tmp_path / "m.db"), str(DATA))
    assert status == 0 and len(cells(tmp_path / "m.db")) == 6 and len(benchmarks(tmp_path / "m.db")) == 6
    assert "imported 0 results from 5 files" in out and "skipped 6 duplicates (already in runs " in out
    with Manifest(tmp_path / "m.db") as m:
        assert len(m.run_ids()) == 2  # an import that adds nothing makes no run


def test_assumed_values_do_not_make_a_duplicate_new(tmp_path):
    run_import(tmp_path / "m.db", SEED_RESULT_FILE)
    report = run_import(tmp_path / "m.db", SEED_RESULT_FILE, assumed=Assumed(provider="vastai", price_per_hour=2.5))
    assert [len(f.duplicates) for f in report.files] == [1] and report.run_id is None
    assert len(cells(tmp_path / "m.db")) == 1


def measured_manifest(path: Path) -> str:
    """A manifest with one result the plugin measured (as record.py stores it)."""
    result = BenchmarkResult(
        hardware=HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_mib=24564, gpu_count=1),
        model=ModelInfo(name="qwen2:7b", family="qwen2", runtime="ollama"),
        test_config=TestConfig(duration_minutes=1, max_tokens=256, concurrent_reqs=1),
        results=PerformanceResults(total_requests=20, total_tokens=4000, duration_seconds=60.0,
                                   avg_tokens_per_second=195.3),
        provider="vastai", location="US-CA", price_per_hour=0.36)
    with Manifest(path) as m:
        m.start_run("run-1", ["pytest"], [])
        row_id = m.add_cell("run-1", "RTX_4090-vastai-qwen2:7b", gpu_type="RTX 4090", provider="vastai",
                            model="qwen2:7b", matrix_file="m.yaml")
        benchmark_id = m.add_benchmark(row_id, result, [])
        m.finish_cell(row_id, status="success")
    return benchmark_id


def test_export_then_import_round_trip(tmp_path, capsys):
    benchmark_id = measured_manifest(tmp_path / "m.db")
    assert main(["export", "--store", str(tmp_path / "m.db"), "-o", str(tmp_path / "out.json")]) == 0
    capsys.readouterr()
    # Back into the same manifest: already there.
    status, out, _ = cli(capsys, "--store", str(tmp_path / "m.db"), str(tmp_path / "out.json"))
    assert status == 0 and "skipped 1 duplicate (already in run run-1)" in out
    assert len(cells(tmp_path / "m.db")) == 1
    # Into another manifest: the same result, the same id and figures.
    status, _, _ = cli(capsys, "--store", str(tmp_path / "other.db"), str(tmp_path / "out.json"))
    assert status == 0
    [original], [copy] = benchmarks(tmp_path / "m.db"), benchmarks(tmp_path / "other.db")
    assert copy["id"] == benchmark_id
    assert json.loads(copy["result_json"]) == json.loads(original["result_json"])
    [row] = cells(tmp_path / "other.db")
    assert row["cell_id"] == "RTX_4090-vastai-qwen2:7b" and row["status"] == "success"
    assert row["cost_per_million_tokens"] == pytest.approx(original["cost_per_million_tokens"])
    assert row["decode_tokens_per_second"] == 195.3
    # ... and it exports as it was exported.
    with Manifest(tmp_path / "other.db") as m:
        out_again = io.StringIO()
        export_results(SqliteStore(m), None, "json", out_again)
    assert json.loads(out_again.getvalue()) == json.loads((tmp_path / "out.json").read_text())


def test_a_result_uploaded_from_this_manifest_is_a_duplicate_under_the_servers_id(tmp_path):
    benchmark_id = measured_manifest(tmp_path / "m.db")
    listing = json.loads(SHOPPER_LIST_FILE.read_text())
    with Manifest(tmp_path / "m.db") as m:
        m.mark_upload(benchmark_id, status="uploaded", remote_id=listing["benchmarks"][0]["id"])
    report = run_import(tmp_path / "m.db", SHOPPER_LIST_FILE)
    assert report.files[0].duplicates == ["run-1"] and len(report.files[0].imported) == 1


def test_imported_results_are_a_baseline_for_compare(tmp_path):
    run_import(tmp_path / "m.db", SHOPPER_RESULT_FILE)
    with Manifest(tmp_path / "m.db") as m:
        baseline = m.baseline("RTX_4090-vastai-qwen2:7b", "last", exclude_run="a-later-run")
    assert baseline is not None and baseline["benchmark"]["decode_tokens_per_second"] == 131.27


def test_two_results_of_one_cell_in_one_import_get_their_own_rows(tmp_path):
    data = json.loads(SHOPPER_RESULT_FILE.read_text())
    later = {**data, "timestamp": "2026-02-10T14:22:31Z"}
    run_import(tmp_path / "m.db", write(tmp_path / "two.json", [data, later]))
    assert [r["cell_id"] for r in cells(tmp_path / "m.db")] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b@2"]


# --------------------------------------------------------------------- bad input


BAD = [
    ("not_json.json", "model: llama3\n", "not JSON: Expecting value at line 1 column 1"),
    ("empty.json", "  \n", "an empty file"),
    ("unknown.json", {"name": "x", "value": 3}, "not a result of a known format: expected a GPU Shopper "
                                                 "BenchmarkResult"),
    ("number.json", "42", "found 42"),
    ("wrong_type.json", {"model": {"name": "qwen2:7b"}, "results": {"total_tokens": "many"}},
     "results.total_tokens: Input should be a valid integer, unable to parse string as an integer; got 'many'"),
    ("no_model.json", {"hardware": {"gpu_name": "NVIDIA L40S"}, "results": {"total_tokens": 10}},
     "model.name: required"),
    ("bad_status.json", {"status": "paused", "model": "qwen2:7b", "timestamp": "2026-02-07T11:00:00",
                         "results": [{"tokens": 3}]},
     "status: Input should be 'started', 'running', 'completed', 'interrupted' or 'failed'; got 'paused'"),
    ("bad_record.json", {"status": "running", "model": "qwen2:7b", "timestamp": "2026-02-07T11:00:00",
                         "results": [{"tokens": 3}, {"tokens": -1}]},
     "results[1].tokens: Input should be greater than or equal to 0; got -1"),
    ("no_time.json", {"model": "llama3:8b", "duration_seconds": 300, "total_requests": 3, "total_tokens": 700},
     "timestamp: required in a seed-000 result, but missing"),
    ("nan.json", '{"model": "llama3:8b", "total_tokens": NaN}', "not JSON: NaN is not a JSON number"),
    ("started.json", {"status": "started", "model": "qwen2:7b", "timestamp": "2026-02-07T11:00:00",
                      "results": [], "summary": None}, "holds no measured request yet: nothing to import"),
    ("empty_list.json", [], "an empty list"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_is_one_line_naming_the_file_the_field_and_what_is_allowed(tmp_path, capsys, name, content,
                                                                                  message):
    bad = write(tmp_path / name, content)
    status, out, err = cli(capsys, "--store", str(tmp_path / "m.db"), str(bad), str(SEED_RESULT_FILE))
    assert status == 1
    [line] = err.splitlines()
    assert line.startswith(f"{bad}: ") and message in line, line
    assert "Traceback" not in err
    # The other file still imports.
    assert "imported 1 result from 1 file (seed-000 result)" in out and "failed 1 file" in out
    assert [r["model"] for r in cells(tmp_path / "m.db")] == ["llama3:70b"]


def test_a_list_with_one_bad_item_imports_nothing_of_it(tmp_path):
    good = json.loads(SHOPPER_RESULT_FILE.read_text())
    bad = json.loads(json.dumps(good))
    bad["gpu_stats"]["avg_power_draw_w"] = "a lot"
    report = run_import(tmp_path / "m.db", write(tmp_path / "list.json", [good, bad]))
    assert report.files[0].problem.startswith("[1].gpu_stats.avg_power_draw_w: Input should be a valid number")
    assert report.run_id is None and cells(tmp_path / "m.db") == []


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00{")
    report = run_import(tmp_path / "m.db", tmp_path / "bin.json")
    assert report.files[0].problem == "not JSON: not UTF-8 text"


def test_key_material_is_never_imported(tmp_path):
    data = json.loads(SHOPPER_RESULT_FILE.read_text())
    # A key's header, built here so that no key-like text sits in the repository.
    data["hardware"]["cpu_model"] = "-----BEGIN OPENSSH " + "PRIVATE KEY-----"
    report = run_import(tmp_path / "m.db", write(tmp_path / "key.json", data))
    assert "refusing to store key material" in report.files[0].problem
    assert cells(tmp_path / "m.db") == []


def test_the_seed_scripts_bc_numbers_are_read():
    # bc writes 0.5 as ".5", which is not JSON; seed 000's script pastes it in as it is.
    text = SEED_RESULT_FILE.read_text().replace("47.85", ".85").replace("41.60", "-.5")
    data = load_json(text)
    assert data["p95_tokens_per_second"] == 0.85 and data["avg_tokens_per_second"] == -0.5
    with pytest.raises(ImportProblem, match="not JSON"):
        load_json('{"model": "a", "gpu_info": "x", "total_tokens": }')


def test_gpu_info_with_one_line_per_gpu_counts_them():
    data = json.loads(SEED_RESULT_FILE.read_text())
    data["gpu_info"] = "NVIDIA GeForce RTX 3090, 24576, 9000, 60, 300.1\nNVIDIA GeForce RTX 3090, 24576, 100, 41, 30.2"
    [parsed] = parse_document(data)
    assert (parsed.result.hardware.gpu_name, parsed.result.hardware.gpu_count) == ("NVIDIA GeForce RTX 3090", 2)
    data["gpu_info"] = "unknown,0,0,0,0"  # what the script writes when nvidia-smi failed
    [parsed] = parse_document(data)
    assert (parsed.result.hardware.gpu_name, parsed.result.hardware.gpu_count) == ("", 0)


# ------------------------------------------------------- dry run, directories, CLI


def test_dry_run_writes_nothing(tmp_path, capsys):
    status, out, _ = cli(capsys, "--dry-run", "--store", str(tmp_path / "m.db"), str(DATA))
    assert status == 0 and not (tmp_path / "m.db").exists()
    assert "would import 6 results from 5 files" in out and "nothing was written (dry run)" in out
    assert f"{SEED_CHECKPOINT_FILE}: seed-001 checkpoint: would import 1 result (1 as partial)" in out
    # With a manifest: duplicates are found, and the file does not change.
    run_import(tmp_path / "m.db", SHOPPER_LIST_FILE)
    before = benchmarks(tmp_path / "m.db"), cells(tmp_path / "m.db")
    status, out, _ = cli(capsys, "--dry-run", "--store", str(tmp_path / "m.db"), str(DATA), str(DATA))
    assert status == 0 and "would import 4 results from 10 files" in out and "would skip 8 duplicates" in out
    assert (benchmarks(tmp_path / "m.db"), cells(tmp_path / "m.db")) == before


def test_a_directory_imports_its_json_files_in_order(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SHOPPER_RESULT_FILE, folder / "b.json")
    shutil.copy(SEED_RESULT_FILE, folder / "a.json")
    (folder / "notes.txt").write_text("not a result")
    (folder / "sub").mkdir()
    shutil.copy(SEED_CHECKPOINT_FILE, folder / "sub" / "c.json")  # not recursive
    status, out, _ = cli(capsys, "--store", str(tmp_path / "m.db"), str(folder))
    assert status == 0
    assert [line.split(":")[0] for line in out.splitlines()[:2]] == [str(folder / "a.json"), str(folder / "b.json")]
    assert [r["model"] for r in cells(tmp_path / "m.db")] == ["llama3:70b", "qwen2:7b"]


@pytest.mark.parametrize(("args", "message"), [
    (["SAMPLE", "nowhere.json"], "nowhere.json: no such file or directory"),
    (["SAMPLE", "EMPTY_DIR"], "a directory without *.json files"),
    (["--price", "-1", "SAMPLE"], "--price must not be negative"),
])
def test_usage_problems_exit_2_before_anything_is_written(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    args = [a.replace("EMPTY_DIR", str(tmp_path / "empty")).replace("SAMPLE", str(SEED_RESULT_FILE)) for a in args]
    status, out, err = cli(capsys, "--store", str(tmp_path / "m.db"), *args)
    assert status == 2 and err.startswith("gpubench import: error: ") and message in err
    assert len(err.splitlines()) == 1 and not out
    assert not (tmp_path / "m.db").exists()


def test_no_path_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["import"])
    assert exc.value.code == 2 and "FILE_OR_DIR" in capsys.readouterr().err


def test_the_command_as_a_process(tmp_path):
    bad = write(tmp_path / "bad.json", {"model": "x:1b", "total_tokens": "lots", "timestamp": "2026-01-01T00:00:00Z"})
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "import", "--store", str(tmp_path / "m.db"),
                           "--provider", "vastai", "--price", "2.5", str(DATA), str(bad)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"{bad}: duration_seconds: required in a seed-000 result, but missing "
                                        "(and 2 more problems)"]
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("gpubench import: imported 6 results from 5 files (GPU Shopper BenchmarkResult, "
                              "seed-000 result, seed-001 checkpoint) into run import-")
    assert summary.endswith(f"skipped 0 duplicates; failed 1 file (manifest {tmp_path / 'm.db'})")
    with sqlite3.connect(tmp_path / "m.db") as conn:
        argv = json.loads(conn.execute("SELECT argv FROM runs").fetchone()[0])
    assert argv == ["gpubench", "import", "--provider=vastai", "--price=2.5", str(DATA), str(bad)]


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
                                  "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 5060 Ti", "NVIDIA H200 NVL",
                                  "NVIDIA A100 PCI-E 40GB"])
def test_gpu_type_of_a_product_name_matches_it(name):
    short = gpu_type_of(name)
    assert gpu_name_matches(short, name)
    assert not any(word in short.lower() for word in ("nvidia", "geforce", "tesla", "sxm", "hbm", "pci"))
