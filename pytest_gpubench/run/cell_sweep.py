"""A ``rate: sweep`` cell's benchmark: the throughput probe and the rate steps on one session.

The search is ``measure/saturation.py``; this runs its steps one after another on
the cell's ready runtime (one model load), each a normal load-generator run with
its own records, and writes a ``PROGRESS: stage=sweep ...`` line per step. The
cell's headline result is the step at ``max_rate_meeting_slo`` (its output
throughput and $/M tokens); every step's requests are kept with it, and the steps
and the answer go into the result's ``details["sweep"]``. No rate meeting the goal
fails the cell (after recording), as a missed threshold does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import BenchmarkInterrupted, Stage, StageError, ThresholdMissed
from ..measure.repeats import Measurement
from ..measure.results import BenchmarkResult
from ..measure.saturation import RateSearch, SweepOutcome, SweepStep, step_figures

if TYPE_CHECKING:
    from ..measure.benchmark import LoadgenPass
    from ..remote.telemetry import GpuSample
    from .cell_benchmark import Bench


#: A rate step lasts long enough for this many arrivals on average: a goodput share of two or
#: three Poisson arrivals says more about the dice than about the server.
MIN_STEP_ARRIVALS = 10


def _significant(rate: float) -> float:
    """A rate with 4 significant digits: what the plan sends, the step records and the report shows."""
    return float(f"{rate:.4g}")


class SweepRun:
    """The steps of one sweep cell, on ``bench``'s session and runtime."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        spec = bench.cell.sweep
        assert spec is not None, "a sweep runs only for a rate: sweep cell"
        self.spec = spec
        self.duration = spec.duration or bench.cell.workload.duration
        self.everything = Measurement()  # every step, probe included: all requests are kept
        self.samples_of: dict[int, list[GpuSample]] = {}  # GPU telemetry by step (run index)
        self.steps: list[SweepStep] = []

    def _step(self, concurrency: int, rate: float | None) -> tuple[LoadgenPass, list[GpuSample], int]:
        """One load-generator run of ``duration`` at this load; its records join the measurement."""
        bench = self.bench
        index = len(self.everything.outcomes)
        duration = max(self.duration, MIN_STEP_ARRIVALS / rate) if rate else self.duration
        plan = replace(bench.plan(index), duration=duration, concurrency=concurrency, rate=rate)
        bench.measurement = self.everything  # an interrupted step keeps every step's records
        outcome, samples = bench.measure_run(plan, index)
        self.samples_of[index] = samples
        return outcome, samples, index

    def _record(self, kind: str, outcome: LoadgenPass, index: int, *, concurrency: int | None = None,
                rate: float | None = None, search: RateSearch | None = None) -> SweepStep:
        figures = step_figures(outcome.records, outcome.duration_seconds or self.duration, self.bench.cell.slo)
        met = search.record(rate, figures["goodput_share"]) if search is not None and rate is not None else None
        step = SweepStep(step=len(self.steps), kind=kind, rate=rate, concurrency=concurrency, run_index=index,
                         met=met, **figures)
        self.steps.append(step)
        shown = dict(stage="sweep", step=step.step, kind=kind, rate=rate, concurrency=concurrency,
                     request_throughput_rps=_rounded(step.request_throughput_rps),
                     goodput_share=_rounded(step.goodput_share),
                     output_tokens_per_second=_rounded(step.output_tokens_per_second), met=met)
        self.bench.recorder.progress.progress(**{key: value for key, value in shown.items() if value is not None})
        return step

    def top_rate(self) -> float:
        """``max_rate``, else the throughput probe's achieved request rate."""
        if self.spec.max_rate is not None:
            return self.spec.max_rate
        concurrency = self.spec.probe_concurrency
        outcome, _, index = self._step(concurrency, None)
        probe = self._record("probe", outcome, index, concurrency=concurrency)
        if not probe.request_throughput_rps:
            raise StageError(Stage.BENCHMARK, f"the sweep's throughput probe at concurrency {concurrency} "
                                              "completed no request; give `sweep.max_rate` or a longer duration")
        return _significant(probe.request_throughput_rps)

    def run(self) -> BenchmarkResult:
        """Probe, search, then record the answer step as the cell's result (and every step's requests)."""
        bench = self.bench
        recorder = bench.recorder
        recorder.enter(Stage.BENCHMARK)
        price = bench.session.offer.offer.price_per_hour
        search: RateSearch | None = None
        try:
            search = RateSearch.of(self.spec, self.top_rate())
            while (rate := search.next_rate()) is not None:
                rate = _significant(rate)
                outcome, _, index = self._step(1, rate)
                self._record("rate", outcome, index, rate=rate, search=search)
        except StageError as exc:
            # An interrupted step's records were kept by Bench.measure_run. A step that measured
            # nothing (the instance lost as it began) is no reason to lose the steps before it.
            interrupted = isinstance(exc, BenchmarkInterrupted)
            kept = interrupted
            if not interrupted and any(record.ok for record in self.everything.records):
                bench.measurement = self.everything
                bench._keep()
                kept = True
                # A benchmark-stage failure after measured steps is a partial sweep; a failure at
                # another stage (a reconnect at ssh_connect, a restart's warm-up at model_pull)
                # keeps its own stage and hint, with the steps kept beside it.
                if exc.stage is Stage.BENCHMARK:
                    exc = BenchmarkInterrupted(f"saturation sweep interrupted after {len(self.steps)} step(s): "
                                               f"{exc.message}")
            if kept and search is not None:
                bench.details["sweep"] = SweepOutcome.of(search, self.steps, bench.cell.slo, price).model_dump(
                    mode="json")
            raise exc
        outcome = SweepOutcome.of(search, self.steps, bench.cell.slo, price)
        recorder.enter(Stage.RESULTS)
        headline = outcome.closest_step
        bench.measurement = self._only(headline.run_index) if headline is not None else self.everything
        result = bench._keep()
        # The headline is one step; the store keeps every step's requests and runs.
        recorder.records, recorder.runs = list(self.everything.records), self.everything.runs
        bench.details["sweep"] = outcome.model_dump(mode="json")
        bench.details["runs"] = self.everything.runs
        bench.details["load"] = {**bench.details.get("load", {}), "sweep": True}
        answer = dict(max_rate_meeting_slo=outcome.max_rate_meeting_slo,
                      output_tokens_per_second=_rounded(outcome.output_tokens_per_second),
                      cost_per_million_tokens=_rounded(outcome.cost_per_million_tokens),
                      steps=len(self.steps), stop=outcome.stop_reason.replace(" ", "_"))
        recorder.progress.status("SWEEP_COMPLETE", **{key: value for key, value in answer.items() if value is not None})
        recorder.progress.status("RESULTS_COLLECTED")
        recorder.progress.results(result)
        if outcome.max_rate_meeting_slo is None:
            raise ThresholdMissed(outcome.missed())
        bench._judge(result)
        return result

    def _only(self, run_index: int) -> Measurement:
        """The measurement of one step, its record indexes as in the whole sweep's."""
        position = next(i for i, run in enumerate(self.everything.runs) if run["run_index"] == run_index)
        one = Measurement()
        one.add(self.everything.outcomes[position], self.samples_of.get(run_index, []), run_index)
        return one


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None
