"""A multi-GPU cell's server: the tensor-parallel flag each runtime's launcher takes, CUDA_VISIBLE_DEVICES
for the GPUs a provider leased, Ollama's spread, Docker's devices, and what the result records
(runtimes/base.py)."""

from __future__ import annotations

import shlex

import pytest

from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.measure.compare import fingerprint
from pytest_gpubench.remote.readings import HardwareInfo
from pytest_gpubench.runtimes.base import GpuPlacement, vram_shortfall
from pytest_gpubench.runtimes.ollama import OllamaRuntime
from pytest_gpubench.runtimes.registry import runtime_for


def cell_on(runtime: str, gpus: int):
    text = f"runtime: {runtime}\nmatrix:\n  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: {gpus}}}\n"
    (cell,) = expand(parse_matrix(text, "gpubench_gpus.yaml"))
    return cell


def launch(command: str) -> tuple[dict[str, str], list[str]]:
    """The variables set before ``nohup`` and the server's words, as the shell splits them."""
    words = shlex.split(command.split("; ", 1)[1])
    at = words.index("nohup")
    return dict(word.split("=", 1) for word in words[:at]), words[at + 1:words.index(">")]


@pytest.mark.parametrize(("runtime", "flag"), [("vllm", "--tensor-parallel-size"), ("sglang", "--tp-size"),
                                                ("tgi", "--num-shard")])
def test_a_two_gpu_cell_starts_its_server_with_the_runtimes_tensor_parallel_flag(runtime: str, flag: str) -> None:
    server = runtime_for(cell_on(runtime, 2), conn=None)
    server.remote_port = 8000
    env, argv = launch(server.serve_command("qwen2:7b", 4))
    assert argv[argv.index(flag) + 1] == "2" and argv.count(flag) == 1
    assert env == {} and server.tensor_parallel == 2  # a whole rented machine: every GPU is the cell's


def test_the_matrix_arguments_come_after_the_flag_so_a_tp_there_wins() -> None:
    text = ("runtime: {name: vllm, args: [-tp, '1']}\nmatrix:\n"
            "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2}\n")
    (cell,) = expand(parse_matrix(text, "gpubench_gpus.yaml"))
    server = runtime_for(cell, conn=None)
    _, argv = launch(server.serve_command("qwen2:7b", 1))
    assert argv[-4:] == ["--tensor-parallel-size", "2", "-tp", "1"]


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "tgi", "llamacpp"])
def test_a_one_gpu_cell_starts_its_server_as_before(runtime: str) -> None:
    server = runtime_for(cell_on(runtime, 1), conn=None)
    server.remote_port = 8000
    env, argv = launch(server.serve_command("qwen2:7b", 1))
    assert env == {} and not {"--tensor-parallel-size", "--tp-size", "--num-shard"} & set(argv)


def test_llama_cpp_spreads_layers_over_the_gpus_it_sees_without_a_flag() -> None:
    server = runtime_for(cell_on("llamacpp", 2), conn=None, gpu_indices=(2, 3))
    server.remote_port = 8080
    env, argv = launch(server.serve_command("qwen2:7b", 1))
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"} and server.tensor_parallel is None
    assert argv[:2] == ["llama-server", "-m"]


def test_the_gpus_a_provider_leased_are_the_only_ones_the_server_sees() -> None:
    server = runtime_for(cell_on("vllm", 2), conn=None, gpu_indices=(4, 5))
    server.remote_port = 8000
    env, argv = launch(server.serve_command("qwen2:7b", 1))
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5"}
    assert "--tensor-parallel-size" in argv
    one = runtime_for(cell_on("vllm", 1), conn=None, gpu_indices=(7,))
    one.remote_port = 8000
    assert launch(one.serve_command("qwen2:7b", 1))[0] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                            "CUDA_VISIBLE_DEVICES": "7"}


def test_ollama_sees_the_leased_gpus_and_spreads_a_multi_gpu_cells_model_over_them() -> None:
    two = runtime_for(cell_on("ollama", 2), conn=None, gpu_indices=(0, 1))
    assert isinstance(two, OllamaRuntime)
    assert two.server_environment(4) == ("OLLAMA_HOST=127.0.0.1:11434 OLLAMA_NUM_PARALLEL=4 OLLAMA_SCHED_SPREAD=1 "
                                         "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 ")
    one = runtime_for(cell_on("ollama", 1), conn=None)
    # As before for one GPU, and it listens on the instance's loopback only (issue 21 item 4).
    assert one.server_environment(1) == "OLLAMA_HOST=127.0.0.1:11434 OLLAMA_NUM_PARALLEL=1 "


def test_docker_gets_the_devices_as_one_quoted_csv_field() -> None:
    assert GpuPlacement.of(1).docker_devices == "device=0"
    assert GpuPlacement.of(2).docker_devices == '"device=0,1"'
    assert GpuPlacement.of(2, (3, 6)).docker_devices == '"device=3,6"'


@pytest.mark.parametrize(("count", "indices", "problem"), [
    (2, (1,), "spans 2 GPUs but was given 1"), (1, (0, 0), "not distinct"), (1, (-1,), "not distinct whole")])
def test_a_placement_that_cannot_hold_the_cell_is_refused(count: int, indices: tuple[int, ...], problem: str) -> None:
    with pytest.raises(StageError) as info:
        GpuPlacement.of(count, indices)
    assert info.value.stage is Stage.RUNTIME_SETUP and problem in str(info.value)


def test_the_result_records_the_gpus_and_the_fingerprint_stands_alone() -> None:
    assert GpuPlacement.of(2, (0, 1)).describe(2) == {"count": 2, "tensor_parallel": 2, "visible_devices": "0,1"}
    common = dict(prompts=["hi"], max_tokens=64, concurrency=1, rate=None, think=None, warmup_requests=1,
                  runtime="vllm", runtime_version="0.10.1.1")
    one, two = fingerprint(**common), fingerprint(**common, gpus=2)
    assert "gpus" not in one.fields and one.hash == fingerprint(**common, gpus=1).hash  # one-GPU hashes as before
    assert two.fields["gpus"] == 2 and two.hash != one.hash


def test_the_vram_check_counts_the_cells_gpus() -> None:
    two_cards = HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_mib=24564, gpu_count=2)
    assert vram_shortfall("big:40b", 40, two_cards, gpus=2) is None
    assert "needs 40 GB" in (vram_shortfall("big:40b", 40, two_cards, gpus=1) or "")
    eight_cards = HardwareInfo(gpu_name="NVIDIA H200 NVL", gpu_memory_mib=143771, gpu_count=8)
    assert "8 x 143771 MiB" in (vram_shortfall("huge", 2000, eight_cards, gpus=8) or "")


def test_only_the_cells_gpus_are_its_readings_on_a_shared_machine() -> None:
    assert all(GpuPlacement.of(2).owns(i) for i in range(8))  # a rented machine: every GPU is the cell's
    leased = GpuPlacement.of(2, (2, 3))
    assert [i for i in range(8) if leased.owns(i)] == [2, 3]


def test_a_measurement_keeps_the_readings_of_the_cells_gpus_only() -> None:
    from pytest_gpubench.measure.repeats import _own_gpus
    from pytest_gpubench.remote.telemetry import GpuSample

    samples = [GpuSample(t=1.0, gpu=i, utilization_pct=90.0 if i == 1 else 5.0) for i in range(4)]
    leased = OllamaRuntime(conn=None, placement=GpuPlacement.of(1, (1,)))
    assert [s.gpu for s in _own_gpus(samples, leased)] == [1]
    assert len(_own_gpus(samples, OllamaRuntime(conn=None))) == 4  # a rented machine: all of them


def test_a_one_gpu_cell_leasing_the_whole_machine_gives_its_server_only_one_gpu() -> None:
    """Ollama and workers lease every GPU of a host (one server per machine) but span the cell's ``gpus``."""
    assert GpuPlacement.of(1, (0, 1)).visible_devices == "0" and GpuPlacement.of(2, (3, 1, 2)).indices == (3, 1)
    ollama = runtime_for(cell_on("ollama", 1), conn=None, gpu_indices=(0, 1))
    assert ollama.server_environment(1).endswith("CUDA_VISIBLE_DEVICES=0 ")
    assert GpuPlacement.of(1, (2, 3)).docker_devices == "device=2"
