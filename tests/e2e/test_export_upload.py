"""export.py and the gpubench export / upload commands, uploads against the real sandbox API."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from result_helpers import make_result

from pytest_gpubench.store.sqlite_store import SqliteStore
from pytest_gpubench.commands.cli import main
from pytest_gpubench.store.export import csv_columns, export_results, upload_pending
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.measure.results import BenchmarkResult
from e2e_helpers import SANDBOX_AUTH, SANDBOX_TOKEN
from pytest_gpubench.sandbox import SandboxThread
from pytest_gpubench.cloud.shopper_client import ShopperClient

REPO = Path(__file__).resolve().parents[2]


def _cell(m: Manifest, run: str, cell: str, result: BenchmarkResult | None) -> str | None:
    row_id = m.add_cell(run, cell, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b", matrix_file="m.yaml")
    if result is None:
        m.finish_cell(row_id, status="failed", failure_stage="provision", error_message="no capacity")
        return None
    benchmark_id = m.add_benchmark(row_id, result, [])
    m.finish_cell(row_id, status="success")
    return benchmark_id


@pytest.fixture
def manifest_path(tmp_path) -> Path:
    """run-1: two results and a failed cell; run-2 (later): one result."""
    path = tmp_path / "reports" / "manifest.db"
    with Manifest(path) as m:
        m.start_run("run-1", ["pytest"], [])
        m.db["runs"].update("run-1", {"started_at": "2026-11-22T03:00:00.000+00:00"})
        _cell(m, "run-1", "RTX_4090-vastai-qwen2:7b", make_result(195.3))
        _cell(m, "run-1", "RTX_4090-vastai-llama3:8b", make_result(100.0, model="llama3:8b"))
        _cell(m, "run-1", "RTX_3090-vastai-qwen2:7b", None)
        m.start_run("run-2", ["pytest"], [])
        m.db["runs"].update("run-2", {"started_at": "2026-11-23T03:00:00.000+00:00"})
        _cell(m, "run-2", "RTX_4090-vastai-qwen2:7b", make_result(180.1))
    return path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


# ------------------------------------------------------------------------ export


def test_json_export_is_the_stored_benchmark_results(manifest_path):
    with Manifest(manifest_path) as m:
        out = io.StringIO()
        assert export_results(SqliteStore(m), None, "json", out) == 3
        exported = json.loads(out.getvalue())
        assert exported == [json.loads(row["result_json"]) for row in m.benchmarks()]
        assert [BenchmarkResult.model_validate(r).results.avg_tokens_per_second for r in exported] == [
            195.3, 100.0, 180.1]
        one_run = io.StringIO()
        assert export_results(SqliteStore(m), "run-2", "json", one_run) == 1
        assert json.loads(one_run.getvalue())[0]["id"] == m.benchmarks("run-2")[0]["id"]
        empty = io.StringIO()
        assert export_results(SqliteStore(m), "no-such-run", "json", empty) == 0 and json.loads(empty.getvalue()) == []


def test_csv_export_flattens_every_group(manifest_path):
    with Manifest(manifest_path) as m:
        out = io.StringIO()
        assert export_results(SqliteStore(m), "run-1", "csv", out) == 2
        benchmark_rows = m.benchmarks("run-1")
    reader = csv.DictReader(io.StringIO(out.getvalue()))
    assert reader.fieldnames == csv_columns()
    rows = list(reader)
    assert len(rows) == 2
    row = rows[0]
    assert row["id"] == benchmark_rows[0]["id"] and row["run_id"] == "run-1"
    assert row["hardware.gpu_name"] == "NVIDIA GeForce RTX 4090" and row["hardware.gpu_memory_mib"] == "24564"
    assert row["model.name"] == "qwen2:7b" and row["model.runtime"] == "ollama"
    assert row["test_config.prompt_types"] == "short;code"
    assert float(row["results.avg_tokens_per_second"]) == 195.3 and float(row["results.p50_ttft_ms"]) == 40.0
    assert row["gpu_stats.max_power_draw_w"] == "401.0" and row["gpu_stats.avg_memory_used_mib"] == "5420"
    assert (row["provider"], row["location"], float(row["price_per_hour"])) == ("vastai", "US-CA", 0.36)
    assert float(row["cost_per_million_tokens"]) == pytest.approx(0.36 / (4000 / 60 * 3600) * 1e6)
    assert {"hardware.cpu_model", "results.p95_latency_ms", "gpu_stats.avg_utilization_pct",
            "model.quantization"} <= set(reader.fieldnames)


def test_unknown_format_is_refused(manifest_path):
    with Manifest(manifest_path) as m, pytest.raises(ValueError, match="json, csv"):
        export_results(SqliteStore(m), None, "xml", io.StringIO())


# ------------------------------------------------------------------------ upload


async def _upload(path: Path, url: str, run_id: str | None = None):
    client = ShopperClient(url, timeout=10, token=SANDBOX_TOKEN)
    try:
        with Manifest(path) as m:
            return await upload_pending(SqliteStore(m), client, run_id)
    finally:
        await client.aclose()


def test_upload_retries_after_an_unreachable_api_and_loses_nothing(manifest_path):
    with Manifest(manifest_path) as m:
        assert m.request_uploads() == 3
        ids = [row["id"] for row in m.pending_uploads()]

    uploaded, failed = asyncio.run(_upload(manifest_path, f"http://127.0.0.1:{closed_port()}"))
    assert uploaded == [] and sorted(failed) == sorted(ids)
    assert all("failed" in error for error in failed.values())
    with Manifest(manifest_path) as m:
        rows = {row["id"]: row for row in m.benchmarks()}
        assert all(rows[i]["upload_status"] == "failed" and rows[i]["upload_error"] for i in ids)
        assert [row["id"] for row in m.pending_uploads()] == ids  # still to do

    with SandboxThread(time_scale=0.01) as sandbox:
        uploaded, failed = asyncio.run(_upload(manifest_path, sandbox.url))
        listed = httpx.get(f"{sandbox.url}/api/v1/benchmarks", headers=SANDBOX_AUTH, timeout=10).json()
        assert uploaded == ids and failed == {}
        again = asyncio.run(_upload(manifest_path, sandbox.url))
        assert again == ([], {})  # nothing is uploaded twice

    assert listed["count"] == 3
    with Manifest(manifest_path) as m:
        rows = m.benchmarks()
        assert m.pending_uploads() == []
        assert all(row["upload_status"] == "uploaded" and row["uploaded_at"] and row["upload_error"] is None
                   for row in rows)
        remote_ids = {row["remote_id"] for row in rows}
        stored = {row["remote_id"]: json.loads(row["result_json"]) for row in rows}
    server = {b["id"]: b for b in listed["benchmarks"]}
    assert set(server) == remote_ids
    for remote_id, result in stored.items():
        assert server[remote_id]["results"]["avg_tokens_per_second"] == result["results"]["avg_tokens_per_second"]
        assert server[remote_id]["gpu_stats"] == result["gpu_stats"]
        assert server[remote_id]["model"]["name"] == result["model"]["name"]


def test_one_refused_result_does_not_stop_the_others(manifest_path):
    with Manifest(manifest_path) as m:
        m.request_uploads("run-1")
        first, second = (row["id"] for row in m.pending_uploads())
        # Go refuses a string where it wants a number; another row is not JSON at all.
        broken = json.loads(m.benchmark(first)["result_json"])
        broken["price_per_hour"] = "cheap"
        m.db["benchmarks"].update(first, {"result_json": json.dumps(broken)})
        m.request_uploads("run-2")
        third = m.benchmarks("run-2")[0]["id"]
        m.db["benchmarks"].update(third, {"result_json": "{not json"})

    with SandboxThread(time_scale=0.01) as sandbox:
        uploaded, failed = asyncio.run(_upload(manifest_path, sandbox.url))
        count = httpx.get(f"{sandbox.url}/api/v1/benchmarks", headers=SANDBOX_AUTH, timeout=10).json()["count"]
    assert uploaded == [second] and count == 1
    assert "API answered 400" in failed[first] and "price_per_hour" in failed[first]
    assert "the stored result is not a JSON object" in failed[third]  # unreadable JSON reads as none
    with Manifest(manifest_path) as m:
        assert {row["id"] for row in m.pending_uploads()} == {first, third}


# --------------------------------------------------------------------------- CLI


def test_cli_export_to_a_file_and_stdout(manifest_path, tmp_path, capsys):
    target = tmp_path / "out" / "results.csv"
    assert main(["export", "--format", "csv", "--store", str(manifest_path), "-o", str(target)]) == 0
    assert len(list(csv.DictReader(target.open()))) == 3
    assert "exported 3 results of all runs" in capsys.readouterr().err
    assert main(["export", "--store", str(manifest_path), "--run", "last"]) == 0
    captured = capsys.readouterr()
    assert [r["results"]["avg_tokens_per_second"] for r in json.loads(captured.out)] == [180.1]
    assert "of run run-2" in captured.err


def test_cli_finds_the_manifest_like_the_plugin(manifest_path, monkeypatch, capsys):
    monkeypatch.chdir(manifest_path.parent.parent)  # reports/manifest.db
    monkeypatch.delenv("GPUBENCH_STORE", raising=False)
    monkeypatch.delenv("GPUBENCH_REPORTS", raising=False)
    assert main(["export", "--run", "run-1"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    monkeypatch.setenv("GPUBENCH_STORE", str(manifest_path.parent / "elsewhere.db"))
    assert main(["export"]) == 2
    assert "no manifest at" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["export", "--store", "{missing}"], "no manifest at {missing}"),
    (["upload", "--store", "{missing}"], "no manifest at {missing}"),
    (["export", "--store", "{manifest}", "--run", "run-9"], "no run 'run-9' in the manifest"),
    (["upload", "--store", "{manifest}", "--run", "run-9"], "most recent first: run-2, run-1"),
])
def test_cli_usage_problems_are_one_line_and_exit_2(manifest_path, tmp_path, capsys, args, message):
    names = {"missing": str(tmp_path / "nope.db"), "manifest": str(manifest_path)}
    assert main([a.format(**names) for a in args]) == 2
    err = capsys.readouterr().err
    assert message.format(**names) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "nope.db").exists()  # looking did not create one


def test_cli_missing_manifest_in_a_real_process(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "upload", "--store",
                           str(tmp_path / "none.db")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.startswith("gpubench upload: error: no manifest at") and "Traceback" not in done.stderr


def test_cli_upload_unreachable_then_through(manifest_path, monkeypatch, capsys):
    down = f"http://127.0.0.1:{closed_port()}"
    assert main(["upload", "--store", str(manifest_path)]) == 0  # nothing asked for yet
    assert "nothing to upload" in capsys.readouterr().err

    assert main(["upload", "--store", str(manifest_path), "--run", "run-1", "--api", down]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpubench upload: error: no GPU Shopper API answers at {down}")
    assert "stay pending" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with Manifest(manifest_path) as m:
        assert len(m.pending_uploads("run-1")) == 2 and m.pending_uploads("run-2") == []

    with SandboxThread(time_scale=0.01) as sandbox:
        monkeypatch.setenv("GPUBENCH_API_BASE", sandbox.url)
        monkeypatch.setenv("GPUBENCH_API_TOKEN", sandbox.token)
        assert main(["upload", "--store", str(manifest_path)]) == 0  # retries what run-1 asked for
        err = capsys.readouterr().err
        assert f"uploaded 2 of 2 results to {sandbox.url}" in err
        assert main(["upload", "--store", str(manifest_path), "--run", "last"]) == 0
        assert "uploaded 1 of 1 result to" in capsys.readouterr().err
        listed = httpx.get(f"{sandbox.url}/api/v1/benchmarks", headers=SANDBOX_AUTH, timeout=10).json()
    assert listed["count"] == 3
    with Manifest(manifest_path) as m:
        assert {row["remote_id"] for row in m.benchmarks()} == {b["id"] for b in listed["benchmarks"]}


def test_cli_upload_reports_refused_results_and_exits_1(manifest_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUBENCH_API_TOKEN", SANDBOX_TOKEN)
    with Manifest(manifest_path) as m:
        m.request_uploads("run-2")
        bad = m.benchmarks("run-2")[0]["id"]
        m.db["benchmarks"].update(bad, {"result_json": json.dumps({"price_per_hour": "cheap"})})
    with SandboxThread(time_scale=0.01) as sandbox:
        assert main(["upload", "--store", str(manifest_path), "--api", sandbox.url]) == 1
    err = capsys.readouterr().err
    assert f"failed {bad}: API answered 400" in err
    assert "uploaded 0 of 1 result" in err and "1 failed and stay pending" in err


def test_sandbox_command_still_dispatches(capsys):
    with pytest.raises(SystemExit) as info:
        main(["sandbox", "--help"])
    assert info.value.code == 0
    assert "--port" in capsys.readouterr().out


def test_help_lists_the_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "export" in out and "upload" in out and "sandbox" in out
