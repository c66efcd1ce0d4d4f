"""End to end on the sandbox: pytest as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from e2e_helpers import QUICK, REPO, SANDBOX_AUTH, SEED, manifest_rows, pytest_env, run_pytest, sandbox_sessions
from polling import wait_for

from pytest_gpubench.store.progress import read_progress
from pytest_gpubench.sandbox.catalog import load_catalog


@pytest.mark.slow
def test_quick_matrix_with_xdist_records_everything(tmp_path):
    junit = tmp_path / "junit.xml"
    done = run_pytest(tmp_path, str(QUICK), "-n", "4", "--gpubench-sandbox", "--junitxml", str(junit))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout
    # The figures say they are the sandbox's (and the benchmarks ran on its clock).
    assert "gpubench summary: SANDBOX figures (emulated GPUs, benchmarks on its clock x0.02)" in done.stdout
    # Live progress reached the terminal from the workers.
    assert "PROGRESS: stage=model_pull" in done.stdout and "PROGRESS: requests=" in done.stdout

    rows = manifest_rows(tmp_path)
    assert len(rows) == 4 and len({r["id"] for r in rows}) == 4  # none lost, none twice
    assert len({r["run_id"] for r in rows}) == 1  # one run id across the workers
    assert len({r["worker"] for r in rows}) > 1  # really spread over workers
    catalog = load_catalog()
    for row in rows:
        assert row["status"] == "success", row
        assert row["session_status"] == "stopped"  # released, and the API says so
        assert row["session_id"] and row["offer_id"] and row["price_per_hour"] > 0
        assert row["cost_usd"] > 0 and row["total_requests"] > 0 and row["error_count"] == 0
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    for bench in db["benchmarks"].rows:
        truth, _, _ = catalog.rate(bench["gpu_type"], bench["provider"], bench["model"])
        # The median per-request rate: robust to one burst after a stall of this shared machine.
        assert bench["p50_tokens_per_second"] == pytest.approx(truth, rel=0.03), bench["manifest_id"]

    (run,) = list(db["runs"].rows)
    assert run["run_id"] == rows[0]["run_id"] and run["status"] == "passed" and run["finished_at"]
    assert run["sandbox"] == 1
    benchmarks = list(db["benchmarks"].rows)
    assert len(benchmarks) == 4
    result = json.loads(benchmarks[0]["result_json"])
    assert set(result) >= {"hardware", "model", "test_config", "results", "gpu_stats", "provider", "price_per_hour"}
    assert result["hardware"]["gpu_name"].startswith("NVIDIA")
    assert result["model"]["runtime"] == "ollama" and result["model"]["runtime_version"]
    assert db["requests"].count >= sum(r["total_requests"] for r in rows)

    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    assert len(cases) == 4
    for case in cases.values():
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["gpubench_status"] == "success"
        assert props["gpubench_sandbox"] == "true"
        for name in ("gpubench_output_tokens_per_second", "gpubench_decode_tokens_per_second",
                     "gpubench_ttft_p50_ms", "gpubench_requests",
                     "gpubench_errors", "gpubench_price_per_hour", "gpubench_cost_usd",
                     "gpubench_session_id", "gpubench_offer_id"):
            assert props.get(name), (name, props)

    for row in rows:
        lines = read_progress(Path(row["progress_file"]))
        labels = [line.label for line in lines if line.kind == "STATUS"]
        # The two RTX 4090 cells share a session: the second finds it, the first keeps it for it.
        rented = row["session_turn"] in (None, 1)
        assert labels[:3] == ["STARTING", "INVENTORY_QUERY", "PROVISIONING" if rented else "SESSION_REUSED"]
        assert lines[0].fields["sandbox"] == "true" and lines[0].fields["time_scale"] == "0.02"
        for label in ("OLLAMA_INSTALLED", "MODEL_READY", "BENCHMARK_COMPLETE", "RESULTS_COLLECTED", "COMPLETED"):
            assert label in labels, (label, labels)
        assert ("SSH_READY" in labels) == rented
        assert ("CLEANUP" in labels) != ("SESSION_KEPT" in labels), labels
        assert any(line.kind == "RESULTS" for line in lines)
        assert any(line.kind == "PROGRESS" and "output_tokens_per_second" in line.fields for line in lines)
    assert sorted(row["session_turn"] for row in rows if row["session_turn"]) == [1, 2]
    assert len({row["session_id"] for row in rows}) == 3

    log = (tmp_path / "reports" / "sandbox.log").read_text()
    assert "0 left running before shutdown" in log

    # The session keys never reach an output.
    outputs = [done.stdout, done.stderr, junit.read_text()]
    outputs += [p.read_bytes().decode("utf-8", "replace") for p in (tmp_path / "reports").rglob("*") if p.is_file()]
    assert not any("PRIVATE KEY" in text for text in outputs)


@pytest.mark.slow
def test_standalone_sandbox_every_session_stopped_and_failures_recorded(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    # One cell's offer fails to provision: the cell fails at its stage, the others go on.
    # (Failover to the next offer is off here; tests/e2e/test_failover_budget.py covers it.)
    offers = httpx.get(f"{url}/api/v1/inventory", headers=SANDBOX_AUTH, params={"provider": "vastai"}).json()["offers"]
    cheapest_3090 = min((o for o in offers if o["gpu_type"] == "RTX 3090"), key=lambda o: o["price_per_hour"])
    httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
               json={"offer_id": cheapest_3090["id"], "fault": "provision_error",
                                              "message": "No available public IPs"}).raise_for_status()
    done = run_pytest(tmp_path, str(QUICK), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "-k", "3090 or 1.5b", "--gpubench-duration", "2", "--gpubench-max-attempts", "1")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "[provision] session" in done.stdout and "No available public IPs" in done.stdout
    assert "Traceback" not in done.stdout

    rows = {r["cell_id"]: r for r in manifest_rows(tmp_path)}
    assert rows["RTX_3090-vastai-qwen2:7b"]["status"] == "failed"
    assert rows["RTX_3090-vastai-qwen2:7b"]["failure_stage"] == "provision"
    assert "No available public IPs" in rows["RTX_3090-vastai-qwen2:7b"]["error_message"]
    assert rows["RTX_4090-vastai-qwen2:1.5b"]["status"] == "success"

    state = httpx.get(f"{url}/sandbox/state", headers=SANDBOX_AUTH).json()
    assert state["sessions"], "the run created sessions"
    assert {s["status"] for s in state["sessions"]} <= {"stopped", "failed"}
    consumer_ids = {s["consumer_id"] for s in state["sessions"]}
    run_id = next(iter(rows.values()))["run_id"]
    assert all(run_id in c for c in consumer_ids)  # the API alone can tell what the run owns


@pytest.mark.slow
def test_no_eligible_offer_is_skipped_with_reason(tmp_path, standalone_sandbox):
    done = run_pytest(tmp_path, str(QUICK), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--gpu", "A100 80GB", "--gpubench-max-price", "0.01", "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 skipped" in done.stdout and "3 deselected" in done.stdout
    assert "over the price cap of $0.01/h" in done.stdout
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "skipped" and "over the price cap" in row["error_message"]
    failing = run_pytest(tmp_path, str(QUICK), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale",
                         "0.02", "--gpu", "A100 80GB", "--gpubench-max-price", "0.01", "--gpubench-fail-on-skip")
    assert failing.returncode == 1 and "[inventory]" in failing.stdout


def _sshd_unavailable() -> str:
    import shutil

    if not (shutil.which("sshd") or os.access("/usr/sbin/sshd", os.X_OK)):
        return "no OpenSSH sshd on this machine (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "sshd logs in root only when it runs as root"
    return ""


@pytest.mark.slow
@pytest.mark.sshd
def test_quick_cells_through_real_openssh_sshd(tmp_path):
    """The whole cell flow against OpenSSH's sshd: key format, commands, stdin scripts, forwards."""
    reason = _sshd_unavailable()
    if reason:
        if os.environ.get("GPUBENCH_REQUIRE_SSHD") == "1":
            pytest.fail(f"GPUBENCH_REQUIRE_SSHD=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    done = run_pytest(tmp_path, str(QUICK), "-k", "4090", "-n", "2", "--gpubench-sandbox",
                      "--gpubench-sandbox-ssh", "openssh", "--gpubench-duration", "3")
    assert done.returncode == 0, done.stdout[-3000:] + (tmp_path / "reports" / "sandbox.log").read_text()[-2000:]
    rows = manifest_rows(tmp_path)
    assert len(rows) == 2 and {r["status"] for r in rows} == {"success"}
    assert {r["session_status"] for r in rows} == {"stopped"}
    catalog = load_catalog()
    for bench in sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["benchmarks"].rows:
        truth, _, _ = catalog.rate(bench["gpu_type"], bench["provider"], bench["model"])
        assert bench["p50_tokens_per_second"] == pytest.approx(truth, rel=0.03)
    assert "0 left running before shutdown" in (tmp_path / "reports" / "sandbox.log").read_text()


@pytest.mark.slow
def test_seed_matrix_passes_all_21_cells(tmp_path):
    # The README's demo, on a clock twice as fast as its default: the seed's 5-minute benchmarks take 3 s each.
    done = run_pytest(tmp_path, str(SEED), "-n", "4", "--gpubench-sandbox", "--gpubench-live", "false",
                      "--gpubench-time-scale", "0.01", timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "21 passed" in done.stdout
    rows = manifest_rows(tmp_path)
    assert len(rows) == 21 and {r["status"] for r in rows} == {"success"}
    assert {r["session_status"] for r in rows} == {"stopped"}
    # deepseek-r1:32b on a Vast.ai RTX 3090 streams 3.6 tokens/s: a 256-token answer
    # takes 71 s, so the 3 s run ends at its deadline with that request cut, not awaited.
    benchmarks = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["benchmarks"]
    slow = next(benchmarks.rows_where("gpu_type = 'RTX 3090' and provider = 'vastai' and model = ?",
                                      ["deepseek-r1:32b"]))
    metrics = json.loads(slow["details_json"])["metrics"]
    assert metrics["incomplete"] == 1 and metrics["successful"] == 0 and slow["total_tokens"] > 0
    assert slow["duration_seconds"] < 30
    assert slow["avg_tokens_per_second"] == pytest.approx(3.6, rel=0.05)




@pytest.mark.slow
def test_instance_lost_mid_benchmark_records_partial(tmp_path, standalone_sandbox):
    url = standalone_sandbox
    env = pytest_env()  # the sandbox's token
    command = [sys.executable, "-m", "pytest", str(QUICK), "-p", "no:cacheprovider", "-k", "4090 and 1.5b",
               "--gpubench-api", url, "--gpubench-time-scale", "0.02", "--gpubench-duration", "60",
               "--gpubench-progress-interval", "0.5", "--gpubench-reports", str(tmp_path / "reports"),
               "--gpubench-store", str(tmp_path / "reports" / "manifest.db")]
    run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def measuring():
            return any("PROGRESS: requests=" in p.read_text() for p in (tmp_path / "reports").rglob("*.log"))

        wait_for(measuring, 120, "the benchmark to report progress")
        (session,) = [s for s in sandbox_sessions(url) if s["status"] == "running"]
        kill = {"fault": "kill_instance", "session_id": session["id"]}
        httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH, json=kill).raise_for_status()
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, output[-3000:]
    assert "[benchmark] benchmark interrupted after" in output
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "partial" and row["failure_stage"] == "benchmark"
    assert row["total_requests"] > 0 and row["decode_tokens_per_second"] > 0  # what it measured is kept
    assert row["benchmark_id"]


@pytest.mark.slow
def test_python_test_asserts_on_the_result(tmp_path, standalone_sandbox):
    test_file = tmp_path / "test_mine.py"
    test_file.write_text(
        "import pytest\n\n"
        f"@pytest.mark.gpubench({str(QUICK)!r}, gpu='RTX4090', model='qwen2:1.5b')\n"
        "def test_fast(gpubench):\n"
        "    result = gpubench.run()\n"
        "    assert result.results.avg_tokens_per_second > 100\n"
        "    assert result.hardware.gpu_name == 'NVIDIA GeForce RTX 4090'\n\n"
        f"@pytest.mark.gpubench({str(QUICK)!r}, gpu='RTX4090', model='qwen2:1.5b')\n"
        "def test_impossible(gpubench):\n"
        "    assert gpubench.run().results.avg_tokens_per_second > 10**6\n"
    )
    done = run_pytest(tmp_path, str(test_file), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale",
                      "0.02", "--gpubench-duration", "2", "--rootdir", str(tmp_path))
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]
    rows = {r["cell_id"]: r for r in manifest_rows(tmp_path)}
    assert rows["RTX_4090-vastai-qwen2:1.5b@test_fast"]["status"] == "success"
    failed = rows["RTX_4090-vastai-qwen2:1.5b@test_impossible"]
    assert failed["status"] == "failed" and failed["failure_reason"] == "AssertionError"
    assert failed["decode_tokens_per_second"] > 100  # measured, then judged by the user's assertion
