"""One name and one stored copy of a cell's concurrency and rate (issue 22 item 3): ``Cell.concurrency`` reads
``workload.concurrency``, the only copy; GPU Shopper's ``concurrent_reqs`` is spoken only at its boundary."""

from __future__ import annotations

from pathlib import Path

from pytest_gpubench.matrix.cells import Cell, load_cells
from pytest_gpubench.matrix.workload import Workload


def test_a_cells_concurrency_is_stored_once_in_its_workload(tmp_path: Path) -> None:
    path = tmp_path / "gpubench_load.yaml"
    path.write_text("name: load\nworkload: {concurrency: [1, 8]}\n"
                    "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    one, eight = load_cells(path)
    assert "concurrency" not in Cell.model_fields and "concurrency" not in eight.model_dump()
    assert (one.concurrency, eight.concurrency) == (1, 8) and eight.workload.concurrency == (8,)
    assert eight.cell_id.endswith("-c8")
    # Whatever changes the workload changes the one value: no second copy to keep equal.
    assert eight.model_copy(update={"workload": Workload(concurrency=(4,))}).concurrency == 4


def test_a_cells_rate_is_stored_once_in_its_workload(tmp_path: Path) -> None:
    path = tmp_path / "gpubench_rate.yaml"
    path.write_text("name: rate\nworkload: {rate: [0.5, 2.5]}\n"
                    "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    half, more = load_cells(path)
    assert "rate" not in Cell.model_fields and "rate" not in more.model_dump()
    assert (half.rate, more.rate) == (0.5, 2.5) and more.workload.rate == (2.5,) and more.concurrency == 1
    assert more.cell_id.endswith("-r2.5")
    assert more.model_copy(update={"workload": Workload(rate=(4.0,))}).rate == 4.0
    # A concurrency cell has no rate, and a sweep cell's rates are its steps'.
    assert load_cells_text(tmp_path, "workload: {concurrency: 2}").rate is None
    sweep = load_cells_text(tmp_path, "slo: {ttft_ms: 500}\nworkload: {rate: sweep}")
    assert sweep.rate is None and sweep.workload.rate == "sweep" and sweep.cell_id.endswith("-sweep")


def load_cells_text(tmp_path: Path, head: str) -> Cell:
    path = tmp_path / "gpubench_one.yaml"
    path.write_text(f"name: one\n{head}\nmatrix:\n  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}}\n")
    (cell,) = load_cells(path)
    return cell
