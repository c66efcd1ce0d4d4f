"""One name and one stored copy of a cell's concurrency (issue 22 item 3): ``Cell.concurrency`` reads
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
