"""GPU microbenchmark cells on the sandbox, end to end: offer -> session -> SSH -> torch (the
instance's, or a venv pip installs when the instance has none) -> the figures the catalog's
``microbench:`` line says, stored per figure with the cell's outcome, every session released."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import sqlite_utils

from e2e_helpers import assert_every_session_released, manifest_rows, run_pytest
from pytest_gpubench.sandbox.catalog import load_catalog

MATRIX = """
matrix:
  - {gpu: RTX 3090, provider: vastai, microbench: {runs: 3, warmup: 1, memory_mib: 64, matmul_size: 1024}}
  - {gpu: RTX 4090, provider: vastai, offer: {max_price: 0.115},
     microbench: {kinds: [memory_bandwidth, matmul], precisions: [fp16, fp8], runs: 3, warmup: 1, memory_mib: 64,
                  matmul_size: 1024}}
"""


def figures(tmp_path: Path) -> dict[tuple[str, str], dict]:
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    return {(row["gpu_type"], row["label"]): row for row in db["microbench_figures"].rows}


def test_microbench_cells_measure_the_catalog_figures_with_torch_there_or_installed_in_a_venv(
        tmp_path: Path, standalone_sandbox: str) -> None:
    url = standalone_sandbox
    # The cheapest RTX 4090 offer boots without torch: the venv install path runs (offline, local wheel).
    httpx.post(f"{url}/sandbox/faults", json={"fault": "missing_tools", "offer_id": "vastai-18430205",
                                              "tools": ["torch"]}).raise_for_status()
    matrix = tmp_path / "gpubench_micro.yaml"
    matrix.write_text(MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs")
    assert done.returncode == 0, done.stdout[-4000:]
    rows = {row["cell_id"]: row for row in manifest_rows(tmp_path)}
    assert {k: v["status"] for k, v in rows.items()} == {"RTX_3090-vastai-microbench": "success",
                                                         "RTX_4090-vastai-microbench": "success"}
    catalog = load_catalog()
    measured = figures(tmp_path)
    for gpu, labels in (("RTX 3090", ["memory_bandwidth", "matmul_fp32", "matmul_tf32", "matmul_fp16",
                                      "matmul_bf16", "matmul_int8"]),
                        ("RTX 4090", ["memory_bandwidth", "matmul_fp16", "matmul_fp8"])):
        rates = catalog.gpus[gpu].microbench
        for label in labels:
            row = measured[gpu, label]
            expected = rates.memory_gb_per_s if label == "memory_bandwidth" else rates.tflops[label.split("_")[1]]
            # Timed with CUDA events on the stand-in's device clock: the catalog figure, within its 1% jitter.
            assert row["value"] == pytest.approx(expected, rel=0.011), (gpu, label)
            assert row["n"] == 3 and len(json.loads(row["values_json"])) == 3 and row["ci_low"] <= row["value"]
    # The RTX 3090 (compute capability 8.6) has no FP8 path: skipped with the reason, not failed.
    assert measured["RTX 3090", "matmul_fp8"]["value"] is None
    assert "8.9" in measured["RTX 3090", "matmul_fp8"]["skipped"]
    logs = {path.stem: path.read_text() for path in (tmp_path / "reports" / "progress").glob("*/*.log")}
    assert "STATUS: TORCH_READY" in logs["RTX_3090-vastai-microbench"]
    assert "installed_now=false" in logs["RTX_3090-vastai-microbench"].lower()
    assert "torch-venv/bin/python" in logs["RTX_4090-vastai-microbench"]
    assert "installed_now=true" in logs["RTX_4090-vastai-microbench"].lower()
    assert "figure=matmul_fp16" in logs["RTX_4090-vastai-microbench"]
    assert "pct_of_peak=" in logs["RTX_4090-vastai-microbench"]
    assert_every_session_released(url)


def test_a_microbench_cell_whose_gpu_measures_nothing_fails_at_benchmark(tmp_path: Path, standalone_sandbox: str) -> None:
    matrix = tmp_path / "gpubench_micro_fp8.yaml"
    # An A100 (8.0) has no FP8: asked for FP8 alone, nothing can be measured.
    matrix.write_text("matrix:\n  - {gpu: A100 80GB, provider: vastai, microbench: {kinds: [matmul], "
                      "precisions: [fp8], runs: 2, warmup: 0, matmul_size: 256}}\n")
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path))
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["failure_stage"]) == ("failed", "benchmark")
    assert "no microbenchmark figure could be measured (matmul_fp8:" in row["error_message"]
    assert "[benchmark] no microbenchmark figure" in done.stdout
    (skipped,) = figures(tmp_path).values()  # what was found is kept with the failure
    assert skipped["label"] == "matmul_fp8" and skipped["value"] is None
    assert_every_session_released(standalone_sandbox)
