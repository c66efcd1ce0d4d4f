"""System detection against real sandbox instances over SSH, one per source.

The default instance answers ``nvidia-smi -q -x``; the ``gpu_driver`` fault gives one
NVML (the stand-in ``pynvml`` on its PYTHONPATH) and one an old driver whose XML log
fails and whose CSV query refuses ``compute_cap``. Each must describe the catalog's
RTX 4090 and say which source answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.remote.sysinfo import SystemInfo
from pytest_gpubench.remote.sysinfo import detect_system, hardware_of

TIME_SCALE = 0.01


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("system-detection")
    yield thread
    thread.close()


class BrokenDriver:
    """The connection, with every command run as on a machine whose driver is broken (the
    nvidia-smi stand-in's GPUBENCH_SANDBOX_SMI_FAULT knob)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def run(self, command: str, **kwargs: Any) -> Any:
        return await self.conn.run(f"export GPUBENCH_SANDBOX_SMI_FAULT=driver; {command}", **kwargs)


def detect(loop: LoopThread, api: httpx.Client, fault: dict[str, Any] | None = None, *, broken: bool = False,
           **kwargs: Any) -> SystemInfo:
    session, key = new_session(api, fault)

    async def go() -> SystemInfo:
        conn = await connect(session, key)
        try:
            target: Any = BrokenDriver(conn) if broken else conn
            return await detect_system(target, kwargs.pop("expected", "RTX 4090"), 30, **kwargs)
        finally:
            await conn.close()

    try:
        return loop.run(go(), 120)
    finally:
        api.post(f"/api/v1/sessions/{session['id']}/done")


def assert_rtx_4090(system: SystemInfo) -> None:
    (gpu,) = system.gpus
    assert gpu.name == "NVIDIA GeForce RTX 4090" and gpu.memory_total_mib == 24564
    assert (system.driver_version, system.cuda_version, system.machine_gpu_count) == ("550.54.15", "12.4", 1)
    assert (gpu.sm_clock_max_mhz, gpu.mem_clock_max_mhz, gpu.power_limit_w) == (2520, 10501, 450.0)
    assert gpu.uuid.startswith("GPU-") and gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.sm_clock_mhz is not None and gpu.mem_clock_mhz is not None
    host = system.host
    assert host.cpu_cores > 0 and host.ram_mib and host.kernel and host.disk_path
    # The emulated disk (df stand-in): the catalog's 50 GiB, part of it used by the system.
    assert host.disk_total_bytes == 50 * 1024 ** 3 and 0 < (host.disk_free_bytes or 0) < host.disk_total_bytes


def test_xml_log_by_default(loop: LoopThread, api: httpx.Client) -> None:
    system = detect(loop, api)
    assert system.source == "nvidia-smi-xml"
    assert_rtx_4090(system)
    assert system.gpus[0].compute_capability == "8.9"


def test_nvml_when_the_instance_has_nvidia_ml_py(loop: LoopThread, api: httpx.Client) -> None:
    system = detect(loop, api, {"fault": "gpu_driver", "driver": "nvml"})
    assert system.source == "nvml"
    assert_rtx_4090(system)
    assert system.gpus[0].compute_capability == "8.9"


def test_csv_query_when_the_driver_is_too_old_for_the_xml_log(loop: LoopThread, api: httpx.Client) -> None:
    system = detect(loop, api, {"fault": "gpu_driver", "driver": "old"})
    assert system.source == "nvidia-smi-csv"
    assert_rtx_4090(system)
    assert system.gpus[0].compute_capability == ""  # the field this driver refused, dropped and asked again


def test_a_gpu_that_is_not_the_offer_fails_whatever_the_source(loop: LoopThread, api: httpx.Client) -> None:
    with pytest.raises(StageError, match="expected a H100 but nvidia-smi reports 'NVIDIA GeForce RTX 4090'"):
        detect(loop, api, {"fault": "gpu_driver", "driver": "nvml"}, expected="H100")
    with pytest.raises(StageError, match="expected 2 x RTX 4090 but nvidia-smi lists 1 GPU"):
        detect(loop, api, gpu_count=2)


def test_no_driver_or_a_broken_one_fails_at_ssh_connect(loop: LoopThread, api: httpx.Client) -> None:
    with pytest.raises(StageError, match="nvidia-smi is not installed on the instance: not a GPU machine") as absent:
        detect(loop, api, {"fault": "missing_tools", "tools": ["nvidia-smi"]})
    assert absent.value.stage == Stage.SSH_CONNECT
    with pytest.raises(StageError, match=r"nvidia-smi failed on the instance \(exit 9\): NVIDIA-SMI has failed"):
        detect(loop, api, broken=True)


def test_detection_answers_the_results_hardware(loop: LoopThread, api: httpx.Client) -> None:
    hardware = hardware_of(detect(loop, api, {"fault": "gpu_driver", "driver": "old"}, expected="RTX4090"))
    assert (hardware.gpu_name, hardware.gpu_memory_mib, hardware.gpu_count) == ("NVIDIA GeForce RTX 4090", 24564, 1)
    assert (hardware.driver_version, hardware.cuda_version) == ("550.54.15", "12.4")  # CUDA from the table banner
    assert hardware.cpu_cores > 0 and hardware.ram_gib > 0


def test_a_result_records_the_compute_capability_detection_found(tmp_path, standalone_sandbox: str) -> None:
    """An old driver with nvidia-ml-py: NVML gives the compute capability at ssh_connect, nvidia-smi's
    CSV query does not know it; the result keeps what detection found, with no query of its own."""
    from e2e_helpers import SANDBOX_AUTH, only_result, run_pytest

    offers = httpx.get(f"{standalone_sandbox}/api/v1/inventory", headers=SANDBOX_AUTH,
                       params={"provider": "vastai", "gpu_type": "RTX 4090"}).json()["offers"]
    for offer in offers:
        httpx.post(f"{standalone_sandbox}/sandbox/faults", headers=SANDBOX_AUTH,
                   json={"fault": "gpu_driver", "driver": "old_nvml", "offer_id": offer["id"]}).raise_for_status()
    matrix = tmp_path / "gpubench_cc.yaml"
    matrix.write_text("workload: {duration: 2s, max_tokens: 16, warmup_requests: 1}\n"
                      "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n")
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:]
    _, details = only_result(tmp_path)
    assert details["hardware"]["compute_capability"] == "8.9"
