"""The sandbox's stand-ins on a multi-GPU instance: the launchers' tensor-parallel flags against the GPUs
``CUDA_VISIBLE_DEVICES`` leaves them, the model's memory per GPU in nvidia-smi, and the faster decode
of tensor parallelism (sandbox/openai_launchers.py, sandbox/nvidia_smi_standin.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from sandbox_session import connect, new_session
from standin_helpers import CATALOG, standin_env, write_instance

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.runtimes.registry import runtime_for
from pytest_gpubench.sandbox.instance_spec import GpuSpec, load_instance_spec, visible_gpus
from pytest_gpubench.sandbox.instances import free_port
from pytest_gpubench.sandbox.openai_launchers import parse
from pytest_gpubench.sandbox.openai_launchers import LauncherEngine, tensor_parallel_speedup

MODEL = "qwen2:7b"
LAUNCHER = [sys.executable, "-m", "pytest_gpubench.sandbox.openai_launchers"]


def instance_with(tmp_path: Path, gpus: int) -> Path:
    path = write_instance(tmp_path)
    document = json.loads(path.read_text())
    document["gpu"]["count"] = gpus
    path.write_text(json.dumps(document))
    return path


def memory_used(instance: Path) -> list[int]:
    """nvidia-smi's memory.used per GPU (it ignores CUDA_VISIBLE_DEVICES, as the real one does)."""
    out = subprocess.run([sys.executable, "-m", "pytest_gpubench.sandbox.nvidia_smi_standin",
                          "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         env=standin_env(instance, 0, CUDA_VISIBLE_DEVICES="0"), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return [int(line.split(",")[1]) for line in out.strip().splitlines()]


def launch(instance: Path, args: list[str], **env: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    server = subprocess.Popen([*LAUNCHER, *args, "--port", str(port)], env=standin_env(instance, port, **env),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return server, port


def serving(server: subprocess.Popen[str], port: int, instance: Path) -> list[int]:
    """Wait until the server answers /health and its state is written; nvidia-smi's memory then."""
    def ready() -> bool:
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False
    wait_for(ready, 60, "the launcher to be ready")
    def loaded() -> list[int] | None:
        used = memory_used(instance)
        return used if max(used) > 1000 else None
    return wait_for(loaded, 30, "the model's memory in nvidia-smi")


def stop(server: subprocess.Popen[str]) -> None:
    server.terminate()
    assert server.wait(10) == 0


@pytest.mark.parametrize(("args", "devices", "expected"), [
    (["vllm", "serve", MODEL, "--tensor-parallel-size", "2"], None, "both"),
    (["sglang", "--model-path", MODEL, "--tp-size", "2"], "2,3", "2,3"),
    (["text-generation-launcher", "--model-id", MODEL, "--num-shard", "2"], "1,3", "1,3"),
    (["vllm", "serve", MODEL], "3", "3"),
    (["llama-server", "-m", f"/models/{MODEL}.gguf"], "0,2", "0,2"),
])
def test_the_model_is_spread_over_the_tensor_parallel_group_of_the_gpus_it_sees(
        tmp_path: Path, args: list[str], devices: str | None, expected: str) -> None:
    instance = instance_with(tmp_path, 4 if devices else 2)
    env = {"CUDA_VISIBLE_DEVICES": devices} if devices else {}
    server, port = launch(instance, args, **env)
    try:
        used = serving(server, port, instance)
    finally:
        stop(server)
    holding = [i for i, mib in enumerate(used) if mib > 1000]
    assert holding == ([0, 1] if expected == "both" else [int(i) for i in expected.split(",")])
    assert len({used[i] for i in holding}) == 1  # split evenly
    assert all(mib < 1000 for i, mib in enumerate(used) if i not in holding)  # the baseline only


@pytest.mark.parametrize(("args", "devices", "message"), [
    (["vllm", "serve", MODEL, "-tp", "4"], None,
     "The number of required GPUs exceeds the total number of available GPUs in the placement group. "
     "(tensor_parallel_size=4, GPUs=2)"),
    (["vllm", "serve", MODEL, "--tensor-parallel-size", "2"], "1",
     "(tensor_parallel_size=2, GPUs=1)"),
    (["sglang", "--model-path", MODEL, "--tp", "2"], "5", "No CUDA GPUs are available"),
    (["text-generation-launcher", "--model-id", MODEL, "--num-shard", "2"], "0",
     "Error: `num_shard` (2) is greater than the number of GPUs (1)"),
])
def test_a_tensor_parallel_size_over_the_visible_gpus_is_refused_in_the_servers_words(
        tmp_path: Path, args: list[str], devices: str | None, message: str) -> None:
    instance = instance_with(tmp_path, 2)
    env = {"CUDA_VISIBLE_DEVICES": devices} if devices else {}
    result = subprocess.run([*LAUNCHER, *args, "--port", str(free_port())],
                            env=standin_env(instance, 0, **env), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_cuda_visible_devices_is_read_as_cuda_reads_it() -> None:
    gpu = GpuSpec(gpu_type="RTX 4090", name="NVIDIA GeForce RTX 4090", memory_mib=24564, count=4,
                  driver_version="550", cuda_version="12.4", power_limit_w=450, compute_capability="8.9")
    assert visible_gpus(gpu, {}) == (0, 1, 2, 3)
    assert visible_gpus(gpu, {"CUDA_VISIBLE_DEVICES": "2,0"}) == (2, 0)
    assert visible_gpus(gpu, {"CUDA_VISIBLE_DEVICES": "1,7,2"}) == (1,)  # enumeration ends at a GPU that is not there
    assert visible_gpus(gpu, {"CUDA_VISIBLE_DEVICES": ""}) == ()


def test_tensor_parallelism_decodes_faster_by_the_documented_estimate(tmp_path: Path, monkeypatch) -> None:
    instance = instance_with(tmp_path, 8)
    monkeypatch.setenv("GPUBENCH_SANDBOX_INSTANCE", str(instance))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = load_instance_spec()
    model = spec.models[MODEL]
    assert model.tokens_per_second == CATALOG[MODEL]["tokens_per_second"]
    rates = {size: LauncherEngine(spec, parse("vllm", ["serve", MODEL, "-tp", str(size)]), model)
             .model_spec.tokens_per_second for size in (1, 2, 4, 8)}
    assert rates[1] == model.tokens_per_second  # one GPU: the catalog's rate
    assert rates[2] / rates[1] == pytest.approx(2 ** 0.5) == tensor_parallel_speedup(2)
    assert 1.38 <= rates[2] / rates[1] <= 1.47  # the measured 2x RTX 4090 range the estimate is anchored on
    assert rates[1] < rates[2] < rates[4] < rates[8] < 8 * rates[1]


@pytest.mark.parametrize(("devices", "status", "said"), [
    ('"device=0,1"', 0, "on GPU 0,1"),  # what WorkerRuntime passes for two GPUs: one quoted CSV field
    ('"device=0,2"', 125, "device 2 not found"),
])
def test_docker_gives_a_worker_the_devices_of_the_machine_and_refuses_others(
        tmp_path: Path, devices: str, status: int, said: str) -> None:
    instance = instance_with(tmp_path, 2)
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.sandbox.docker_standin", "run", "--rm", "-i",
                           "--gpus", devices, "-e", f"MODEL_NAME={MODEL}", "-e", "GPU_DEVICE=0,1", "worker:1"],
                          env=standin_env(instance, 0), input="", capture_output=True, text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert said in done.stdout + done.stderr


def test_over_ssh_a_server_started_for_leased_gpus_holds_the_model_on_those_only(api: httpx.Client) -> None:
    """The runtime's CUDA_VISIBLE_DEVICES reaches the server on a real instance (a 2x RTX 4090 sandbox
    session), nvidia-smi shows the model on the leased GPU, and the model's size is read from it alone."""
    session, key = new_session(api, offer_id="vastai-18430204")
    cell = next(c for c in expand(parse_matrix(
        "runtime: vllm\nmatrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n", "gpubench_x.yaml")))
    loop = LoopThread("leased-gpus")
    try:
        conn = loop.run(connect(session, key), 60)

        async def scenario() -> tuple[list[int], int]:
            runtime = runtime_for(cell, conn, gpu_indices=(1,))
            try:
                await runtime.locate(30)
                await runtime.ensure_serving(120)
                await runtime.pull(cell.model, 120)
                smi = await conn.run("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits",
                                     stage=Stage.BENCHMARK, what="nvidia-smi", timeout=30)
                return [int(x) for x in smi.stdout.split()], (await runtime.model_info(cell.model)).size_bytes
            finally:
                await runtime.stop(30)

        used, size = loop.run(scenario(), 300)
        loop.run(conn.close(), 15)
    finally:
        loop.close()
    assert used[0] < 1000 < used[1]  # the model on GPU 1, the leased one; GPU 0 at its baseline
    assert size > 0 and size // (1024 * 1024) <= used[1]
