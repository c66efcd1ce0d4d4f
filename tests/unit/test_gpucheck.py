"""The ``gpu`` tier's logic without a GPU (``pytest_gpubench.measure.gpucheck``, ``measure/microbench.py``):
NVML, ``nvidia-smi -q -x`` and the CSV query compared (the sandbox's nvidia-smi and NVML stand-ins
render the real formats), the datasheet shares and their bounds, the H100/H200 datasheet lines
and the names ``nvidia-smi`` gives those cards, the host snapshot's difference, and why a machine
cannot run the tier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
from polling import wait_for

from pytest_gpubench.measure.gpucheck import (
    SETTINGS_FIELDS,
    GpuState,
    HostSnapshot,
    compare_facts,
    gpu_absent_reason,
    host_differences,
    list_entries,
    missing_figures,
    outside_bounds,
    parse_compute_apps,
    peak_shares,
    processes_with_marker,
    query_gpu_states,
)
from pytest_gpubench.gpuinfo import gpu_type_of, parse_gpu_query_csv
from pytest_gpubench.measure.microbench import peaks_for, peaks_for_product
from pytest_gpubench.remote import nvml_probe
from pytest_gpubench.remote.sysinfo import CSV_FIELDS, gpu_facts_from_csv, gpu_facts_from_nvml, gpu_facts_from_xml
from pytest_gpubench.sandbox.instance_spec import load_instance_spec
from pytest_gpubench.sandbox.nvidia_smi_standin import one_shot
from pytest_gpubench.sandbox.pynvml_standin import FakeNvml
from standin_helpers import write_instance

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A sandbox instance's environment: its nvidia-smi and NVML stand-ins answer for an RTX 4090."""
    environ = {**os.environ, "GPUBENCH_SANDBOX_INSTANCE": str(write_instance(tmp_path / "instance"))}
    monkeypatch.setenv("GPUBENCH_SANDBOX_INSTANCE", environ["GPUBENCH_SANDBOX_INSTANCE"])
    return environ


def smi(environ: dict[str, str], *args: str) -> str:
    answer = one_shot(list(args), environ)
    assert answer.status == 0, answer.stdout
    return answer.stdout


def nvml_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The shipped ``nvml_probe.py`` against the stand-in's NVML (nvidia-ml-py's functions and units)."""
    module = types.ModuleType("pynvml")
    module.__dict__.update(FakeNvml(load_instance_spec()).functions())
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert nvml_probe.main() == 0
    return capsys.readouterr().out


def three_sources(environ, monkeypatch, capsys, *, xml_edit=lambda text: text, csv_edit=lambda text: text):
    fields = list(CSV_FIELDS)
    csv = csv_edit(smi(environ, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"))
    return (gpu_facts_from_nvml(nvml_json(monkeypatch, capsys)),
            gpu_facts_from_xml(xml_edit(smi(environ, "-q", "-x"))),
            gpu_facts_from_csv(parse_gpu_query_csv(csv, fields), "12.4"))


# ----------------------------------------------------------------- sources agree


def test_nvml_the_xml_log_and_the_csv_query_of_one_machine_agree(machine, monkeypatch, capsys) -> None:
    nvml, xml, csv = three_sources(machine, monkeypatch, capsys)
    assert nvml is not None and nvml.gpus[0].name == "NVIDIA GeForce RTX 4090"
    for facts in (nvml, xml, csv):
        assert missing_figures(facts) == [], facts.source
    assert compare_facts(nvml, xml) == [] and compare_facts(nvml, csv) == []


def test_a_disagreement_is_named_with_both_values(machine, monkeypatch, capsys) -> None:
    nvml, xml, csv = three_sources(
        machine, monkeypatch, capsys,
        xml_edit=lambda text: text.replace("<current_power_limit>450.00 W", "<current_power_limit>400.00 W")
        .replace("<driver_version>550.54.15", "<driver_version>550.54.14"),
        csv_edit=lambda text: text.replace("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4080"))
    assert compare_facts(nvml, xml) == [
        "nvidia-smi-xml vs nvml: driver_version '550.54.14' against '550.54.15'",
        "nvidia-smi-xml vs nvml: GPU 0 power_limit_w 400.0 against 450.0"]
    assert compare_facts(nvml, csv) == [
        "nvidia-smi-csv vs nvml: GPU 0 name 'NVIDIA GeForce RTX 4080' against 'NVIDIA GeForce RTX 4090'"]


def test_units_and_spellings_of_one_value_are_not_differences(machine, monkeypatch, capsys) -> None:
    """NVML's milliwatts and bytes against nvidia-smi's two-decimal watts and MiB; an old driver's
    4-digit PCI domain; a figure one source cannot give ([N/A]) is not compared, but reported missing."""
    nvml, xml, csv = three_sources(
        machine, monkeypatch, capsys,
        xml_edit=lambda text: text.replace("<pci_bus_id>00000000:", "<pci_bus_id>0000:"),
        csv_edit=lambda text: text.replace(", 450.00", ", 450.30").replace(", 24564,", ", [N/A],"))
    assert compare_facts(nvml, xml) == [] and compare_facts(nvml, csv) == []
    assert missing_figures(csv) == ["GPU 0: memory_total_mib"]


def test_a_source_that_lists_another_number_of_gpus_differs(machine, monkeypatch, capsys) -> None:
    nvml, xml, _ = three_sources(machine, monkeypatch, capsys)
    empty = xml.model_copy(update={"gpus": ()})
    assert compare_facts(nvml, empty) == ["nvidia-smi-xml vs nvml: 0 GPUs against 1"]


# --------------------------------------------------------- against the datasheet


def test_h100_and_h200_datasheet_lines_under_the_names_nvidia_smi_gives_them() -> None:
    sxm, pcie, h200 = (peaks_for_product("NVIDIA H100 80GB HBM3"), peaks_for_product("NVIDIA H100 PCIe"),
                       peaks_for_product("NVIDIA H200"))
    assert (sxm.gpu, sxm.memory_gb_per_s, sxm.tflops["bf16"], sxm.tflops["fp16"]) == ("H100 SXM", 3350, 989.4, 989.4)
    assert (pcie.gpu, pcie.memory_gb_per_s, pcie.tflops["bf16"]) == ("H100 PCIe", 2000, 756.0)
    assert (h200.gpu, h200.memory_gb_per_s, h200.tflops["bf16"]) == ("H200 SXM", 4800, 989.5)
    assert peaks_for_product("NVIDIA H200 NVL").gpu == "H200 NVL"
    assert peaks_for_product("NVIDIA GeForce RTX 4090").gpu == "RTX 4090"
    assert peaks_for_product("NVIDIA A100-SXM4-80GB").gpu == "A100 80GB"
    assert peaks_for_product("NVIDIA A10") is None
    # A `cloud: local` cell's GPU is gpu_type_of(nvidia-smi's name): its % of peak finds the same line,
    # except where that name is ambiguous (clouds say "H100" of the SXM and the PCIe card alike).
    assert peaks_for(gpu_type_of("NVIDIA H200")) == h200
    assert peaks_for(gpu_type_of("NVIDIA H100 80GB HBM3")) == sxm
    assert peaks_for(gpu_type_of("NVIDIA H100 PCIe")) is None


def _figure(label: str, value: float | None, unit: str = "TFLOPS") -> types.SimpleNamespace:
    kind, _, precision = label.partition("_")
    if label == "memory_bandwidth":
        kind, precision = label, None
    return types.SimpleNamespace(label=label, kind=kind, precision=precision or None, value=value, unit=unit)


def test_figures_as_shares_of_the_peak_inside_and_outside_their_bounds() -> None:
    peaks = peaks_for("H100 SXM")
    shares = peak_shares([_figure("memory_bandwidth", 2800.0, "GB/s"), _figure("matmul_bf16", 700.0),
                          _figure("matmul_fp16", 1100.0), _figure("matmul_fp8", None)], peaks)
    assert [share.label for share in shares] == ["memory_bandwidth", "matmul_bf16", "matmul_fp16"]  # fp8 skipped
    assert shares[0].line() == "memory_bandwidth: 2800.0 GB/s = 83.6% of 3350"
    assert round(shares[1].share, 3) == 0.707
    assert outside_bounds(shares) == ["matmul_fp16: 1100.0 TFLOPS = 111.2% of 989.4: outside 40%-105%"]
    slow = peak_shares([_figure("memory_bandwidth", 1500.0, "GB/s")], peaks)
    assert outside_bounds(slow) == ["memory_bandwidth: 1500.0 GB/s = 44.8% of 3350: outside 50%-105%"]


# ------------------------------------------------------------- the host as found


def _state(**settings: str) -> GpuState:
    return GpuState(index=0, uuid="GPU-a", memory_used_mib=500,
                    settings={"persistence_mode": "Enabled", "compute_mode": "Default", "power.limit": "700.00"}
                    | settings)


def test_a_host_left_as_found_has_no_difference_and_each_change_is_one_line() -> None:
    before = HostSnapshot(gpus=(_state(),), compute_apps={77: 300}, files={"/tmp": frozenset({"a"})})
    assert host_differences(before, before) == []
    after = HostSnapshot(gpus=(_state(compute_mode="Exclusive_Process").model_copy(update={"memory_used_mib": 900}),),
                         compute_apps={77: 300, 1234: 400}, run_processes=frozenset({4321}),
                         files={"/tmp": frozenset({"a", "b", "c"})})
    assert host_differences(before, after, allowed={"/tmp": ["c"]}) == [
        "GPU 0: compute_mode is 'Exclusive_Process', was 'Default'",
        "GPU 0: 900 MiB in use, was 500 MiB (tolerance 128 MiB)",
        "process 1234 still uses a GPU (400 MiB)",
        "process 4321 of the run is still running",
        "left behind: /tmp/b",
    ]
    within = HostSnapshot(gpus=(_state().model_copy(update={"memory_used_mib": 600}),), compute_apps={77: 300},
                          files={"/tmp": frozenset()})
    assert host_differences(before, within) == []  # 100 MiB more is within the tolerance; removals are not ours


def test_the_gpu_settings_are_read_through_the_real_csv_format_without_fields_a_driver_lacks(
        machine, tmp_path: Path) -> None:
    """The stand-in knows no ``clocks.applications.*`` (as an old driver): the field is dropped and the
    query asked again; the rest parse from nvidia-smi's own text, ``[N/A]`` as empty."""
    program = tmp_path / "nvidia-smi"
    program.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m "
                       "pytest_gpubench.sandbox.nvidia_smi_standin \"$@\"\n")
    program.chmod(0o755)
    settings = ("persistence_mode", "compute_mode", "clocks.applications.graphics", "power.limit", "mig.mode.current")
    assert set(settings) <= set(SETTINGS_FIELDS)
    (state,) = query_gpu_states(str(program), settings)
    assert (state.index, state.memory_used_mib) == (0, 300) and state.uuid.startswith("GPU-")
    assert state.settings == {"persistence_mode": "Enabled", "compute_mode": "Default", "power.limit": "450.0",
                              "mig.mode.current": ""}


def test_compute_apps_in_nvidia_smis_csv() -> None:
    assert parse_compute_apps("1234, 40960\n5678, [N/A]\n\nnot a pid, 3\n") == {1234: 40960, 5678: None}


def test_the_runs_processes_are_found_by_the_mark_in_their_environment(tmp_path: Path) -> None:
    mark = f"test-{os.getpid()}"
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, "GPUBENCH_TEST_MARK": mark},
                             start_new_session=True)
    try:
        # Between fork and exec the child still carries this process's environment, without the mark.
        assert wait_for(lambda: processes_with_marker("GPUBENCH_TEST_MARK", mark), 30, "sleep's exec") == {child.pid}
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    assert processes_with_marker("GPUBENCH_TEST_MARK", mark) == set()
    (tmp_path / "x").touch()
    assert list_entries([tmp_path, tmp_path / "missing"]) == {str(tmp_path): frozenset({"x"}),
                                                               str(tmp_path / "missing"): frozenset()}


# ------------------------------------------------------------ is there a GPU


def test_why_a_machine_cannot_run_the_gpu_tier(tmp_path: Path) -> None:
    assert gpu_absent_reason(sys.executable, {"PATH": str(tmp_path)}) == "no NVIDIA GPU: nvidia-smi is not on PATH"
    assert "sandbox's stand-in" in gpu_absent_reason(sys.executable, {"PATH": str(tmp_path),
                                                                      "GPUBENCH_SANDBOX_INSTANCE": "/x"})
    # nvidia-smi is there, but no NVML library nor a CUDA torch for this Python (-I: not this suite's path).
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    (tmp_path / "torch.py").write_text("__version__ = '0.0'\n"
                                       "class cuda:\n    is_available = staticmethod(lambda: False)\n")
    reason = gpu_absent_reason(sys.executable, {"PATH": str(tmp_path), "PYTHONPATH": str(tmp_path)})
    assert reason.startswith("NVML cannot be loaded") and "pip install nvidia-ml-py" in reason
    assert reason.endswith("torch 0.0 sees no CUDA device (torch.cuda.is_available() is False)")
