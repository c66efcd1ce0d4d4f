"""System detection's parsers: NVML's JSON, nvidia-smi's XML log and CSV query, the host probe; and
``detect_system`` on the GPUs a provider leased of a machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.gpuinfo import parse_gpu_query_csv
from pytest_gpubench.remote.sysinfo import (
    CSV_FIELDS,
    GpuDevice,
    HostFacts,
    SystemInfo,
    gpu_facts_from_csv,
    gpu_facts_from_nvml,
    gpu_facts_from_xml,
    parse_cuda_banner,
    parse_df,
    parse_host_probe,
)
from pytest_gpubench.remote.sysinfo import NVML_PROBE_SOURCE, hardware_of

GIB = 1024 ** 3

# ----------------------------------------------------------------------------- NVML

NVML_JSON = json.dumps({
    "driver_version": "550.54.15", "cuda_version": "12.4",
    "gpus": [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-aaaa", "pci_bus_id": "00000000:01:00.0",
         "memory_total_bytes": 24564 * 1024 * 1024, "compute_capability": "8.9", "sm_clock_max_mhz": 3105,
         "mem_clock_max_mhz": 10501, "sm_clock_mhz": 210, "mem_clock_mhz": 405, "power_limit_w": 450.0},
        # A card whose NVML said "Not Supported" for most calls: nulls, and a wrong kind.
        {"index": 1, "name": "NVIDIA GeForce RTX 4090", "uuid": None, "pci_bus_id": None,
         "memory_total_bytes": None, "compute_capability": None, "sm_clock_max_mhz": "N/A",
         "mem_clock_max_mhz": None, "sm_clock_mhz": None, "mem_clock_mhz": None, "power_limit_w": None},
    ],
})


def test_nvml_json_becomes_devices_with_missing_figures_as_none():
    facts = gpu_facts_from_nvml(NVML_JSON + "\n")
    assert facts is not None and facts.source == "nvml"
    assert (facts.driver_version, facts.cuda_version) == ("550.54.15", "12.4")
    first, second = facts.gpus
    assert first == GpuDevice(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-aaaa",
                              pci_bus_id="00000000:01:00.0", memory_total_mib=24564, compute_capability="8.9",
                              sm_clock_max_mhz=3105, mem_clock_max_mhz=10501, sm_clock_mhz=210, mem_clock_mhz=405,
                              power_limit_w=450.0)
    assert second.index == 1 and second.memory_total_mib is None and second.sm_clock_max_mhz is None
    assert second.uuid == "" and second.power_limit_w is None


def test_nvml_output_that_is_not_an_answer_is_none():
    for text in ("", "no NVML", "[]", '{"gpus": []}', '{"gpus": "x"}', "null"):
        assert gpu_facts_from_nvml(text) is None, text


FAKE_PYNVML = textwrap.dedent('''
    class NVMLError(Exception):
        pass
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    class _Memory: total = 16 * 1024 ** 3
    class _Pci: busId = b"00000000:41:00.0"
    def nvmlInit(): pass
    def nvmlShutdown(): pass
    def nvmlSystemGetDriverVersion(): return b"535.183.01"
    def nvmlSystemGetCudaDriverVersion(): return 12020
    def nvmlDeviceGetCount(): return 1
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetName(h): return b"Tesla T4"
    def nvmlDeviceGetUUID(h): return "GPU-t4"
    def nvmlDeviceGetPciInfo(h): return _Pci()
    def nvmlDeviceGetMemoryInfo(h): return _Memory()
    def nvmlDeviceGetCudaComputeCapability(h): return (7, 5)
    def nvmlDeviceGetMaxClockInfo(h, kind): return {1: 1590, 2: 5001}[kind]
    def nvmlDeviceGetClockInfo(h, kind): raise NVMLError("Not Supported")
    def nvmlDeviceGetEnforcedPowerLimit(h): raise NVMLError("Not Supported")
    def nvmlDeviceGetPowerManagementLimit(h): return 70000
''')


def test_the_shipped_nvml_script_reads_pynvml_and_survives_unsupported_calls(tmp_path):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    done = subprocess.run([sys.executable, "-"], input=NVML_PROBE_SOURCE, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    facts = gpu_facts_from_nvml(done.stdout)
    assert facts is not None
    assert (facts.driver_version, facts.cuda_version) == ("535.183.01", "12.2")  # bytes decoded, 12020 -> 12.2
    (t4,) = facts.gpus
    assert (t4.name, t4.pci_bus_id, t4.memory_total_mib, t4.compute_capability) == (
        "Tesla T4", "00000000:41:00.0", 16384, "7.5")
    assert (t4.sm_clock_max_mhz, t4.mem_clock_max_mhz, t4.sm_clock_mhz) == (1590, 5001, None)
    assert t4.power_limit_w == 70.0  # the management limit when the enforced one is not supported


def test_the_shipped_nvml_script_exits_3_without_pynvml(tmp_path):
    done = subprocess.run([sys.executable, "-I", "-"], input=NVML_PROBE_SOURCE, capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 3 and done.stdout == "", done.stderr
    assert "no NVML" in done.stderr


# -------------------------------------------------------------------------- XML log

XML_NEW = """<?xml version="1.0" ?>
<nvidia_smi_log>
    <driver_version>560.35.03</driver_version>
    <cuda_version>12.6</cuda_version>
    <attached_gpus>1</attached_gpus>
    <gpu id="00000000:01:00.0">
        <product_name>NVIDIA H200 NVL</product_name>
        <uuid>GPU-h200</uuid>
        <compute_cap>9.0</compute_cap>
        <pci><pci_bus_id>00000000:01:00.0</pci_bus_id></pci>
        <fb_memory_usage><total>143771 MiB</total><used>1 MiB</used></fb_memory_usage>
        <gpu_power_readings>
            <average_power_draw>80.10 W</average_power_draw>
            <current_power_limit>600.00 W</current_power_limit>
            <default_power_limit>600.00 W</default_power_limit>
        </gpu_power_readings>
        <clocks><graphics_clock>345 MHz</graphics_clock><sm_clock>345 MHz</sm_clock>
            <mem_clock>2619 MHz</mem_clock></clocks>
        <max_clocks><graphics_clock>1785 MHz</graphics_clock><sm_clock>1785 MHz</sm_clock>
            <mem_clock>2619 MHz</mem_clock></max_clocks>
    </gpu>
</nvidia_smi_log>
"""

# A 470-series log: <power_readings> with <enforced_power_limit>, no <compute_cap>, N/A clocks.
XML_OLD = """<nvidia_smi_log>
    <driver_version>470.256.02</driver_version>
    <cuda_version>11.4</cuda_version>
    <gpu id="00000000:3B:00.0">
        <product_name>Tesla V100-SXM2-16GB</product_name>
        <uuid>GPU-v100</uuid>
        <fb_memory_usage><total>16160 MiB</total></fb_memory_usage>
        <power_readings>
            <power_draw>N/A</power_draw>
            <power_limit>300.00 W</power_limit>
            <enforced_power_limit>250.00 W</enforced_power_limit>
        </power_readings>
        <clocks><sm_clock>N/A</sm_clock><mem_clock>[Not Supported]</mem_clock></clocks>
        <max_clocks><sm_clock>1530 MHz</sm_clock><mem_clock>877 MHz</mem_clock></max_clocks>
    </gpu>
</nvidia_smi_log>
"""


def test_xml_of_a_recent_driver():
    facts = gpu_facts_from_xml(XML_NEW)
    assert (facts.source, facts.driver_version, facts.cuda_version) == ("nvidia-smi-xml", "560.35.03", "12.6")
    (h200,) = facts.gpus
    assert h200 == GpuDevice(index=0, name="NVIDIA H200 NVL", uuid="GPU-h200", pci_bus_id="00000000:01:00.0",
                             memory_total_mib=143771, compute_capability="9.0", sm_clock_max_mhz=1785,
                             mem_clock_max_mhz=2619, sm_clock_mhz=345, mem_clock_mhz=2619, power_limit_w=600.0)


def test_xml_of_an_old_driver_reads_the_enforced_limit_and_leaves_n_a_out():
    (v100,) = gpu_facts_from_xml(XML_OLD).gpus
    assert v100.power_limit_w == 250.0  # enforced, not the requested <power_limit>
    assert v100.compute_capability == "" and v100.sm_clock_mhz is None and v100.mem_clock_mhz is None
    assert (v100.sm_clock_max_mhz, v100.mem_clock_max_mhz) == (1530, 877)


# -------------------------------------------------------------------------- CSV query


def test_csv_query_with_n_a_values_and_text_capability():
    text = ("0, NVIDIA GeForce RTX 4090, GPU-a, 00000000:01:00.0, 24564, 550.54.15, 8.9, 3105, 10501, 210, 405, "
            "450.00\n"
            "1, NVIDIA GeForce RTX 4090, GPU-b, 00000000:02:00.0, 24564, 550.54.15, 8.9, [N/A], [N/A], [N/A], "
            "[N/A], [Not Supported]\n")
    facts = gpu_facts_from_csv(parse_gpu_query_csv(text, list(CSV_FIELDS)), "12.4")
    assert (facts.source, facts.driver_version, facts.cuda_version) == ("nvidia-smi-csv", "550.54.15", "12.4")
    first, second = facts.gpus
    assert (first.index, first.compute_capability, first.sm_clock_max_mhz, first.power_limit_w) == (0, "8.9", 3105,
                                                                                                      450.0)
    assert (second.index, second.sm_clock_max_mhz, second.power_limit_w, second.mem_clock_mhz) == (1, None, None,
                                                                                                     None)


def test_csv_query_of_fewer_fields_an_old_driver_accepted():
    fields = ["index", "name", "memory.total", "driver_version"]
    facts = gpu_facts_from_csv(parse_gpu_query_csv("0, Tesla T4, 15360, 418.67\n", fields))
    (t4,) = facts.gpus
    assert (t4.name, t4.memory_total_mib, t4.compute_capability, t4.sm_clock_max_mhz) == ("Tesla T4", 15360, "", None)
    assert facts.cuda_version == ""


def test_cuda_version_from_the_table_banner():
    banner = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15      CUDA Version: 12.4     |"
    assert parse_cuda_banner(banner) == "12.4"
    assert parse_cuda_banner("NVIDIA-SMI has failed") == ""


# ------------------------------------------------------------------------ host probe


def test_host_probe_lines():
    text = ("cores=32\ncpu=AMD EPYC 7543 32-Core Processor\nmem_kib=65841288\n"
            'os="Ubuntu 22.04.4 LTS"\nkernel=5.15.0-105-generic\ndisk_path=/root/.ollama\n'
            "df=overlay 52428800 15728640 36700160 30% /\n")
    host = parse_host_probe(text)
    assert host == HostFacts(cpu_model="AMD EPYC 7543 32-Core Processor", cpu_cores=32, ram_mib=64298,
                             os="Ubuntu 22.04.4 LTS", kernel="5.15.0-105-generic", disk_path="/root/.ollama",
                             disk_total_bytes=50 * GIB, disk_free_bytes=35 * GIB)


def test_host_probe_with_nothing_readable():
    assert parse_host_probe("cores=\ncpu=\nmem_kib=\nos=\ndf=df: /x: No such file\n") == HostFacts()
    assert parse_host_probe("garbage") == HostFacts()


def test_hardware_info_of_a_system_keeps_the_result_shape():
    facts = gpu_facts_from_nvml(NVML_JSON)
    assert facts is not None
    host = HostFacts(cpu_model="EPYC", cpu_cores=16, ram_mib=65536)
    system = SystemInfo.of(facts, host, facts.gpus[:1])
    assert system.machine_gpu_count == 2 and len(system.gpus) == 1
    hardware = hardware_of(system)
    assert (hardware.gpu_name, hardware.gpu_memory_mib, hardware.gpu_count) == ("NVIDIA GeForce RTX 4090", 24564, 1)
    assert (hardware.driver_version, hardware.cuda_version, hardware.ram_gib) == ("550.54.15", "12.4", 64)
    assert SystemInfo.model_validate_json(system.model_dump_json()) == system


def test_one_disk_probe_serves_detection_and_the_free_space_check(tmp_path):
    """The host probe ends with the disk probe the pre-pull check runs alone (``free_disk_bytes``),
    and both are read by one parser: run here, they name the same disk and agree on its size."""
    import asyncio
    import subprocess

    from pytest_gpubench.remote.local import LocalShell
    from pytest_gpubench.remote.sysinfo import DISK_PROBE, HOST_PROBE
    from pytest_gpubench.remote.sysinfo import free_disk_bytes

    assert HOST_PROBE.endswith(DISK_PROBE)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    host = parse_host_probe(subprocess.run(["sh", "-c", HOST_PROBE], capture_output=True, text=True,
                                           env=env).stdout)
    alone = parse_host_probe(subprocess.run(["sh", "-c", DISK_PROBE], capture_output=True, text=True,
                                            env=env).stdout)
    assert host.disk_path == alone.disk_path == str(tmp_path)
    assert host.disk_total_bytes == alone.disk_total_bytes and host.disk_total_bytes
    assert parse_df("overlay 52428800 15728640 36700160 30% /") == (50 * GIB, 35 * GIB)
    assert parse_df("df: /x: No such file") == (None, None)

    async def free() -> int | None:
        shell = LocalShell.open()
        try:
            return await free_disk_bytes(shell, 30)
        finally:
            await shell.close()

    assert asyncio.run(free()) is not None


# ----------------------------------------------------------- detection of leased GPUs

MIXED_PYNVML = FAKE_PYNVML.replace("def nvmlDeviceGetCount(): return 1", "def nvmlDeviceGetCount(): return 2").replace(
    'def nvmlDeviceGetName(h): return b"Tesla T4"', 'def nvmlDeviceGetName(h): return [b"Tesla T4", b"NVIDIA L4"][h]')


def _detect_on_a_mixed_machine(tmp_path, monkeypatch, gpu: str, indices: tuple[int, ...]):
    """detect_system through a real shell on this machine, whose NVML (a fake pynvml, as the NVML
    source reads it) lists a T4 as GPU 0 and an L4 as GPU 1."""
    import asyncio

    from pytest_gpubench.remote.local import LocalShell
    from pytest_gpubench.remote.sysinfo import detect_system

    (tmp_path / "pynvml.py").write_text(MIXED_PYNVML)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    async def detect():
        shell = LocalShell.open()
        try:
            return await detect_system(shell, gpu, 30, gpu_indices=indices)
        finally:
            await shell.close()

    return asyncio.run(asyncio.wait_for(detect(), 60))


def test_detection_describes_only_the_leased_gpu_of_a_machine(tmp_path, monkeypatch):
    system = _detect_on_a_mixed_machine(tmp_path, monkeypatch, "L4", (1,))
    assert system.source == "nvml" and [(g.index, g.name) for g in system.gpus] == [(1, "NVIDIA L4")]
    assert system.machine_gpu_count == 2


def test_a_leased_gpu_the_machine_does_not_list_fails_at_ssh_connect(tmp_path, monkeypatch):
    with pytest.raises(StageError) as caught:
        _detect_on_a_mixed_machine(tmp_path, monkeypatch, "L4", (1, 2))
    assert caught.value.stage is Stage.SSH_CONNECT
    assert "the cell was given GPU(s) [2] but nvidia-smi lists 2 GPU(s)" in str(caught.value)


def test_a_leased_gpu_of_another_model_fails_though_the_machine_has_the_right_one(tmp_path, monkeypatch):
    with pytest.raises(StageError) as caught:
        _detect_on_a_mixed_machine(tmp_path, monkeypatch, "L4", (0,))  # GPU 0 is the T4
    assert caught.value.stage is Stage.SSH_CONNECT
    assert "expected a L4 but nvidia-smi reports 'Tesla T4'" in str(caught.value)
