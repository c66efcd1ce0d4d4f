"""A cell's GPU energy (issue 23 item 3): from the power readings taken while measured requests
ran, per output token and per watt, with the sampling interval and the uncertainty; never a zero."""

from __future__ import annotations

import math

import pytest

from pytest_gpubench.figures import FIGURES, FigureSource
from pytest_gpubench.measure.metrics import energy_of
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.remote.telemetry import GpuSample
from pytest_gpubench.report.model import ModelTable, ResultRow
from pytest_gpubench.report.tables import model_table


def record(start: float, seconds: float, *, warmup: bool = False) -> RequestRecord:
    return RequestRecord(index=0, prompt_index=0, started_at=start, latency_ms=seconds * 1000.0, output_tokens=10,
                         warmup=warmup)


def reading(t: float, watts: float | None, gpu: int = 0) -> GpuSample:
    return GpuSample(t=t, gpu=gpu, power_draw_w=watts)


def test_energy_counts_the_readings_while_measured_requests_ran_on_every_gpu_of_the_cell() -> None:
    # Measured load from t=100 to t=110 (two overlapping requests); a warm-up before it at 80-90.
    records = [record(80.0, 10.0, warmup=True), record(100.0, 6.0), record(104.0, 6.0)]
    samples = [reading(85.0, 500.0), reading(85.0, 500.0, gpu=1),  # warm-up: left out
               *(reading(100.0 + t, w) for t, w in ((1, 300.0), (3, 320.0), (5, 310.0), (7, 290.0), (9, 280.0))),
               *(reading(100.0 + t, 200.0, gpu=1) for t in (1, 3, 5, 7, 9)),
               reading(120.0, 50.0)]  # after the load: left out
    energy = energy_of(samples, records, 10.0, 250.0)
    assert (energy.gpus, energy.samples, energy.sample_interval_s) == (2, 10, 2.0)
    assert energy.mean_power_w == pytest.approx(300.0 + 200.0)
    assert energy.energy_j == pytest.approx(5000.0)
    assert energy.joules_per_output_token == pytest.approx(500.0 / 250.0)
    assert energy.output_tokens_per_second_per_watt == pytest.approx(250.0 / 500.0)
    # GPU 0's readings spread (sample std 15.81 W over 5 readings); GPU 1's do not.
    assert energy.uncertainty_pct == pytest.approx(math.sqrt(250.0 / 5) / 500.0 * 100.0)
    assert energy.missing is None


@pytest.mark.parametrize(("samples", "missing"), [
    ([], "no GPU readings were taken"),
    ([reading(101.0, None), reading(103.0, None)], "the GPU reports no power draw (nvidia-smi: [N/A])"),
    ([reading(50.0, 300.0)], "no power reading was taken while measured requests ran"),
    ([reading(101.0, 0.0)], "the GPUs reported 0 W while measured"),
])
def test_without_a_power_reading_the_figures_are_empty_and_say_why_never_zero(samples, missing) -> None:
    energy = energy_of(samples, [record(100.0, 5.0)], 5.0, 200.0)
    assert energy.missing == missing
    assert energy.joules_per_output_token is None and energy.output_tokens_per_second_per_watt is None
    details = {"energy": energy.model_dump(mode="json")}
    for name in ("joules_per_output_token", "output_tokens_per_second_per_watt", "mean_power_w"):
        assert FIGURES[name].value(FigureSource({}, details)) is None


def test_one_reading_has_no_uncertainty_to_state_and_no_throughput_no_per_token_figure() -> None:
    energy = energy_of([reading(101.0, 300.0)], [record(100.0, 5.0)], 5.0, None)
    assert energy.mean_power_w == 300.0 and energy.uncertainty_pct is None and energy.sample_interval_s is None
    assert energy.joules_per_output_token is None and energy.energy_j == pytest.approx(1500.0)


def test_the_registry_reads_the_stored_energy() -> None:
    details = {"energy": energy_of([reading(101.0, 300.0), reading(102.0, 300.0)], [record(100.0, 5.0)], 5.0,
                                   150.0).model_dump(mode="json")}
    source = FigureSource({}, details)
    assert FIGURES["joules_per_output_token"].value(source) == pytest.approx(2.0)
    assert FIGURES["output_tokens_per_second_per_watt"].value(source) == pytest.approx(0.5)
    assert FIGURES["mean_power_w"].value(source) == pytest.approx(300.0)
    assert FIGURES["energy_uncertainty_pct"].value(source) == 0.0  # two equal readings: a stated 0%


def _row(gpu: str, joules: float | None) -> ResultRow:
    return ResultRow(run_id="r", cell_id=f"{gpu}-vastai-m", benchmark_id=gpu, gpu=gpu, provider="vastai", model="m",
                     status="success", output_tokens_per_second=100.0, decode_tokens_per_second=50.0,
                     ttft_p50_ms=100.0, price_per_hour=1.0, cost_per_million_tokens=2.78, requests=10, errors=0,
                     figures={"joules_per_output_token": joules})


def test_the_report_shows_energy_per_token_where_a_gpu_reported_power_and_a_dash_where_not() -> None:
    measured, unmeasured = _row("RTX 4090", 1.23456), _row("T4", None)
    table = model_table(ModelTable(model="m", rows=[measured, unmeasured], fastest=measured, cheapest=measured))
    column = table.header.index("J/token")
    assert [str(row[column]) for row in table.rows] == ["1.235", "-"]
    alone = model_table(ModelTable(model="m", rows=[unmeasured], fastest=unmeasured, cheapest=unmeasured))
    assert "J/token" not in alone.header  # no GPU of the table reported power: no column of dashes
