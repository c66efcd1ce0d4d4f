"""``microbench:`` in a matrix (matrix/cells.py): its cells, their settings, and the errors
that name the file, the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import load_cells
from pytest_gpubench.matrix.cells import KINDS, PRECISIONS


def cells(tmp_path: Path, rows: str, head: str = ""):
    path = tmp_path / "gpubench_micro.yaml"
    path.write_text("name: micro\n" + head + "matrix:\n" + rows)
    return load_cells(path)


def error(tmp_path: Path, rows: str, head: str = "") -> str:
    with pytest.raises(MatrixError) as caught:
        cells(tmp_path, rows, head)
    return str(caught.value)


def test_a_row_without_models_gives_one_microbench_cell_per_provider_with_the_defaults(tmp_path: Path) -> None:
    found = cells(tmp_path, "  - {gpu: RTX 4090, providers: [vastai, tensordock], "
                            "microbench: [memory_bandwidth, matmul]}\n")
    assert [c.cell_id for c in found] == ["RTX_4090-vastai-microbench", "RTX_4090-tensordock-microbench"]
    cell = found[0]
    assert cell.microbench is not None and cell.microbench.kinds == KINDS
    assert (cell.microbench.runs, cell.microbench.warmup, cell.microbench.precisions) == (5, 2, PRECISIONS)
    # Its own session: a model server an earlier cell of the group left running would share the GPU.
    assert (cell.reuse, cell.session_group, cell.vram_gb, cell.model) == ("cell", None, 0, "microbench")


def test_microbench_beside_models_adds_its_cell_after_the_model_cells(tmp_path: Path) -> None:
    found = cells(tmp_path, "  - {gpu: RTX 4090, provider: vastai, models: ['qwen2:7b'], microbench: [matmul]}\n")
    assert [c.cell_id for c in found] == ["RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-microbench"]
    assert found[0].microbench is None and found[1].microbench.kinds == ("matmul",)


def test_the_mapping_form_sets_runs_sizes_and_precisions_in_canonical_order(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "  - {gpu: A100 80GB, provider: vastai, microbench: {kinds: matmul, runs: 3, warmup: 0, "
                              "matmul_size: 4096, memory_mib: 64, precisions: [BF16, fp16, bf16]}}\n")
    spec = cell.microbench
    assert (spec.kinds, spec.runs, spec.warmup, spec.matmul_size, spec.memory_mib) == (("matmul",), 3, 0, 4096, 64)
    assert spec.precisions == ("fp16", "bf16")


def test_an_unknown_kind_names_file_field_and_allowed_values(tmp_path: Path) -> None:
    text = error(tmp_path, "  - {gpu: RTX 4090, provider: vastai, microbench: [memory_bandwith]}\n")
    assert "gpubench_micro.yaml" in text and "matrix[0].microbench" in text
    assert "'memory_bandwith'" in text and "did you mean 'memory_bandwidth'" in text
    assert "allowed: memory_bandwidth, matmul" in text


def test_an_unknown_precision_and_a_bad_size_are_refused(tmp_path: Path) -> None:
    text = error(tmp_path, "  - {gpu: RTX 4090, provider: vastai, microbench: {precisions: [fp4]}}\n")
    assert "matrix[0].microbench.precisions" in text and "allowed: fp32, tf32, fp16, bf16, fp8, int8" in text
    text = error(tmp_path, "  - {gpu: RTX 4090, provider: vastai, microbench: {matmul_size: 1000}}\n")
    assert "multiple of 16" in text
    text = error(tmp_path, "  - {gpu: RTX 4090, provider: vastai, microbench: {runs: 1}}\n")
    assert "matrix[0].microbench.runs" in text and "from 2 to 100" in text


def test_a_row_needs_a_model_or_microbench_and_an_endpoint_has_no_gpu_to_measure(tmp_path: Path) -> None:
    assert "`microbench: [...]`" in error(tmp_path, "  - {gpu: RTX 4090, provider: vastai}\n")
    text = error(tmp_path, "  - {gpu: RTX 4090, model: 'qwen2:7b', microbench: [matmul], "
                           "runtime: {name: openai, endpoint: 'http://127.0.0.1:8000'}}\n")
    assert "matrix[0].microbench" in text and "running endpoint" in text


def test_two_rows_measuring_one_gpu_and_provider_are_duplicates(tmp_path: Path) -> None:
    text = error(tmp_path, "  - {gpu: RTX 4090, provider: vastai, microbench: [matmul]}\n"
                           "  - {gpu: RTX 4090, provider: vastai, microbench: [memory_bandwidth]}\n")
    assert "duplicate cell RTX_4090-vastai-microbench" in text and "matrix[0]" in text


def test_a_microbench_cell_on_hosts_has_the_rows_inventory_and_leases_one_gpu(tmp_path: Path) -> None:
    from pytest_gpubench.cloud.hosts_provider import Machine, leased
    from pytest_gpubench.cloud.provider import Constraints

    found = cells(tmp_path, "  - {gpu: RTX 4090, provider: lab1, gpus: 2, models: ['qwen2:7b'], microbench: [matmul]}\n",
                  head="cloud: hosts\nhosts: hosts.yaml\n")
    model_cell, micro = found
    assert micro.microbench is not None
    assert (micro.cloud, micro.hosts_file, micro.reuse) == ("hosts", model_cell.hosts_file, "cell")
    assert micro.hosts_file == str((tmp_path / "hosts.yaml").resolve())
    # One GPU of a two-GPU machine, whatever the row's gpus and runtime (Ollama's cells lease the machine).
    machine = Machine("lab1", "lab1", "RTX 4090", 2, 0.0)
    assert micro.gpus == 1
    for cell, count in ((micro, 1), (model_cell, 2)):
        wanted = Constraints.for_cell(cell)
        assert leased(machine, wanted.gpu_count, wanted.runtime) == count
