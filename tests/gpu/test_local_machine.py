"""``cloud: local`` on this machine's real NVIDIA GPU, end to end (README, "Tests on a GPU").

One run (``local_run``, tests/gpu_run.py) of a microbenchmark-only matrix for this machine's GPU:
no model, nothing from the network. Then: the cell succeeded through every stage; NVML, the
real ``nvidia-smi -q -x`` and its CSV query agree; the memory bandwidth and fp16/bf16 matmul
figures are a plausible share of the datasheet peak (printed); nvidia-smi's telemetry during
the run is stored for the cell and plausible; and the host is as the run found it (GPU settings,
memory, processes, files). Every read of the GPU is a query: nothing here sets a clock, a power
limit, persistence or the compute mode, and nothing resets the GPU.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from gpu_run import MEMORY_TOLERANCE_MIB, LocalRun
from pytest_gpubench.measure.gpucheck import (
    BOUNDS,
    ESSENTIAL_FIGURES,
    compare_facts,
    host_differences,
    missing_figures,
    outside_bounds,
    peak_shares,
)
from pytest_gpubench.measure.microbench import peaks_for, peaks_for_product
from pytest_gpubench.remote.local import LocalShell
from pytest_gpubench.remote.sysinfo import GpuFacts
from pytest_gpubench.remote.sysinfo import facts_by_source
from pytest_gpubench.store.sqlite_store import SqliteStore


@pytest.fixture
def store(local_run: LocalRun) -> Iterator[SqliteStore]:
    with SqliteStore.open(local_run.manifest) as opened:
        yield opened


def only_cell(store: SqliteStore):
    (cell,) = store.cells()
    return cell


def test_a_local_microbench_cell_runs_end_to_end_on_this_gpu(local_run: LocalRun, store: SqliteStore) -> None:
    print(f"{local_run.product} (cloud: local offers it as {local_run.gpu!r}): the run took "
          f"{local_run.wall_s:.1f} s, its GPU memory was back in {local_run.settle_s:.1f} s")
    assert local_run.returncode == 0, local_run.output[-6000:]
    cell = only_cell(store)
    assert (cell.status, cell.provider, cell.model) == ("success", "local", "microbench"), cell.error_message
    assert {"ssh_connect", "runtime_setup", "benchmark"} <= set(cell.stage_seconds)
    print("stages (s):", {stage: round(seconds, 2) for stage, seconds in cell.stage_seconds.items()})


def test_nvml_and_the_real_nvidia_smi_agree(local_run: LocalRun, store: SqliteStore) -> None:
    """The three sources system detection reads, each asked through the plugin's own code on a local
    shell, give the same name, UUID, PCI bus id, memory, driver, CUDA version, power limit and max clocks."""

    async def ask() -> dict[str, GpuFacts | None]:
        shell = LocalShell.open()
        try:
            return await facts_by_source(shell, 60)
        finally:
            await shell.close()

    facts = asyncio.run(ask())
    for source, found in facts.items():
        assert found is not None, f"{source} gave nothing"
        print(source, found.driver_version, found.cuda_version, found.gpus[0].model_dump())
    nvml = facts["nvml"]
    assert nvml is not None and nvml.gpus
    # What NVML gives, nvidia-smi must give too (a data-center card reports its power limit and clocks).
    wanted = (*ESSENTIAL_FIGURES, *(field for field in ("power_limit_w", "sm_clock_max_mhz", "mem_clock_max_mhz")
                                    if getattr(nvml.gpus[0], field) is not None))
    for source in ("nvml", "nvidia-smi-xml", "nvidia-smi-csv"):
        assert missing_figures(facts[source], wanted) == [], source
    assert compare_facts(nvml, facts["nvidia-smi-xml"]) == []
    assert compare_facts(nvml, facts["nvidia-smi-csv"]) == []
    # The cell's own detection (stored) went through NVML and found one of these GPUs, as NVML does.
    (system,) = store.systems()
    assert system.system.source == "nvml"
    by_uuid = {gpu.uuid: gpu for gpu in nvml.gpus}
    detected = system.system.gpus[0]
    assert detected.uuid in by_uuid and detected.name == by_uuid[detected.uuid].name
    assert system.system.driver_version == nvml.driver_version


def test_the_microbenchmarks_are_a_plausible_share_of_the_datasheet(local_run: LocalRun,
                                                                     store: SqliteStore) -> None:
    figures = {record.label: record for record in store.microbench()}
    for record in figures.values():
        print(f"{record.label}: {record.value} {record.unit} (cv {record.cv}, n {record.n})"
              + (f" skipped: {record.skipped}" if record.skipped else ""))
    assert {"memory_bandwidth", "matmul_fp16", "matmul_bf16"} <= set(figures)
    assert all(figures[label].value for label in ("memory_bandwidth", "matmul_fp16", "matmul_bf16")), figures
    peaks = peaks_for_product(local_run.product)
    if peaks is None:
        pytest.skip(f"no datasheet figures for {local_run.product!r} in measure/microbench.py: measured only")
    shares = peak_shares(figures.values(), peaks)
    for share in shares:
        print(share.line())
    print(f"datasheet: {peaks.gpu} ({peaks.source}); bounds: {BOUNDS}")
    assert {share.label for share in shares} >= {"memory_bandwidth", "matmul_fp16", "matmul_bf16"}
    assert outside_bounds(shares) == []
    # The cell's own % of peak (the report's, the progress file's) found the same datasheet line,
    # except for a card whose GPU type is ambiguous (an H100 PCIe is offered as "H100").
    if peaks_for(local_run.gpu) is not None:
        assert peaks_for(local_run.gpu) == peaks


def test_telemetry_during_the_run_is_stored_for_the_cell(local_run: LocalRun, store: SqliteStore) -> None:
    cell = only_cell(store)
    samples = store.manifest.gpu_samples(row_id=cell.row_id)
    print(f"{len(samples)} samples; first {samples[:1]}, last {samples[-1:]}")
    assert samples, "no telemetry sample stored for the cell"
    (system,) = store.systems()
    gpu = system.system.gpus[0]
    assert {sample["gpu"] for sample in samples} == {gpu.index}  # the cell's GPU only
    limit = gpu.power_limit_w or 1500.0
    total = gpu.memory_total_mib or 1 << 20
    for sample in samples:
        assert local_run.started_at - 5 <= sample["t"] <= local_run.ended_at + 5, sample
        assert sample["utilization_pct"] is not None and 0 <= sample["utilization_pct"] <= 100, sample
        assert sample["power_draw_w"] is not None and 0 < sample["power_draw_w"] <= 1.25 * limit, sample
        assert sample["memory_used_mib"] is not None and 0 <= sample["memory_used_mib"] <= total, sample
    before = next(state.memory_used_mib for state in local_run.before.gpus if state.index == gpu.index) or 0
    busiest = max(sample["memory_used_mib"] for sample in samples)
    print(f"memory in use: {before} MiB before the run, up to {busiest} MiB during it; utilization up to "
          f"{max(s['utilization_pct'] for s in samples)}%, power up to {max(s['power_draw_w'] for s in samples)} W "
          f"(limit {limit} W)")
    # The benchmark holds 4 GiB of copy buffers and three 16384-square matrices on the GPU.
    assert busiest >= before + 1024
    assert max(sample["utilization_pct"] for sample in samples) > 0


def test_the_host_is_left_as_found(local_run: LocalRun) -> None:
    """GPU settings (persistence, compute mode, power limit, application clocks, MIG, ECC) unchanged,
    GPU memory back within the tolerance, no new GPU process, none of the run's processes alive, no
    new file in /tmp, /dev/shm, the home or the working directory but gpubench's own home."""
    differences = host_differences(local_run.before, local_run.after, memory_tolerance_mib=MEMORY_TOLERANCE_MIB,
                                   allowed=local_run.allowed)
    for before in local_run.before.gpus:
        print(f"GPU {before.index}: {before.memory_used_mib} MiB in use before, settings {before.settings}")
    for after in local_run.after.gpus:
        print(f"GPU {after.index}: {after.memory_used_mib} MiB in use after ({local_run.settle_s:.1f} s to settle)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Other tests of this session write to /tmp and the home meanwhile: files are only checked alone.
        differences = [line for line in differences if not line.startswith("left behind:")]
        print("files not checked: run tests/gpu alone (README, 'Tests on a GPU') for that")
    assert local_run.before.run_processes == frozenset()
    assert differences == []
