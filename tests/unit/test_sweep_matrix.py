"""``rate: sweep`` in a matrix (matrix/workload.py): its cell, its settings, and the errors that
name the file, the field and what is allowed."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from matrix_text import load_matrix, matrix_error
from pytest_gpubench.matrix.cells import apply_overrides
from pytest_gpubench.settings import Settings

cells = partial(load_matrix, name="sweep")
error = partial(matrix_error, name="sweep")


def test_a_sweep_cell_has_its_own_id_the_default_settings_and_no_fixed_rate(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "workload: {rate: sweep}\nslo: {ttft_ms: 500}\n")
    assert cell.cell_id == "RTX_4090-vastai-qwen2:7b-sweep"
    assert (cell.rate, cell.concurrency) == (None, 1)
    assert cell.sweep is not None
    assert (cell.sweep.goal, cell.sweep.precision, cell.sweep.steps, cell.sweep.max_rate) == (0.95, 0.05, 8, None)


def test_sweep_settings_in_every_written_form(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "workload:\n  rate: sweep\n  sweep: {min_rate: 0.5, max_rate: 8, steps: 6, "
                              "precision: 10%, goal: 'goodput_share >= 90%', duration: 1m, probe_concurrency: 16}\n"
                              "slo: {tpot_ms: 50}\n")
    spec = cell.sweep
    assert (spec.min_rate, spec.max_rate, spec.steps, spec.precision, spec.goal, spec.duration,
            spec.probe_concurrency) == (0.5, 8.0, 6, 0.1, 0.9, 60.0, 16)
    assert spec.goal_text == "goodput_share >= 0.9"


def test_a_row_may_sweep_beside_rows_at_fixed_rates_with_the_files_sweep_settings(tmp_path: Path) -> None:
    found = cells(tmp_path, "workload: {rate: [1, 2], sweep: {max_rate: 4}}\nslo: {ttft_ms: 500}\n", """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', workload: {rate: sweep}}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
""")
    assert [c.cell_id for c in found] == ["RTX_4090-vastai-qwen2:7b-sweep", "RTX_4090-vastai-qwen2:7b-r1",
                                          "RTX_4090-vastai-qwen2:7b-r2"]
    assert found[0].sweep.max_rate == 4.0 and found[1].sweep is None


@pytest.mark.parametrize(("head", "expected"), [
    ("workload: {rate: sweep}\n", "matrix[0].workload: `rate: sweep` needs an `slo:`"),
    ("workload: {rate: sweep, sweep: {min_rate: 5, max_rate: 4}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep: min_rate (5/s) must be below max_rate (4/s)"),
    ("workload: {sweep: {max_rate: 4}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep: `sweep:` settings apply only with `rate: sweep`"),
    ("workload: {rate: [1, sweep]}\nslo: {ttft_ms: 500}\n",
     "workload.rate: must be a number of requests per second, more than 0 and at most 1000, a non-empty list "
     "of them such as [0.5, 1, 2.5], or `sweep` for a saturation sweep; got item 1 is 'sweep'"),
    ("workload: {rate: sweep, concurrency: 4}\nslo: {ttft_ms: 500}\n",
     "`concurrency: 4` and `rate: sweep` cannot be combined"),
    ("workload: {rate: sweep, sweep: {stepz: 3}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep.stepz: unknown key (did you mean 'steps'?); allowed keys: min_rate, max_rate, steps, "
     "precision, goal, duration, probe_concurrency"),
    ("workload: {rate: sweep, sweep: {goal: 'goodput_share > 0.9'}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep.goal: must be the goodput_share a rate must reach"),
    ("workload: {rate: sweep, sweep: {precision: 1}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep.precision: must be below 1 (100%)"),
    ("workload: {rate: sweep, sweep: {max_rate: 0}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep.max_rate: must be a number of requests per second, more than 0 and at most 1000"),
    ("workload: {rate: sweep, sweep: {steps: 0}}\nslo: {ttft_ms: 500}\n",
     "workload.sweep.steps: must be a whole number from 1 to 50; got 0"),
    ("workload: {rate: sweep, runs: 3}\nslo: {ttft_ms: 500}\n",
     "matrix[0].workload: `runs:` does not apply to `rate: sweep`: each step of the sweep is one run"),
])
def test_a_bad_sweep_is_a_clear_error_with_file_and_field(tmp_path: Path, head: str, expected: str) -> None:
    message = error(tmp_path, head)
    assert "gpubench_sweep.yaml" in message and expected in message, message


def test_a_row_sweep_without_its_rate_is_an_error_at_the_row(tmp_path: Path) -> None:
    message = error(tmp_path, "workload: {rate: 2}\nslo: {ttft_ms: 500}\n", """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', workload: {sweep: {max_rate: 4}}}
""")
    assert "matrix[0].workload: `sweep:` settings apply only with `rate: sweep`" in message


def test_the_sandbox_clock_scales_each_steps_duration(tmp_path: Path) -> None:
    (cell,) = cells(tmp_path, "workload: {rate: sweep, sweep: {duration: 10m}}\nslo: {ttft_ms: 500}\n")
    settings = Settings(sandbox=True, time_scale=0.02)
    assert apply_overrides(cell, settings).sweep.duration == pytest.approx(12.0)


def test_a_sweep_is_planned_and_reserved_for_all_its_steps(tmp_path: Path) -> None:
    from pytest_gpubench.cloud.reuse_split import planned_benchmark_seconds, reservation_seconds

    probed, bounded = cells(tmp_path, "workload: {duration: 60s, rate: sweep}\nslo: {ttft_ms: 500}\n", """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b', workload: {sweep: {max_rate: 4, steps: 5, duration: 30s}}}
""")
    assert planned_benchmark_seconds(probed) == 60.0 * (8 + 1)  # 8 rate steps and the throughput probe
    assert planned_benchmark_seconds(bounded) == 30.0 * 5  # max_rate given: no probe
    assert reservation_seconds([probed]) == 540.0
