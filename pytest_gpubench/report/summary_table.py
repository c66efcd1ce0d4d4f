"""The gpubench summary table the terminal shows at the end of a run: one row per
finished cell, from the JUnit properties its teardown report carries.

Its columns are chosen with ``--gpubench-columns`` (as pytest-benchmark's
``--benchmark-columns``): comma-separated names from
:data:`~pytest_gpubench.figures.ALLOWED_COLUMNS`, the figures of
:mod:`pytest_gpubench.figures` plus the cell's ``status`` and ``cost_usd``
(``figures.parse_columns`` reads the option). The cell id is always the first column.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..figures import CELL_COLUMNS, FIGURES, FigureSource, figure_values
from ..store.records import key_of

DEFAULT_COLUMNS: tuple[str, ...] = (
    "status", "output_tokens_per_second", "decode_tokens_per_second", "ttft_p50_ms", "cost_per_million_tokens",
    "cost_usd",
)
#: Figures marked ``!`` when the cell's figures do not describe the GPU (validity flags).
_MARKED = ("output_tokens_per_second", "decode_tokens_per_second")


class SummaryTable:
    """One row per finished cell, from the properties its teardown report carries."""

    def __init__(self, columns: Iterable[str] = DEFAULT_COLUMNS) -> None:
        self.columns = tuple(columns)
        self.rows: list[dict[str, Any]] = []

    def add(self, properties: dict[str, Any]) -> None:
        if "gpubench_status" in properties:
            self.rows.append(properties)

    def header(self) -> tuple[str, ...]:
        return ("cell", *(_header(name) for name in self.columns))

    def render(self, billed: float | None = None, exact: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """The table and a count line; ``billed`` is the run's bill from its sessions
        (a shared session once), else the cells' costs are summed.

        ``exact``: each cell's figures unrounded (by record key), as the store keeps them and
        the report reads them. The properties are rounded for JUnit (``Figure.digits``), and a
        rounded value formatted again can differ from the report in the last digit (167.3504 is
        167.35 in JUnit, which ``{:.1f}`` shows as 167.3 where the report says 167.4)."""
        exact = exact or {}
        table = [self.header()] + [
            (str(row.get("gpubench_cell", "")),
             *(_cell_text({**row, **exact.get(str(row.get("gpubench_cell", "")), {})}, name)
               for name in self.columns))
            for row in sorted(self.rows, key=lambda r: str(r.get("gpubench_cell", "")))
        ]
        left = {0} | {i + 1 for i, name in enumerate(self.columns) if _is_text(name)}
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        lines = ["  ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
                           for i, cell in enumerate(line)).rstrip() for line in table]
        total = billed if billed is not None else sum(float(r.get("gpubench_cost_usd") or 0) for r in self.rows)
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["gpubench_status"]] = counts.get(row["gpubench_status"], 0) + 1
        lines.append(", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
                     + f"; spent ${total:.4f}")
        return lines


def _header(name: str) -> str:
    return CELL_COLUMNS[name][0] if name in CELL_COLUMNS else FIGURES[name].header


def _is_text(name: str) -> bool:
    return name in ("status", "slo", "run_id")


def _cell_text(row: dict[str, Any], name: str) -> str:
    if name == "status" and row.get("gpubench_claimed_by") is not None:  # ran, or runs, in another controller
        return f"claimed by {row['gpubench_claimed_by'] or '?'} ({row.get('gpubench_claimed_status', '?')})"
    if name == "status":
        stage = row.get("gpubench_failure_stage")
        return f"{row['gpubench_status']} ({stage})" if stage else str(row["gpubench_status"])
    if name == "cost_usd":
        return _fmt(row.get("gpubench_cost_usd"), "{:.4f}")
    figure = FIGURES[name]
    value = row.get(f"gpubench_{name}")
    text = str(value) if isinstance(value, str) else _fmt(value, figure.pattern)
    if name == "decode_tokens_per_second" and row.get("gpubench_decode_tokens_per_second_std") is not None:
        text += f" ± {row['gpubench_decode_tokens_per_second_std']:.1f}"
    if name in _MARKED and row.get("gpubench_valid") is False and text != "-":
        text += " !"
    return text


def _fmt(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def exact_figures(results: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """``{record key: {"gpubench_<figure>": value}}`` from stored results (``ResultRecord``s of one
    run, oldest first: a cell's latest result wins), unrounded, for :meth:`SummaryTable.render`."""
    found: dict[str, dict[str, Any]] = {}
    for record in results:
        if record.result is None or record.run_id is None:
            continue
        key = key_of(record.row_id, record.run_id)
        values = figure_values(FigureSource(record.result, record.details, record.run_id))
        found[key] = {f"gpubench_{name}": value for name, value in values.items() if value is not None}
    return found
