"""GPU microbenchmark cells on the sandbox, end to end: offer -> session -> SSH -> torch (the
instance's, or a venv pip installs when the instance has none) -> the figures the catalog's
``microbench:`` line says, stored per figure with the cell's outcome, every session released."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlite_utils

from e2e_helpers import SANDBOX_AUTH, assert_every_session_released, manifest_rows, run_pytest
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.hosts import HostPlan, SandboxHostsThread
from pytest_gpubench.store.sqlite_store import SqliteStore

SETTINGS = "runs: 3, warmup: 1, memory_mib: 64, matmul_size: 1024"


def figures(tmp_path: Path) -> dict[tuple[str, str], dict]:
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    return {(row["gpu_type"], row["label"]): row for row in db["microbench_figures"].rows}


def run_matrix(tmp_path: Path, url: str, text: str, *args: str, scale: float = 0.02):
    matrix = tmp_path / "gpubench_micro.yaml"
    matrix.write_text(text)
    return run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", str(scale),
                      "--rootdir", str(tmp_path), "-rs", *args)


def assert_catalog_figures(tmp_path: Path, gpu: str, labels: list[str]) -> None:
    """Timed with CUDA events on the stand-in's device clock: each the catalog figure, within its 1% jitter."""
    rates, measured = load_catalog().gpus[gpu].microbench, figures(tmp_path)
    for label in labels:
        row = measured[gpu, label]
        expected = rates.memory_gb_per_s if label == "memory_bandwidth" else rates.tflops[label.split("_")[1]]
        assert row["value"] == pytest.approx(expected, rel=0.011), (gpu, label)
        assert row["n"] == 3 and len(json.loads(row["values_json"])) == 3 and row["ci_low"] <= row["value"]


def progress_log(tmp_path: Path, cell: str) -> str:
    (path,) = (tmp_path / "reports" / "progress").glob(f"*/{cell}.log")
    return path.read_text()


def test_a_microbench_cell_measures_the_catalog_figures_with_the_instances_torch(
        tmp_path: Path, standalone_sandbox: str) -> None:
    done = run_matrix(tmp_path, standalone_sandbox,
                      f"matrix:\n  - {{gpu: RTX 3090, provider: vastai, microbench: {{{SETTINGS}}}}}\n",
                      "--junitxml", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout[-4000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["cell_id"], row["status"], row["model"]) == ("RTX_3090-vastai-microbench", "success", "microbench")
    assert_catalog_figures(tmp_path, "RTX 3090", ["memory_bandwidth", "matmul_fp32", "matmul_tf32", "matmul_fp16",
                                                  "matmul_bf16", "matmul_int8"])
    # The RTX 3090 (compute capability 8.6) has no FP8 path: skipped with the reason, not failed.
    fp8 = figures(tmp_path)["RTX 3090", "matmul_fp8"]
    assert fp8["value"] is None and "8.9" in fp8["skipped"]
    log = progress_log(tmp_path, "RTX_3090-vastai-microbench")
    assert "STATUS: TORCH_READY" in log and "installed_now=false" in log.lower()
    assert "figure=memory_bandwidth" in log and "pct_of_peak=" in log
    # The report shows them against the RTX 3090's datasheet (936 GB/s): about 830 GB/s is about 89% of it.
    with SqliteStore.open(tmp_path / "reports" / "manifest.db") as store:
        markdown = render_markdown(build_report(store))
    memory = figures(tmp_path)["RTX 3090", "memory_bandwidth"]["value"]
    assert "## GPU microbenchmarks" in markdown and "| RTX 3090 | vastai | memory\\_bandwidth |" in markdown
    assert f"| {100 * memory / 936:.0f}% |" in markdown and 87.5 < 100 * memory / 936 < 89.8
    # JUnit carries each measured figure, for CI to gate on.
    junit = (tmp_path / "junit.xml").read_text()
    assert 'name="gpubench_microbench_memory_bandwidth" value="8' in junit
    assert "gpubench_microbench_matmul_fp8" not in junit  # skipped: no figure
    # nvidia-smi sampled the GPU while it measured: the samples are the cell's (no result to hang them on).
    samples = list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["gpu_samples"].rows)
    assert samples and {s["manifest_id"] for s in samples} == {row["id"]}
    assert all(s["benchmark_id"] is None and s["gpu"] == 0 and s["power_draw_w"] > 0 for s in samples)
    assert_every_session_released(standalone_sandbox)


@pytest.mark.slow
def test_an_instance_without_torch_gets_it_in_a_venv_within_the_install_stage(
        tmp_path: Path, standalone_sandbox: str) -> None:
    url = standalone_sandbox
    # The cheapest RTX 4090 offer boots without torch: python3 -m venv and pip install torch (offline, the
    # sandbox's local wheel of the stand-in) run at stage runtime_setup.
    httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
               json={"fault": "missing_tools", "offer_id": "vastai-18430205",
                                              "tools": ["torch"]}).raise_for_status()
    done = run_matrix(tmp_path, url, "matrix:\n  - {gpu: RTX 4090, provider: vastai, offer: {max_price: 0.115}, "
                                     f"microbench: {{precisions: [fp16, fp8], {SETTINGS}}}}}\n",
                      scale=0.1)  # the plugin's clock: 30 s for the venv and pip on a loaded machine
    assert done.returncode == 0, done.stdout[-4000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "success"
    assert_catalog_figures(tmp_path, "RTX 4090", ["memory_bandwidth", "matmul_fp16", "matmul_fp8"])
    log = progress_log(tmp_path, "RTX_4090-vastai-microbench")
    assert "torch-venv/bin/python" in log and "installed_now=true" in log.lower()
    assert_every_session_released(url)


def test_a_microbench_cell_whose_gpu_measures_nothing_fails_at_benchmark(
        tmp_path: Path, standalone_sandbox: str) -> None:
    # An A100 (8.0) has no FP8: asked for FP8 alone, nothing can be measured.
    done = run_matrix(tmp_path, standalone_sandbox, "matrix:\n  - {gpu: A100 80GB, provider: vastai, microbench: "
                                                    "{kinds: [matmul], precisions: [fp8], runs: 2, warmup: 0, "
                                                    "matmul_size: 256}}\n")
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "benchmark")
    assert "no microbenchmark figure could be measured (matmul_fp8:" in row["error_message"]
    assert "[benchmark] no microbenchmark figure" in done.stdout
    (skipped,) = figures(tmp_path).values()  # what was found is kept with the failure
    assert skipped["label"] == "matmul_fp8" and skipped["value"] is None
    assert_every_session_released(standalone_sandbox)


@pytest.fixture
def two_gpu_host(tmp_path: Path) -> Iterator[SandboxHostsThread]:
    """A sandbox machine ``duo`` with two RTX 4090s, reached over SSH on loopback."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("duo", gpus=2)])
    machines.start()
    yield machines
    machines.stop()


@pytest.mark.slow
def test_a_microbench_cell_on_a_two_gpu_host_leases_one_gpu_and_measures_that_one(
        tmp_path: Path, two_gpu_host: SandboxHostsThread) -> None:
    """The microbenchmark leases one GPU of the machine (not the whole of it, as an Ollama cell would)
    and runs with CUDA_VISIBLE_DEVICES set to it, so torch's cuda:0 is the leased GPU."""
    path = tmp_path / "gpubench_duo.yaml"
    path.write_text(f"cloud: hosts\nhosts: {two_gpu_host.hosts.inventory}\nmatrix:\n"
                    f"  - {{gpu: RTX 4090, provider: duo, microbench: {{{SETTINGS}, precisions: [fp16]}}}}\n")
    done = run_pytest(tmp_path, str(path), "--gpubench-known-hosts", str(tmp_path / "kh"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "success"
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (held,) = db["gpu_leases"].rows
    (log,) = [p.read_text() for p in (tmp_path / "reports" / "progress").rglob("*.log")]
    assert f"visible_devices={held['gpu_index']}" in log, log
    # Which machine it was, not only the row's provider.
    (system,) = db["systems"].rows
    assert (system["provider"], system["machine"]) == ("duo", "duo")


def test_a_microbench_cell_asking_for_a_runtime_fails_at_its_stage_naming_the_fixture(
        tmp_path: Path, standalone_sandbox: str) -> None:
    matrix = tmp_path / "gpubench_micro.yaml"
    matrix.write_text(f"matrix:\n  - {{gpu: RTX 3090, provider: vastai, microbench: {{{SETTINGS}}}}}\n")
    test_file = tmp_path / "test_mine.py"
    test_file.write_text(f"import pytest\n\n\n@pytest.mark.gpubench({str(matrix)!r})\n"
                         "def test_serving(gpu_runtime):\n    pass\n")
    done = run_pytest(tmp_path, str(test_file), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale",
                      "0.02", "--rootdir", str(tmp_path))
    assert done.returncode == 1, done.stdout[-4000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "runtime_setup")
    assert "microbenchmark cell" in row["error_message"] and "gpubench_microbench" in row["error_message"]
    assert_every_session_released(standalone_sandbox)
