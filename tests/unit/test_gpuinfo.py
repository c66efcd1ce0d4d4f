"""nvidia-smi parsing and the expected-GPU check."""

from __future__ import annotations

import pytest

from pytest_gpubench.gpuinfo import gpu_name_matches, parse_gpu_query_csv, parse_nvidia_smi_xml

# ---------------------------------------------------------------------- nvidia-smi

QUERY = "name,memory.total,memory.used,temperature.gpu,power.draw,utilization.gpu"


def test_parse_gpu_query_csv_values_and_missing():
    text = (
        "NVIDIA GeForce RTX 4090, 24564, 1234, 45, 65.43, 12\n"
        "NVIDIA A100 80GB PCIe, 81920, [N/A], [Not Supported], [N/A], 0\n"
        "\n"
    )
    rows = parse_gpu_query_csv(text, QUERY)
    assert rows == [
        {"name": "NVIDIA GeForce RTX 4090", "memory.total": 24564, "memory.used": 1234,
         "temperature.gpu": 45, "power.draw": 65.43, "utilization.gpu": 12},
        {"name": "NVIDIA A100 80GB PCIe", "memory.total": 81920, "memory.used": None,
         "temperature.gpu": None, "power.draw": None, "utilization.gpu": 0},
    ]


def test_parse_gpu_query_csv_never_crashes_on_odd_lines():
    rows = parse_gpu_query_csv("Tesla T4, 15360 MiB, weird\nonly-name\n",
                               ["name", "memory.total", "memory.used"])
    assert rows[0] == {"name": "Tesla T4", "memory.total": 15360, "memory.used": "weird"}
    assert rows[1] == {"name": "only-name", "memory.total": None, "memory.used": None}
    assert parse_gpu_query_csv("", QUERY) == []


def test_parse_gpu_query_csv_keeps_versions_as_text():
    rows = parse_gpu_query_csv("550.54.15, 12.10\n", ["driver_version", "vbios_version"])
    assert rows == [{"driver_version": "550.54.15", "vbios_version": "12.10"}]


NVIDIA_SMI_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
    <timestamp>Sat Feb  7 10:00:00 2026</timestamp>
    <driver_version>550.54.15</driver_version>
    <cuda_version>12.4</cuda_version>
    <attached_gpus>2</attached_gpus>
    <gpu id="00000000:01:00.0">
        <product_name>NVIDIA GeForce RTX 4090</product_name>
        <uuid>GPU-1111</uuid>
        <fb_memory_usage>
            <total>24564 MiB</total>
            <reserved>346 MiB</reserved>
            <used>2 MiB</used>
            <free>24215 MiB</free>
        </fb_memory_usage>
        <temperature>
            <gpu_temp>34 C</gpu_temp>
        </temperature>
        <gpu_power_readings>
            <power_draw>21.86 W</power_draw>
        </gpu_power_readings>
    </gpu>
    <gpu id="00000000:02:00.0">
        <product_name>NVIDIA GeForce RTX 4090</product_name>
        <uuid>GPU-2222</uuid>
        <fb_memory_usage>
            <total>24564 MiB</total>
            <used>N/A</used>
        </fb_memory_usage>
        <temperature>
            <gpu_temp>N/A</gpu_temp>
        </temperature>
    </gpu>
</nvidia_smi_log>
"""


def test_parse_nvidia_smi_xml():
    info = parse_nvidia_smi_xml(NVIDIA_SMI_XML)
    assert info["driver_version"] == "550.54.15"
    assert info["cuda_version"] == "12.4"
    assert info["attached_gpus"] == 2
    first, second = info["gpus"]
    assert first == {"index": 0, "product_name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-1111",
                     "pci_bus_id": None, "compute_capability": None,
                     "memory_total_mib": 24564, "memory_used_mib": 2, "temperature_c": 34,
                     "power_draw_w": 21.86, "power_limit_w": None, "sm_clock_mhz": None, "mem_clock_mhz": None,
                     "sm_clock_max_mhz": None, "mem_clock_max_mhz": None}
    assert second["index"] == 1
    assert second["memory_total_mib"] == 24564
    assert second["memory_used_mib"] is None and second["temperature_c"] is None
    assert second["power_draw_w"] is None


def test_parse_nvidia_smi_xml_versions_stay_text_and_bad_xml_raises():
    info = parse_nvidia_smi_xml(
        "<nvidia_smi_log><driver_version>570.10</driver_version>"
        "<cuda_version>12.10</cuda_version></nvidia_smi_log>"
    )
    assert info == {"driver_version": "570.10", "cuda_version": "12.10",
                    "attached_gpus": None, "gpus": []}
    with pytest.raises(ValueError):
        parse_nvidia_smi_xml("NVIDIA-SMI has failed because it couldn't communicate")


# ------------------------------------------------------------------------ GPU names


@pytest.mark.parametrize(
    ("expected", "product"),
    [
        ("RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("RTX4090", "NVIDIA GeForce RTX 4090"),
        ("rtx 4090", "NVIDIA GeForce RTX 4090"),
        ("A100 80GB", "NVIDIA A100 80GB PCIe"),
        ("A100 80GB", "NVIDIA A100-SXM4-80GB"),
        ("A100", "NVIDIA A100-SXM4-40GB"),
        ("H200 NVL", "NVIDIA H200 NVL"),
        ("H100", "NVIDIA H100 80GB HBM3"),
        ("H100 SXM", "NVIDIA H100 80GB HBM3"),
        ("H100 PCIe", "NVIDIA H100 PCIe"),
        ("RTX 5070 Ti", "NVIDIA GeForce RTX 5070 Ti"),
        ("RTX 5060 Ti", "NVIDIA GeForce RTX 5060 Ti"),
        ("RTX 3090", "NVIDIA GeForce RTX 3090"),
        ("RTX A6000", "NVIDIA RTX A6000"),
        ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation"),
        ("V100", "Tesla V100-SXM2-16GB"),
        ("T4", "Tesla T4"),
        ("L40S", "NVIDIA L40S"),
    ],
)
def test_gpu_name_matches(expected, product):
    assert gpu_name_matches(expected, product)


@pytest.mark.parametrize(
    ("expected", "product"),
    [
        ("RTX 4090", "NVIDIA GeForce RTX 4080"),
        ("RTX 5070", "NVIDIA GeForce RTX 5070 Ti"),
        ("RTX 5070 Ti", "NVIDIA GeForce RTX 5070"),
        ("RTX 4090", "NVIDIA GeForce RTX 4090 D"),
        ("RTX 4090", "NVIDIA GeForce RTX 4090 Laptop GPU"),
        ("A100 80GB", "NVIDIA A100-SXM4-40GB"),
        ("A100", "NVIDIA A10"),
        ("A10", "NVIDIA A100-PCIE-40GB"),
        ("L40", "NVIDIA L40S"),
        ("H200", "NVIDIA H200 NVL"),
        ("H100 NVL", "NVIDIA H100 PCIe"),
        ("RTX 6000 Ada", "Quadro RTX 6000"),
        ("", "NVIDIA GeForce RTX 4090"),
        ("RTX 4090", ""),
    ],
)
def test_gpu_name_does_not_match(expected, product):
    assert not gpu_name_matches(expected, product)
