"""The gpubench summary table the terminal shows at the end of a run: one row per
finished cell, from the JUnit properties its teardown report carries."""

from __future__ import annotations

from typing import Any

COLUMNS = ("cell", "status", "tokens/s", "TTFT p50 ms", "$/M tokens", "cost $")


class SummaryTable:
    """One row per finished cell, from the properties its teardown report carries."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, properties: dict[str, Any]) -> None:
        if "gpubench_status" in properties:
            self.rows.append(properties)

    def render(self, billed: float | None = None) -> list[str]:
        """The table and a count line; ``billed`` is the run's bill from its sessions
        (a shared session once), else the cells' costs are summed."""
        table = [COLUMNS] + [
            (
                str(row.get("gpubench_cell", "")),
                _status(row),
                _tps(row),
                _fmt(row.get("gpubench_ttft_p50_ms"), "{:.0f}"),
                _fmt(row.get("gpubench_cost_per_million_tokens"), "{:.2f}"),
                _fmt(row.get("gpubench_cost_usd"), "{:.4f}"),
            )
            for row in sorted(self.rows, key=lambda r: str(r.get("gpubench_cell", "")))
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                           for i, cell in enumerate(line)) for line in table]
        total = billed if billed is not None else sum(float(r.get("gpubench_cost_usd") or 0) for r in self.rows)
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["gpubench_status"]] = counts.get(row["gpubench_status"], 0) + 1
        lines.append(", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
                     + f"; spent ${total:.4f}")
        return lines


def _status(row: dict[str, Any]) -> str:
    stage = row.get("gpubench_failure_stage")
    return f"{row['gpubench_status']} ({stage})" if stage else str(row["gpubench_status"])


def _tps(row: dict[str, Any]) -> str:
    """``195.3``, or ``195.3 ± 0.4`` over repeated runs, with ``!`` when not a valid GPU figure."""
    text = _fmt(row.get("gpubench_tokens_per_second"), "{:.1f}")
    if row.get("gpubench_tokens_per_second_std") is not None:
        text += f" ± {row['gpubench_tokens_per_second_std']:.1f}"
    return text + (" !" if row.get("gpubench_valid") is False else "")


def _fmt(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "-"
