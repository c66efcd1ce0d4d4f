"""One cost formula (issue 10, item 3): ``measure.results.cost_per_million_tokens``.

The stored headline figure, the report's fallback for a result stored without one
and the figure registry's ``cost_per_million_tokens`` agree on every path, and no
module writes the formula a second time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pytest_gpubench.measure.results import PerformanceResults
from pytest_gpubench.figures import cost_per_million_tokens
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.store.sqlite_store import SqliteStore
from result_helpers import make_result

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_gpubench"
#: The one home of the formula.
HOME = PACKAGE / "figures.py"


def _formulas(tree: ast.AST) -> list[int]:
    """Lines of arithmetic that uses both an hour's seconds (3600) and a million (1e6)."""
    found, inner = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and id(node) not in inner:
            parts = list(ast.walk(node))
            inner.update(id(part) for part in parts if isinstance(part, ast.BinOp))
            constants = {part.value for part in parts if isinstance(part, ast.Constant)}
            if 3600 in constants and 1e6 in constants:
                found.append(node.lineno)
    return found


def test_the_cost_formula_is_written_once():
    written = {f"{path.relative_to(PACKAGE)}:{line}"
               for path in PACKAGE.rglob("*.py") for line in _formulas(ast.parse(path.read_text()))}
    assert len(written) == 1 and next(iter(written)).startswith(f"{HOME.relative_to(PACKAGE)}:"), written
    # The scan sees the usual spellings of a copy.
    assert _formulas(ast.parse("cost = price / (tps * 3600) * 1e6")) == [1]
    assert _formulas(ast.parse("cost = 1e6 * price / (3600.0 * tps)")) == [1]


def test_the_formula():
    assert cost_per_million_tokens(0.36, 100.0) == pytest.approx(1.0)
    assert cost_per_million_tokens(1.29, 37.5) == pytest.approx(9.5556, abs=1e-4)
    assert cost_per_million_tokens(2.5, 0.0) is None
    assert cost_per_million_tokens(0.0, 50.0) == 0.0


@pytest.mark.parametrize("price, tokens, seconds, per_stream", [
    (0.36, 4000, 60.0, 72.5), (1.29, 2250, 60.0, 37.5), (0.08, 12000, 100.0, 55.0),
])
def test_every_cost_per_token_agrees(tmp_path, price, tokens, seconds, per_stream):
    base = make_result(per_stream).model_copy(update={"price_per_hour": price})
    measured = base.model_copy(update={"results": base.results.model_copy(
        update={"total_tokens": tokens, "duration_seconds": seconds})})
    # No token total: the report falls back to the per-stream rate, with the same formula.
    streams_only = base.model_copy(update={"results": PerformanceResults(
        total_requests=20, avg_tokens_per_second=per_stream, duration_seconds=seconds)})
    expected = cost_per_million_tokens(price, tokens / seconds)
    assert measured.cost_analysis().cost_per_million_tokens == expected
    with SqliteStore.open(tmp_path / "m.db") as store:
        store.start_run("r", ["pytest"], [])
        for cell, result, unpriced in (("stored", measured, False), ("unpriced", measured, True),
                                       ("streams", streams_only, False)):
            row_id = store.add_cell("r", cell, gpu_type="RTX 4090", provider=cell, model="qwen2:7b",
                                    matrix_file="m.yaml")
            store.add_result(row_id, result, unpriced=unpriced)
            store.finish_cell(row_id, status="success", cost_usd=0.0)
        rows = {row.cell_id: row for row in build_report(store).results}
    assert rows["stored"].cost_per_million_tokens == pytest.approx(expected, rel=1e-12)
    assert rows["unpriced"].cost_per_million_tokens == pytest.approx(expected, rel=1e-12)
    assert rows["streams"].cost_per_million_tokens == pytest.approx(
        cost_per_million_tokens(price, per_stream), rel=1e-12)
    for cell in ("stored", "unpriced"):
        assert rows[cell].figures["cost_per_million_tokens"] == pytest.approx(expected, rel=1e-12)
