"""The manifest's ``microbench_figures`` table: a microbenchmark cell's figures, one row each.

A microbenchmark cell has no BenchmarkResult (no model, no tokens), so its figures are
not a result's ``details`` but rows of their own, one per figure (``memory_bandwidth``,
``matmul_fp16``...), queryable in ``gpubench browse`` beside the cell's manifest row:
the mean the report shows, the runs' spread and confidence interval, the runs
themselves (JSON), or why the figure was skipped.
"""

from __future__ import annotations

import json
from typing import Any

from ..measure.microbench import MicrobenchRun
from .sqlite import ManifestStore, utc_now

class MicrobenchMixin(ManifestStore):
    """Microbenchmark figures of cells; the cell rows themselves are the manifest's."""

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        """Store ``run``'s figures for cell ``row_id``, replacing any stored before; how many."""
        created = utc_now()

        def store() -> int:
            cell = self._cell_or_raise(row_id)
            rows = [_row(cell, created, run, figure) for figure in run.figures]
            table = self.db.table("microbench_figures")
            table.delete_where("manifest_id = ?", [row_id])
            if rows:
                table.insert_all(rows)
            return len(rows)

        return self._write(store)

    def microbench_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The figures of one run (or all), in the order they were stored."""
        return self._rows("microbench_figures", run_id)


def _row(cell: dict[str, Any], created: str, run: MicrobenchRun, figure: Any) -> dict[str, Any]:
    stats = figure.stats
    return {
        "manifest_id": cell["id"], "run_id": cell["run_id"], "created_at": created, "gpu_type": cell["gpu_type"],
        "provider": cell["provider"], "label": figure.label, "kind": figure.kind, "precision": figure.precision,
        "unit": figure.unit, "value": figure.value, "std": stats.std if stats else None,
        "cv": stats.cv if stats else None, "n": stats.n if stats else 0,
        "ci_low": stats.ci_low if stats else None, "ci_high": stats.ci_high if stats else None,
        "values_json": json.dumps(list(stats.values)) if stats else "[]", "skipped": figure.skipped,
        "device": run.device, "capability": run.capability, "torch_version": run.torch_version,
    }
