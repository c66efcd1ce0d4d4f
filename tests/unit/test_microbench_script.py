"""The microbenchmark script's math (remote/microbench_script.py) with the sandbox's stand-in torch
as the fake (its operations take the time the instance file's figures say), the statistics its
events become (measure/microbench.py), and the datasheet peaks they are a percentage of."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from pytest_gpubench.measure import microbench as gpu_peaks
from pytest_gpubench.measure.microbench import figures_from_events
from pytest_gpubench.remote import microbench_script as script

STANDIN = Path(__file__).resolve().parents[2] / "pytest_gpubench" / "sandbox" / "torch_standin.py"
FIGURES = {"memory_gb_per_s": 800.0, "tflops": {"fp32": 40.0, "tf32": 60.0, "fp16": 120.0, "bf16": 118.0,
                                                 "fp8": 250.0, "int8": 500.0}}
PLAN = {"kinds": ["memory_bandwidth", "matmul"], "runs": 5, "warmup": 2, "memory_mib": 64, "matmul_size": 1024,
        "precisions": ["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]}


def fake_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capability: str = "8.9", figures=FIGURES):
    instance = tmp_path / "instance.json"
    instance.write_text(json.dumps({"time_scale": 0, "gpu": {"name": "NVIDIA GeForce RTX 4090",
                                                             "compute_capability": capability,
                                                             "microbench": figures}}))
    monkeypatch.setenv("GPUBENCH_SANDBOX_INSTANCE", str(instance))
    spec = importlib.util.spec_from_file_location("torch", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "torch", module)
    return module


def run_script(capsys: pytest.CaptureFixture[str], plan=PLAN) -> list[dict]:
    assert script.main(["-", json.dumps(plan)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_formulas_count_a_copy_as_read_plus_write_and_a_matmul_as_two_n_cubed() -> None:
    assert script.bandwidth_gb_per_s(1_000_000_000, 1000.0) == pytest.approx(2.0)
    assert script.matmul_tflops(1000, 1.0) == pytest.approx(2.0)


def test_every_figure_comes_back_within_the_standins_jitter(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_torch(tmp_path, monkeypatch)
    events = run_script(capsys)
    assert events[0] == {"event": "device", "name": "NVIDIA GeForce RTX 4090", "capability": [8, 9],
                         "torch": "2.5.1+gpubench.sandbox", "visible_devices": ""}
    assert events[-1] == {"event": "done"}
    figures = {(e["kind"], e["precision"]): e for e in events if e["event"] == "figure"}
    memory = figures["memory_bandwidth", None]
    assert memory["unit"] == "GB/s" and len(memory["values"]) == 5
    assert all(v == pytest.approx(800.0, rel=0.011) for v in memory["values"])
    for precision, expected in FIGURES["tflops"].items():
        event = figures["matmul", precision]
        assert event["unit"] == ("TOPS" if precision == "int8" else "TFLOPS")
        assert all(v == pytest.approx(expected, rel=0.011) for v in event["values"]), precision
    assert len(set(memory["values"])) > 1  # runs differ, as real ones do


def test_a_precision_below_the_compute_capability_is_skipped_with_the_reason(tmp_path, monkeypatch, capsys) -> None:
    fake_torch(tmp_path, monkeypatch, capability="8.6")  # an RTX 3090: no FP8
    events = run_script(capsys, {**PLAN, "kinds": ["matmul"]})
    skipped = [e for e in events if e["event"] == "skipped"]
    assert [(e["precision"], "8.9" in e["reason"]) for e in skipped] == [("fp8", True)]


def test_a_precision_torch_refuses_is_skipped_by_trying(tmp_path, monkeypatch, capsys) -> None:
    figures = {**FIGURES, "tflops": {k: v for k, v in FIGURES["tflops"].items() if k != "int8"}}
    fake_torch(tmp_path, monkeypatch, figures=figures)
    events = run_script(capsys, {**PLAN, "kinds": ["matmul"], "precisions": ["fp16", "int8"]})
    (skipped,) = [e for e in events if e["event"] == "skipped"]
    assert skipped["precision"] == "int8" and skipped["reason"].startswith("torch could not run it: CUDA error")
    assert [e["precision"] for e in events if e["event"] == "figure"] == ["fp16"]


def test_a_copy_torch_cannot_run_is_skipped_with_its_reason(tmp_path, monkeypatch, capsys) -> None:
    fake_torch(tmp_path, monkeypatch, figures={"tflops": {"fp16": 100.0}})  # a catalog line without memory
    events = run_script(capsys, {**PLAN, "precisions": ["fp16"]})
    skipped = next(e for e in events if e["event"] == "skipped")
    assert skipped["kind"] == "memory_bandwidth" and skipped["reason"].startswith("torch could not run it: CUDA error")
    assert [e["precision"] for e in events if e["event"] == "figure"] == ["fp16"] and events[-1]["event"] == "done"


def test_no_cuda_device_is_an_error_event_and_exit_status_3(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("GPUBENCH_SANDBOX_INSTANCE", raising=False)
    spec = importlib.util.spec_from_file_location("torch", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "torch", module)
    assert script.main(["-", json.dumps(PLAN)]) == 3
    (event,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert event["event"] == "error" and "no CUDA device" in event["message"]


def test_the_script_measures_the_gpu_cuda_visible_devices_names_and_says_which(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    fake_torch(tmp_path, monkeypatch)
    device = run_script(capsys, {**PLAN, "kinds": ["memory_bandwidth"]})[0]
    assert (device["event"], device["visible_devices"]) == ("device", "0")
    assert figures_from_events([device]).visible_devices == "0"
    # GPU 1 of a one-GPU instance: CUDA enumerates nothing, as on a real machine.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake_torch(tmp_path, monkeypatch)
    assert script.main(["-", json.dumps(PLAN)]) == 3
    assert "no CUDA device" in capsys.readouterr().out


def test_events_become_statistics_and_percent_of_the_datasheet_peak(tmp_path, monkeypatch, capsys) -> None:
    fake_torch(tmp_path, monkeypatch, capability="8.6", figures=FIGURES)
    run = figures_from_events(run_script(capsys))
    assert (run.device, run.capability) == ("NVIDIA GeForce RTX 4090", "8.6")
    by_label = {figure.label: figure for figure in run.figures}
    memory = by_label["memory_bandwidth"]
    assert memory.stats.n == 5 and memory.stats.mean == pytest.approx(800.0, rel=0.011)
    assert memory.stats.ci_low <= memory.stats.mean <= memory.stats.ci_high and memory.stats.std > 0
    # RTX 4090: 1008 GB/s and 165.2 FP16 TFLOPS on its datasheet.
    assert memory.percent_of_peak("RTX 4090") == pytest.approx(100 * memory.value / 1008)
    assert by_label["matmul_fp16"].percent_of_peak("rtx4090") == pytest.approx(100 * by_label["matmul_fp16"].value
                                                                                / 165.2)
    assert by_label["matmul_fp8"].skipped and by_label["matmul_fp8"].value is None
    assert by_label["matmul_fp8"].percent_of_peak("RTX 4090") is None
    assert memory.percent_of_peak("Some Unknown GPU") is None


def test_a_figure_event_without_runs_is_kept_as_skipped_not_averaged_as_zero() -> None:
    run = figures_from_events([{"event": "figure", "kind": "matmul", "precision": "fp16", "unit": "TFLOPS",
                                "values": []}])
    assert run.figures[0].value is None and "no usable run" in run.figures[0].skipped


def test_every_known_gpu_has_a_sourced_peak_for_memory_and_fp32() -> None:
    names = {entry.gpu for entry in gpu_peaks.PEAKS}
    assert {"RTX 3090", "RTX 4090", "RTX 5090", "A100 80GB", "H200 NVL", "RTX 5060 Ti", "RTX 5070",
            "H100 SXM", "H100 PCIe", "H200 SXM"} <= names
    for entry in gpu_peaks.PEAKS:
        assert entry.source.startswith(("https://www.nvidia.com/", "https://images.nvidia",
                                        "https://resources.nvidia.com/"))
        assert entry.memory_gb_per_s > 0 and entry.tflops["fp32"] > 0
        assert set(entry.tflops) <= set(gpu_peaks.PRECISIONS)
    assert "fp8" not in gpu_peaks.peaks_for("A100 80GB").tflops  # Ampere has no FP8 path
