"""``concurrency: sweep`` (issue 23 item 1): the stopping rule (measure/saturation.py's
ConcurrencySearch), what a matrix may write and the errors that name file, field and what is
allowed, the server's batch limit (``runtime.batch_limit``, item 9), and the plan's step count."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from matrix_text import load_matrix, matrix_error
from pytest_gpubench.cloud.reuse_split import planned_benchmark_seconds, reservation_seconds
from pytest_gpubench.matrix.cells import RATE_BATCH_LIMIT, apply_overrides, load_cells
from pytest_gpubench.matrix.workload import SweepSpec, doubling_levels
from pytest_gpubench.measure.saturation import ConcurrencySearch, sweep_identity
from pytest_gpubench.matrix.thresholds import Slo
from pytest_gpubench.plugin.fixtures import server_parallelism
from pytest_gpubench.settings import Settings


def run(search: ConcurrencySearch, throughput, goodput=lambda c: None) -> list[int]:
    levels = []
    while (level := search.next_concurrency()) is not None:
        levels.append(level)
        search.record(level, throughput(level), goodput(level))
        assert len(levels) <= 20, "the sweep must end"
    return levels


def batching(ceiling_factor: float, single: float = 100.0):
    """Output tok/s of ``c`` streams when each slows as ``1 + (c - 1) / F`` (the sandbox's law)."""
    return lambda c: c * single / (1 + (c - 1) / ceiling_factor)


def test_doubling_stops_once_a_doubling_adds_less_than_min_growth() -> None:
    # F = 2: growth 33% (1->2), 20% (2->4), 11% (4->8), 5.9% (8->16), 3% (16->32).
    search = ConcurrencySearch(max_concurrency=256, min_growth=0.05)
    assert run(search, batching(2.0)) == [1, 2, 4, 8, 16, 32]
    assert (search.stop_reason, search.saturated_at) == ("saturated", 16)
    search = ConcurrencySearch(max_concurrency=256, min_growth=0.15)
    assert run(search, batching(2.0)) == [1, 2, 4, 8]
    assert (search.stop_reason, search.saturated_at) == ("saturated", 4)


def test_a_drop_in_throughput_is_saturation_and_growth_from_nothing_is_not() -> None:
    figures = {1: 0.0, 2: 50.0, 4: 120.0, 8: 90.0}
    search = ConcurrencySearch(max_concurrency=64)
    assert run(search, figures.get) == [1, 2, 4, 8]
    assert (search.stop_reason, search.saturated_at) == ("saturated", 4)
    nothing = ConcurrencySearch(max_concurrency=64)
    assert run(nothing, lambda c: None) == [1, 2]  # no output at all twice: nothing more to gain
    assert nothing.stop_reason == "saturated"


def test_the_cap_ends_a_sweep_that_still_grows_and_is_its_last_level() -> None:
    search = ConcurrencySearch(max_concurrency=100)
    assert run(search, lambda c: 10.0 * c) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert (search.stop_reason, search.saturated_at) == ("max concurrency reached", None)
    assert doubling_levels(100) == (1, 2, 4, 8, 16, 32, 64, 100) and doubling_levels(8) == (1, 2, 4, 8)


def test_an_slo_break_stops_the_sweep_and_without_an_slo_goodput_is_not_judged() -> None:
    goodput = {1: 1.0, 2: 0.97, 4: 0.5, 8: 0.1}.get
    search = ConcurrencySearch(max_concurrency=64, goal=0.95, slo_set=True)
    assert run(search, lambda c: 10.0 * c, goodput) == [1, 2, 4]
    assert (search.stop_reason, search.saturated_at) == ("slo missed", None)
    assert search.met(0.95) is True and search.met(None) is False
    unjudged = ConcurrencySearch(max_concurrency=8, goal=0.95, slo_set=False)
    assert run(unjudged, lambda c: 10.0 * c, goodput) == [1, 2, 4, 8] and unjudged.met(0.1) is None


def test_a_list_of_levels_runs_every_level_whatever_the_figures() -> None:
    search = ConcurrencySearch([64, 1, 16, 4], goal=0.95, slo_set=True)
    assert run(search, lambda c: 100.0, lambda c: 0.0) == [1, 4, 16, 64]  # flat and failing: still every level
    assert (search.stop_reason, search.saturated_at) == ("every level ran", None)


# ------------------------------------------------------------------------------ the matrix

cells = partial(load_matrix, name="frontier")
error = partial(matrix_error, name="frontier")


def test_a_concurrency_sweep_is_one_cell_with_its_own_id_and_defaults(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "workload: {concurrency: sweep}\n")
    assert cell.cell_id == "RTX_4090-vastai-qwen2:7b-csweep" and cell.sweep_kind == "concurrency"
    assert (cell.concurrency, cell.rate) == (1, None)
    assert (cell.sweep.top_concurrency, cell.sweep.min_growth, cell.sweep.concurrency) == (64, 0.05, None)
    # The server batches as many as the sweep's top level, unless the matrix says otherwise.
    assert cell.batch_limit == server_parallelism(cell) == 64


def test_a_list_of_levels_on_one_session_and_a_list_axis_that_still_makes_cells(tmp_path: Path) -> None:
    swept, *separate = cells(tmp_path, "workload: {concurrency: [1, 4, 8]}\n", """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b',
     workload: {concurrency: sweep, sweep: {concurrency: [64, 1, 16, 4], duration: 30s}}}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
""")
    assert swept.cell_id.endswith("-csweep") and swept.sweep.concurrency == (1, 4, 16, 64)
    assert [c.cell_id.rsplit("-", 1)[-1] for c in separate] == ["qwen2:7b", "c4", "c8"]
    assert all(c.sweep is None and c.batch_limit == c.concurrency for c in separate)
    assert swept.batch_limit == 64 and swept.sweep.max_concurrency_steps == 4
    assert planned_benchmark_seconds(swept) == 4 * 30.0


def test_a_concurrency_sweep_is_planned_and_reserved_for_its_most_steps(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "workload: {duration: 60s, concurrency: sweep, sweep: {max_concurrency: 100}}\n")
    assert planned_benchmark_seconds(cell) == 60.0 * 8  # 1, 2, 4 ... 64, 100
    assert reservation_seconds([cell]) == 480.0
    settings = Settings(sandbox=True, time_scale=0.02)
    scaled = apply_overrides(cell, settings)
    assert scaled.sweep_kind == "concurrency" and scaled.sweep.max_concurrency == 100


def test_the_batch_limit_is_what_the_matrix_says_else_the_loads_default(tmp_path: Path) -> None:
    found = cells(tmp_path, "runtime: {name: ollama, batch_limit: 8}\nworkload: {concurrency: sweep}\n"
                            "slo: {ttft_ms: 500}\n", """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', runtime: {batch_limit: 32},
     workload: {concurrency: 4}}
  - {gpu: RTX 4090, provider: vastai, model: 'llama3:8b', runtime: {batch_limit: null},
     workload: {concurrency: 1, rate: 2}}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:0.5b', runtime: {batch_limit: null},
     workload: {concurrency: 1, rate: sweep, sweep: {probe_concurrency: 100}}}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:0.5b', runtime: {batch_limit: null}}
""")
    # A row's `batch_limit: null` drops the file's: the load's default (a rate cell's RATE_BATCH_LIMIT,
    # a rate sweep's probe concurrency when higher, a concurrency sweep's top level).
    assert [server_parallelism(c) for c in found] == [8, 32, RATE_BATCH_LIMIT, 100, 64]


def test_sweep_identity_tells_the_kinds_and_levels_apart() -> None:
    slo = Slo(ttft_ms=500)
    assert sweep_identity(SweepSpec(), slo, "concurrency") == \
        "concurrency sweep goodput_share >= 0.95 ttft_ms<=500 levels 1-64 growth 0.05"
    assert sweep_identity(SweepSpec(concurrency=[1, 8]), slo, "concurrency").endswith("levels 1,8")
    assert sweep_identity(SweepSpec(), slo).startswith("sweep goodput_share")


@pytest.mark.parametrize(("head", "expected"), [
    ("workload: {concurrency: swept}\n",
     "workload.concurrency: must be a whole number of requests in flight from 1 to 1024, a non-empty list of "
     "them such as [1, 8, 32] (a cell each), or `sweep` for a concurrency sweep on one session; got 'swept'"),
    ("workload: {concurrency: sweep, sweep: {max_concurrency: 1}}\n",
     "workload.sweep.max_concurrency: must be a whole number from 2 to 1024; got 1"),
    ("workload: {concurrency: sweep, sweep: {max_concurrency: 4096}}\n",
     "workload.sweep.max_concurrency: must be a whole number from 2 to 1024; got 4096"),
    ("workload: {concurrency: sweep, sweep: {min_growth: 1.5}}\n",
     "workload.sweep.min_growth: must be the output-throughput growth below which a doubling counts as "
     "saturated: a fraction from 0 to below 1"),
    ("workload: {concurrency: sweep, sweep: {concurrency: [4]}}\n",
     "workload.sweep.concurrency: must be a list of at least two concurrency levels"),
    ("workload: {concurrency: sweep, sweep: {concurrency: [1, 0]}}\n",
     "workload.sweep.concurrency: must be a list of concurrency levels such as [1, 4, 16, 64], each from 1 "
     "to 1024; got item 1 is 0"),
    ("workload: {concurrency: sweep, sweep: {concurrency: [1, 8], max_concurrency: 64}}\n",
     "workload.sweep: `max_concurrency` applies to the doubling sweep; with a list of levels"),
    ("workload: {concurrency: sweep, sweep: {max_rate: 4}}\n",
     "matrix[0].workload: `sweep.max_rate` does not apply to `concurrency: sweep`; its keys are concurrency, "
     "max_concurrency, min_growth, goal, duration"),
    ("workload: {rate: sweep, sweep: {max_concurrency: 64}}\nslo: {ttft_ms: 500}\n",
     "matrix[0].workload: `sweep.max_concurrency` does not apply to `rate: sweep`; its keys are min_rate"),
    ("workload: {concurrency: sweep, sweep: {goal: 0.9}}\n",
     "matrix[0].workload: `sweep.goal` needs an `slo:`"),
    ("workload: {concurrency: sweep, runs: 3}\n",
     "matrix[0].workload: `runs:` does not apply to `concurrency: sweep`"),
    ("workload: {concurrency: sweep, rate: sweep}\nslo: {ttft_ms: 500}\n",
     "`concurrency: sweep` and `rate: sweep` cannot be combined"),
    ("workload: {sweep: {max_concurrency: 64}}\n",
     "workload.sweep: `sweep:` settings apply only with `rate: sweep` or `concurrency: sweep`"),
    ("runtime: {name: ollama, batch_limit: 0}\n",
     "runtime.batch_limit: must be a whole number from 1 to 1024; got 0"),
    ("runtime: {name: openai, endpoint: 'http://127.0.0.1:8000', batch_limit: 8}\n",
     "`name: openai` starts nothing: `ollama_install`, `args` and `batch_limit` do not apply"),
])
def test_a_bad_concurrency_sweep_is_a_clear_error_with_file_and_field(tmp_path: Path, head: str,
                                                                       expected: str) -> None:
    message = error(tmp_path, head)
    assert "gpubench_frontier.yaml" in message and expected in message, message


def test_the_example_of_docs_workloads_md_collects_as_documented(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "docs" / "workloads.md").read_text()
    section = text.split("## Concurrency sweep", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "gpubench_frontier.yaml"
    path.write_text(example)
    doubling, listed = load_cells(path)
    assert doubling.cell_id == "RTX_4090-vastai-qwen2:7b-csweep"  # as its comment says
    assert (doubling.sweep.top_concurrency, doubling.sweep.min_growth, doubling.batch_limit) == (64, 0.05, 64)
    assert listed.sweep.concurrency == (1, 4, 16, 64) and listed.batch_limit == 32
