"""``gpus:`` in a matrix: the cell's GPU count, its id and reuse group, selection, and the errors
that name the allowed values (docs/matrix.md, "Multi-GPU cells")."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import load_cells, select_cells
from pytest_gpubench.matrix.selection import reuse_group_name


def cells(tmp_path: Path, text: str):
    path = tmp_path / "gpubench_gpus.yaml"
    path.write_text(text)
    return load_cells(path)


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(MatrixError) as caught:
        cells(tmp_path, text)
    return str(caught.value)


def test_a_row_spans_gpus_with_its_own_id_and_one_gpu_ids_stay_as_they_were(tmp_path: Path) -> None:
    one, two, two_c8 = cells(tmp_path, """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2, workload: {concurrency: [1, 8]}}
""")
    assert (one.gpus, one.cell_id) == (1, "RTX_4090-vastai-qwen2:7b")
    assert (two.gpus, two.cell_id) == (2, "RTX_4090-vastai-qwen2:7b-x2")
    assert two_c8.cell_id == "RTX_4090-vastai-qwen2:7b-x2-c8"


def test_two_gpu_cells_never_share_a_session_with_one_gpu_cells(tmp_path: Path) -> None:
    one, two, eight = cells(tmp_path, """
runtime: vllm
matrix:
  - {gpu: H200 NVL, provider: vastai, model: 'qwen2:7b'}
  - {gpu: H200 NVL, provider: vastai, model: 'qwen2:7b', gpus: 2}
  - {gpu: H200 NVL, provider: vastai, model: 'qwen2:7b', gpus: 8, offer: {template: abc}}
""")
    assert one.reuse_group == "H200_NVL-vastai-runtime_vllm"
    assert two.reuse_group == two.session_group == "H200_NVL-vastai-x2-runtime_vllm"
    assert eight.reuse_group == "H200_NVL-vastai-x8-tabc-runtime_vllm"
    assert reuse_group_name("RTX 4090", "vastai") == "RTX_4090-vastai"


def test_the_file_sets_gpus_for_every_row_and_a_row_overrides_it(tmp_path: Path) -> None:
    four, one = cells(tmp_path, """
gpus: 4
matrix:
  - {gpu: A100 80GB, provider: vastai, model: 'qwen2:7b'}
  - {gpu: A100 80GB, provider: vastai, model: 'qwen2:7b', gpus: 1}
""")
    assert (four.gpus, four.cell_id) == (4, "A100_80GB-vastai-qwen2:7b-x4")
    assert (one.gpus, one.cell_id) == (1, "A100_80GB-vastai-qwen2:7b")


def test_the_same_model_on_one_and_two_gpus_is_no_duplicate_but_twice_on_two_is(tmp_path: Path) -> None:
    message = error(tmp_path, """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2}
""")
    assert "matrix[2]" in message
    assert "duplicate cell RTX_4090-vastai-qwen2:7b-x2 (2x RTX 4090 / vastai / qwen2:7b)" in message
    assert "already in matrix[0]" in message


@pytest.mark.parametrize("value", ["3", "0", "16", "'2'", "true", "1.5"])
def test_a_gpu_count_other_than_1_2_4_or_8_names_the_allowed_values(tmp_path: Path, value: str) -> None:
    message = error(tmp_path, f"""
matrix:
  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: {value}}}
""")
    assert "matrix[0].gpus: must be one of 1, 2, 4, 8" in message
    assert "(line 3)" in message


def test_the_files_gpus_is_checked_too(tmp_path: Path) -> None:
    assert "gpus: must be one of 1, 2, 4, 8" in error(tmp_path, """
gpus: 6
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
""")


def test_a_running_endpoint_cannot_span_gpus(tmp_path: Path) -> None:
    message = error(tmp_path, """
matrix:
  - {gpu: RTX 4090, model: 'qwen2:7b', gpus: 2, runtime: {name: openai, endpoint: 'http://127.0.0.1:8000'}}
""")
    assert "matrix[0].gpus" in message and "already up" in message


def test_gpu_and_keyword_selection_still_find_multi_gpu_cells(tmp_path: Path) -> None:
    found = cells(tmp_path, """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2}
  - {gpu: A100 80GB, provider: vastai, model: 'qwen2:7b', gpus: 2}
""")
    assert [c.cell_id for c in select_cells(found, gpus=["RTX4090"])] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-x2"]


def test_entrypoint_mode_cannot_span_gpus(tmp_path: Path) -> None:
    message = error(tmp_path, """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2, runtime: {name: vllm, launch: {mode: entrypoint}}}
""")
    assert "matrix[0].gpus" in message and "cannot ask the image's server for tensor parallelism" in message
