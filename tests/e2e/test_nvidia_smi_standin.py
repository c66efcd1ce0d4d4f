"""The nvidia-smi stand-in as a real process: query CSV, XML, table, live values.

The Ollama stand-in's runtime state is written directly here (the end-to-end check
with a real server lives in test_ollama_standin.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_gpubench.sandbox.standin_state import LoadedModel, RuntimeState, StateStore

REPO = Path(__file__).resolve().parents[2]
SEED_QUERY = "--query-gpu=name,memory.total,memory.used,temperature.gpu,power.draw,utilization.gpu"
ALL_FIELDS = (
    "name,memory.total,memory.used,memory.free,temperature.gpu,power.draw,power.limit,utilization.gpu,"
    "utilization.memory,driver_version,compute_cap,count,index,uuid,pci.bus_id"
)
GIB = 1 << 30


def write_instance(directory: Path, count: int = 1, driver: str = "550.54.15") -> Path:
    spec = {
        "session_id": "smi-test",
        "time_scale": 0.01,
        "gpu": {
            "gpu_type": "RTX 4090",
            "name": "NVIDIA GeForce RTX 4090",
            "memory_mib": 24564,
            "count": count,
            "driver_version": driver,
            "cuda_version": "12.4",
            "power_limit_w": 450,
            "compute_capability": "8.9",
        },
        "host": {"cpu_model": "AMD EPYC 7543 32-Core Processor", "cpu_cores": 16, "ram_gib": 64},
        "ollama": {"version": "0.5.7", "pull_mb_per_s": 250.0},
        "models": {},
        "state_dir": str(directory / "state"),
    }
    path = directory / "instance.json"
    path.write_text(json.dumps(spec))
    return path


def smi_env(instance: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_SANDBOX_")}
    env.update(
        GPUBENCH_SANDBOX_INSTANCE=str(instance),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        **extra,
    )
    return env


def smi(instance: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_gpubench.sandbox.nvidia_smi_standin", *args],
        env=smi_env(instance, **env),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def instance(tmp_path: Path) -> Path:
    return write_instance(tmp_path)


def set_busy(instance: Path, pid: int, vram: int, active: int) -> None:
    store = StateStore(instance.parent / "state")
    store.write_runtime(
        RuntimeState(
            pid=pid,
            active_requests=active,
            busy_since=time.time() - 60 if active else None,
            idle_since=None if active else time.time(),
            loaded=[LoadedModel(name="qwen2:7b", size=vram, size_vram=vram, digest="d" * 64)] if vram else [],
        )
    )


def test_seed_query_gives_one_bare_csv_line_per_gpu(instance: Path) -> None:
    result = smi(instance, SEED_QUERY, "--format=csv,noheader,nounits")
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert re.fullmatch(r"NVIDIA GeForce RTX 4090, 24564, 300, \d+, \d+\.\d\d, 0", lines[0]), lines[0]


def test_headers_and_units_like_the_real_tool(tmp_path: Path) -> None:
    instance = write_instance(tmp_path, count=2)
    result = smi(instance, f"--query-gpu={ALL_FIELDS}", "--format=csv")
    header, *rows = result.stdout.splitlines()
    assert header == (
        "name, memory.total [MiB], memory.used [MiB], memory.free [MiB], temperature.gpu, power.draw [W], "
        "power.limit [W], utilization.gpu [%], utilization.memory [%], driver_version, compute_cap, count, "
        "index, uuid, pci.bus_id"
    )
    assert len(rows) == 2
    pattern = (
        r"NVIDIA GeForce RTX 4090, 24564 MiB, 300 MiB, 24264 MiB, \d+, \d+\.\d\d W, 450\.00 W, 0 %, 0 %, "
        r"550\.54\.15, 8\.9, 2, (\d), (GPU-[0-9a-f-]{36}), (00000000:0\d:00\.0)"
    )
    matches = [re.fullmatch(pattern, row) for row in rows]
    assert all(matches), rows
    assert [m.group(1) for m in matches] == ["0", "1"]
    assert len({m.group(2) for m in matches}) == 2
    bare = smi(instance, "--query-gpu=memory.total,power.limit", "--format=csv,nounits").stdout.splitlines()
    assert bare == ["memory.total [MiB], power.limit [W]", "24564, 450.00", "24564, 450.00"]


def test_unknown_field_and_bad_arguments_exit_2(instance: Path) -> None:
    result = smi(instance, "--query-gpu=name,gpu.sparkle", "--format=csv")
    assert (result.returncode, result.stdout) == (2, 'Field "gpu.sparkle" is not a valid field to query.\n\n')
    missing_format = smi(instance, "--query-gpu=name")
    assert missing_format.returncode == 2
    assert missing_format.stdout.startswith("Invalid combination of input arguments.")
    assert smi(instance, "--frobnicate").returncode == 2
    no_such_gpu = smi(instance, "-i", "3", "--query-gpu=name", "--format=csv")
    assert (no_such_gpu.returncode, no_such_gpu.stdout) == (6, "No devices were found\n")


def test_xml_log_parses_and_carries_the_documented_fields(instance: Path) -> None:
    result = smi(instance, "-q", "-x")
    assert result.returncode == 0
    root = ET.fromstring(result.stdout)
    assert root.tag == "nvidia_smi_log"
    assert root.findtext("driver_version") == "550.54.15"
    assert root.findtext("cuda_version") == "12.4"
    assert root.findtext("attached_gpus") == "1"
    (gpu,) = root.findall("gpu")
    assert gpu.get("id") == "00000000:01:00.0"
    assert gpu.findtext("product_name") == "NVIDIA GeForce RTX 4090"
    assert gpu.findtext("fb_memory_usage/total") == "24564 MiB"
    assert gpu.findtext("fb_memory_usage/used") == "300 MiB"
    assert gpu.findtext("fb_memory_usage/free") == "24264 MiB"
    assert re.fullmatch(r"\d+ C", gpu.findtext("temperature/gpu_temp"))
    assert re.fullmatch(r"\d+\.\d\d W", gpu.findtext("gpu_power_readings/power_draw"))
    assert gpu.findtext("utilization/gpu_util") == "0 %"
    assert gpu.findtext("compute_cap") == "8.9"
    text = smi(instance, "-q").stdout
    assert "Product Name                          : NVIDIA GeForce RTX 4090" in text


def test_newer_drivers_report_average_and_instant_power(tmp_path: Path) -> None:
    instance = write_instance(tmp_path, driver="560.35.03")
    gpu = ET.fromstring(smi(instance, "-q", "-x").stdout).find("gpu")
    assert gpu.find("gpu_power_readings/power_draw") is None
    assert gpu.findtext("gpu_power_readings/instant_power_draw").endswith(" W")
    assert gpu.findtext("gpu_power_readings/average_power_draw").endswith(" W")


def test_max_clocks_come_from_the_instance_and_are_n_a_without_them(tmp_path: Path) -> None:
    unknown = write_instance(tmp_path)
    query = ("--query-gpu=clocks.max.sm,clocks.max.memory", "--format=csv,noheader")
    assert smi(unknown, *query).stdout == "[N/A], [N/A]\n"
    assert ET.fromstring(smi(unknown, "-q", "-x").stdout).findtext("gpu/max_clocks/sm_clock") == "N/A"
    spec = json.loads(unknown.read_text())
    spec["gpu"].update(sm_clock_max_mhz=2520, mem_clock_max_mhz=10501)
    unknown.write_text(json.dumps(spec))
    assert smi(unknown, *query).stdout == "2520 MHz, 10501 MHz\n"
    gpu = ET.fromstring(smi(unknown, "-q", "-x").stdout).find("gpu")
    assert (gpu.findtext("max_clocks/sm_clock"), gpu.findtext("max_clocks/mem_clock")) == ("2520 MHz", "10501 MHz")


def test_an_old_driver_has_no_xml_log_and_refuses_newer_fields(tmp_path: Path) -> None:
    instance = write_instance(tmp_path)
    spec = json.loads(instance.read_text())
    spec["gpu_tools"] = {"xml_log": False, "refused_fields": ["compute_cap"]}
    instance.write_text(json.dumps(spec))
    xml = smi(instance, "-q", "-x")
    assert xml.returncode == 2 and xml.stdout.startswith("Invalid combination of input arguments.")
    refused = smi(instance, "--query-gpu=name,compute_cap", "--format=csv")
    assert (refused.returncode, refused.stdout) == (2, 'Field "compute_cap" is not a valid field to query.\n\n')
    assert smi(instance, "--query-gpu=name", "--format=csv,noheader").stdout == "NVIDIA GeForce RTX 4090\n"
    assert smi(instance, "-q").returncode == 0  # the text log still works


def test_list_and_table(instance: Path) -> None:
    listing = smi(instance, "-L").stdout
    assert re.fullmatch(r"GPU 0: NVIDIA GeForce RTX 4090 \(UUID: GPU-[0-9a-f-]{36}\)\n", listing)
    table = smi(instance).stdout.splitlines()
    assert all(len(line) == 91 for line in table[1:])
    assert "| NVIDIA-SMI 550.54.15" in table[2] and "CUDA Version: 12.4" in table[2]
    assert any("NVIDIA GeForce RTX 4090" in line for line in table)
    assert any("No running processes found" in line for line in table)


def test_live_values_follow_the_ollama_state(instance: Path) -> None:
    set_busy(instance, os.getpid(), vram=5 * GIB, active=2)
    busy = smi(instance, SEED_QUERY + ",utilization.memory", "--format=csv,noheader,nounits").stdout.strip()
    _, _, used, temp, power, util, mem_util = busy.split(", ")
    assert int(used) == 300 + 5 * 1024
    assert int(util) > 50 and int(mem_util) > 0
    assert float(power) > 200 and int(temp) > 50
    apps = smi(instance, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader").stdout
    assert apps.startswith(f"{os.getpid()}, ") and apps.strip().endswith("5120 MiB")
    assert any(str(os.getpid()) in line and "5120MiB" in line for line in smi(instance).stdout.splitlines())
    set_busy(instance, os.getpid(), vram=5 * GIB, active=0)
    idle = smi(instance, SEED_QUERY, "--format=csv,noheader,nounits").stdout.strip().split(", ")
    assert int(idle[2]) == 300 + 5 * 1024 and idle[5] == "0" and float(idle[4]) < 60


def test_state_of_a_dead_server_is_ignored(instance: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    set_busy(instance, dead.pid, vram=5 * GIB, active=1)
    line = smi(instance, SEED_QUERY, "--format=csv,noheader,nounits").stdout.strip().split(", ")
    assert line[2] == "300" and line[5] == "0"


def test_test_knobs_for_missing_values_and_a_broken_driver(instance: Path) -> None:
    na = smi(instance, SEED_QUERY, "--format=csv,noheader", GPUBENCH_SANDBOX_SMI_NA="power.draw,temperature.gpu")
    assert na.stdout.split(", ")[3:5] == ["[N/A]", "[N/A]"]
    xml = ET.fromstring(smi(instance, "-q", "-x", GPUBENCH_SANDBOX_SMI_NA="power.draw").stdout)
    assert xml.findtext("gpu/gpu_power_readings/power_draw") == "N/A"
    broken = smi(instance, SEED_QUERY, "--format=csv", GPUBENCH_SANDBOX_SMI_FAULT="driver")
    assert broken.returncode == 9
    assert broken.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_loop_prints_the_header_once_then_a_row_per_interval(instance: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_gpubench.sandbox.nvidia_smi_standin",
            "--query-gpu=index,utilization.gpu",
            "--format=csv",
            "-lms",
            "50",
        ],
        env=smi_env(instance),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert lines == ["index, utilization.gpu [%]\n"] + ["0, 0 %\n"] * 3
