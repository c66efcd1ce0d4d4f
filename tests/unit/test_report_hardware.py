"""The report's Hardware section: one row per machine from the store's detected systems."""

from __future__ import annotations

from pathlib import Path

from pytest_gpubench.remote.sysinfo import GpuDevice, HostFacts, SystemInfo
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.report.html import render_html
from pytest_gpubench.report.markdown import render_markdown
from pytest_gpubench.store.sqlite_store import SqliteStore

GIB = 1024 ** 3


def _system(source: str = "nvidia-smi-xml", driver: str = "550.54.15", free_gb: int = 30, count: int = 1):
    gpu = GpuDevice(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-a", memory_total_mib=24564,
                    compute_capability="8.9", sm_clock_max_mhz=2520, mem_clock_max_mhz=10501, power_limit_w=450.0)
    host = HostFacts(cpu_model="AMD EPYC 7543 32-Core Processor", cpu_cores=32, ram_mib=65536,
                     os="Ubuntu 22.04.4 LTS", kernel="5.15.0-105-generic", disk_path="/root/.ollama",
                     disk_total_bytes=50 * GIB, disk_free_bytes=free_gb * GIB)
    return SystemInfo(source=source, driver_version=driver, cuda_version="12.4", gpus=(gpu,) * count,
                      machine_gpu_count=count, host=host)


def _store(path: Path) -> SqliteStore:
    store = SqliteStore.open(path)
    store.start_run("run-h", ["pytest"], [])
    return store


def _cell(store: SqliteStore, name: str, gpu: str = "RTX 4090", provider: str = "vastai") -> str:
    return store.add_cell("run-h", name, gpu_type=gpu, provider=provider, model="qwen2:7b", matrix_file="m.yaml")


def test_alike_sessions_fold_into_one_machine_and_a_different_one_gets_its_own_row(tmp_path):
    with _store(tmp_path / "manifest.db") as store:
        store.record_system(_cell(store, "a"), "s1", _system(free_gb=30))
        store.record_system(_cell(store, "b"), "s2", _system(free_gb=20))  # same machine, less disk free
        store.record_system(_cell(store, "c"), "s3", _system("nvml", driver="570.124.06"))
        store.record_system(_cell(store, "d", provider="tensordock"), "s4", _system("nvidia-smi-csv", count=2))
        report = build_report(store)
    machines = {(m.provider, m.source): m for m in report.machines}
    assert len(report.machines) == 3
    folded = machines[("vastai", "nvidia-smi-xml")]
    assert folded.sessions == 2 and folded.disk_free_bytes == 20 * GIB  # the latest session's disk
    assert machines[("vastai", "nvml")].driver_version == "570.124.06"
    assert machines[("tensordock", "nvidia-smi-csv")].gpu_count == 2


def test_markdown_and_html_show_the_hardware_table(tmp_path):
    with _store(tmp_path / "manifest.db") as store:
        store.record_system(_cell(store, "a"), "s1", _system())
        store.record_system(_cell(store, "d", provider="tensordock"), "s4", _system("nvidia-smi-csv", count=2))
        report = build_report(store)
    text = render_markdown(report)
    assert "## Hardware" in text
    assert ("| RTX 4090 | vastai | NVIDIA GeForce RTX 4090 | 24 | 8.9 | 2520 | 10501 | 450 | 550.54.15 | 12.4 | "
            "AMD EPYC 7543 32-Core Processor \\(32 cores\\) | 64 | Ubuntu 22.04.4 LTS | 5.15.0-105-generic | 30 / 50 | "
            "nvidia-smi-xml | 1 |") in text
    assert "| RTX 4090 | tensordock | 2 x NVIDIA GeForce RTX 4090 |" in text
    html = render_html(report)
    assert '<table class="sortable" data-table="hardware">' in html and "<td>nvidia-smi-csv</td>" in html


def test_runs_without_detected_systems_say_so(tmp_path):
    with _store(tmp_path / "manifest.db") as store:
        report = build_report(store)
    assert report.machines == []
    assert "No system was detected in these runs" in render_markdown(report)
    assert "No system was detected in these runs" in render_html(report)


def test_the_disk_column_says_gib_as_its_figures_are(tmp_path):
    with _store(tmp_path / "manifest.db") as store:
        store.record_system(_cell(store, "a"), "s1", _system())
        text = render_markdown(build_report(store))
    assert "Disk free / total (GiB)" in text and "(GB)" not in text


def test_alike_hosts_are_two_machines_named_beside_the_provider(tmp_path):
    """Two hosts of one inventory, the same hardware: the row's `provider:` (`hosts`) does not tell them
    apart, the machine they ran on does; one host under its own name shows that name once."""
    with _store(tmp_path / "manifest.db") as store:
        store.record_system(_cell(store, "a", provider="hosts"), "hosts-lab1-1", _system(), machine="lab1")
        store.record_system(_cell(store, "b", provider="hosts"), "hosts-lab2-2", _system(), machine="lab2")
        store.record_system(_cell(store, "c", provider="hosts"), "hosts-lab1-3", _system(), machine="lab1")
        store.record_system(_cell(store, "d", provider="lab2"), "hosts-lab2-4", _system(), machine="lab2")
        report = build_report(store)
        (stored, *_) = store.systems("run-h")
    assert stored.machine == "lab1"
    assert [(m.provider_label, m.sessions) for m in report.machines] == [
        ("hosts (lab1)", 2), ("hosts (lab2)", 1), ("lab2", 1)]
    text = render_markdown(report)
    assert "| RTX 4090 | hosts \\(lab1\\) | NVIDIA GeForce RTX 4090 |" in text
    assert "| RTX 4090 | hosts \\(lab2\\) | NVIDIA GeForce RTX 4090 |" in text
