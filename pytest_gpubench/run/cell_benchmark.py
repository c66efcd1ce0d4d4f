"""A cell's benchmark on its ready runtime: stages ``benchmark`` and ``results``.

:class:`Bench` measures (as many runs as the cell asks for), builds the GPU
Shopper BenchmarkResult, judges it against thresholds and a baseline, and hands
everything to the cell's recorder. :class:`GpuSession` is the rented session it
runs on, and :func:`watched` keeps the API's eye on that session while a stage
runs. A ``rate: sweep`` cell's benchmark is :class:`SweepRun`'s steps and a
``concurrency: sweep`` cell's :class:`ConcurrencySweepRun`'s (at the end of this
module: they are Bench's other ways to measure, and use its insides). Every result's
``details["frontier"]`` holds its frontier points (``measure/frontier.py``): one for a
cell at one load, one per step for a sweep. No pytest here: the ``gpubench`` fixture
wires it up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from ..aio import run as run_async
from ..measure.benchmark import BenchmarkPlan, LoadgenPass
from ..figures import parse_compare_fail
from ..measure.compare import compare, figures_of
from ..errors import BenchmarkInterrupted, ErrorBudgetExceeded, ResultsInvalid, Stage, StageError, ThresholdMissed
from ..store.export import upload_result
from ..measure.compare import Fingerprint, fingerprint, incomparable
from ..matrix.accuracy import score
from ..matrix.cells import DEFAULT_CLOUD, Cell
from ..measure.repeats import Measurement, details_of, enough_runs, measure_once
from ..measure.metrics import DetailedMetrics, Energy, detailed_metrics, energy_of
from ..measure.frontier import PRIMARY_INTERACTIVITY, FrontierPoint, frontier_point
from ..cloud.provider import OfferChoice, Session, SshDetails
from .record import CellRecorder, progress_path
from ..remote.ssh import connect_checked
from ..remote.local import LocalShell
from ..remote.ssh import Connection, KeyFile
from ..measure.validity import commonest_error, keep_raw, result_problems
from ..measure.results import BenchmarkResult, ModelInfo, TestConfig, summarize
from ..remote.readings import HardwareInfo, RequestRecord
from ..measure.saturation import (ConcurrencySearch, RateSearch, SweepOutcome, SweepStep, step_figures,
                                 sweep_identity)
from .run_context import RunContext
from ..runtimes.base import Runtime
from ..remote.telemetry import GpuSample, summarize_gpu
from ..settings import Settings
from ..measure.thresholds import check_thresholds, describe_violations
from ..cloud.watch import SessionWatch, watch_interval

#: Seconds of slack on top of a stage timeout for the bridge into the loop.
BRIDGE_SLACK = 10.0
#: Seconds the benchmark may take beyond its timeout to read the instance's checkpoint.
CHECKPOINT_SLACK = 90.0
#: The accuracy pass's problems in flight at once: a small load, so each answer is the
#: model's at an ordinary batch (docs/metrics.md, "Accuracy").
ACCURACY_CONCURRENCY = 4
#: Seconds the accuracy pass may go on sending problems: a bound, not a duration (it ends
#: once every problem is answered; one not sent by then counts as failed).
ACCURACY_DEADLINE_S = 1800.0
T = TypeVar("T")


@dataclass
class GpuSession:
    """A running GPU session, how to reach it over SSH (the provider's ``ssh_details``) and its key file."""

    session: Session
    ssh: SshDetails = field(repr=False)
    #: The rented session's key written for ``ssh -i``; None when there is none to write (a host's
    #: key file is used in place, an agent host and this machine have none).
    key_file: KeyFile | None = field(repr=False)
    offer: OfferChoice = field(repr=False)
    #: The ``cloud:`` it was rented through: the provider that watches and releases it.
    cloud: str = DEFAULT_CLOUD
    #: The session's Docker image when known (a template's, an entrypoint launch's): heavy ones get longer stages.
    image: str | None = None


def connect(run: RunContext, session: GpuSession, timeout: float,
            on_pinned: Callable[[str, Path], None] | None = None) -> Awaitable[Connection]:
    """An SSH connection to ``session`` with the provider's details. A rented session's host key
    is pinned by its first connection, and a later one that meets another key fails; a host
    with ``known_hosts`` is checked against them, or pinned into gpubench's file on first use
    (``on_pinned`` is told). A session without SSH (``SshDetails.local``) gets a
    :class:`LocalShell` on this machine instead."""
    ssh = session.ssh
    if ssh.local:
        return _local_shell(hide_gpu=ssh.declared_hardware)
    if ssh.known_hosts or ssh.pin_file:
        return connect_checked(ssh.host, ssh.port, ssh.user, ssh.private_key, known_hosts=ssh.known_hosts,
                               pin_file=ssh.pin_file, timeout=timeout, agent=ssh.agent, on_pinned=on_pinned,
                               key_path=ssh.key_file)
    return run.host_keys.connect(session.session.id, ssh.host, ssh.port, ssh.user, ssh.private_key, timeout=timeout)


async def _local_shell(*, hide_gpu: bool) -> Connection:
    # A session whose GPU is declared (a running endpoint): this machine's must not be sampled, and
    # its shell's home is private. This machine as a provider keeps its home, as a host does.
    shell = LocalShell.open(hide_gpu=True) if hide_gpu else LocalShell.open_machine()
    return shell  # type: ignore[return-value]  # Connection's interface


async def watched(run: RunContext, session: GpuSession, stage: Stage,
                  work: Callable[[SessionWatch], Awaitable[T]], *, guard: bool = True) -> T:
    """Await ``work(watch)`` while the API is asked every few seconds whether the instance still runs.

    With ``guard``, a lost instance cancels the work and raises ``InstanceLost``;
    without, the work itself reacts to ``watch`` (the benchmark keeps what it measured).
    """
    async with SessionWatch(run.provider_for(session.cloud), session.session.id, watch_interval(run.settings), stage) as watch:
        job = work(watch)
        return await (watch.guard(job, stage) if guard else job)


class Bench:
    """Runs the cell's benchmark on a ready runtime; ``run()`` returns the result."""

    def __init__(self, run: RunContext, cell: Cell, recorder: CellRecorder, runtime: Runtime,
                 session: GpuSession) -> None:
        self._run, self.cell, self.recorder, self.runtime, self.session = run, cell, recorder, runtime, session
        self.result: BenchmarkResult | None = None
        self.measurement = Measurement()
        self.details: dict = {}
        self.comparison_line = ""
        #: The accuracy pass's figures (``details["accuracy"]``), once it ran.
        self.accuracy: dict | None = None

    def plan(self, run_index: int = 0) -> BenchmarkPlan:
        workload = self.cell.workload
        # Relative to the SSH login directory on the instance.
        checkpoint = progress_path(Path(".gpubench"), self._run.run_id, self.recorder.record_key)
        checkpoint = checkpoint.with_name(f"{checkpoint.stem}.run{run_index}.checkpoint.json")
        trace = workload.trace
        return BenchmarkPlan(
            # A trace runs for its own span (over its speedup): the sandbox's clock does not shorten its times.
            model=self.cell.model, duration=trace.window if trace else workload.duration, max_tokens=workload.max_tokens,
            prompts=workload.prompt_payload(), warmup_requests=workload.warmup_requests if run_index == 0 else 0,
            progress_interval=workload.progress_interval, checkpoint_every=workload.checkpoint_every,
            checkpoint_path=str(checkpoint), concurrency=self.cell.concurrency, rate=self.cell.rate,
            seed=run_index, request_timeout=self._run.settings.stall_seconds(
                workload.stall_timeout, first_token_ms=self._first_token_ms(), concurrency=self._streams()),
            # A trace's requests all finish: its last one is sent at the deadline.
            think=workload.think, cut_at_deadline=self._run.settings.cut_at_deadline and trace is None,
            protocol=str(self.runtime.endpoint.api),  # the API the runtime serves, which the load generator speaks
            api_key_env=self.runtime.endpoint.api_key_env, ca_file=self.runtime.endpoint.ca_file,
            schedule=trace.offsets if trace else None,
        )

    @property
    def settings(self) -> Settings:
        return self._run.settings

    def _first_token_ms(self) -> float | None:
        """A lone request's first-token time, from the warm-up: the Ollama runtime measures it
        on every warm-up; the others only on a cold one (then with the load in it)."""
        runtime = self.runtime
        return getattr(runtime, "first_token_ms", None) or runtime.cold_first_token_ms

    def _streams(self) -> int:
        """The requests that may wait together for their first token: the cell's concurrency, or
        the parallel requests its server was started for (a rate cell's, more)."""
        return max(self.cell.concurrency, self.runtime.num_parallel or 1)

    def measure_run(self, plan: BenchmarkPlan, run_index: int) -> tuple[LoadgenPass, list[GpuSample]]:
        """One load-generator run of ``plan`` after the health check, with telemetry beside it and
        the session watched; its records join :attr:`measurement` (an interrupted run's too, kept
        before the interruption is raised)."""
        self._ensure_healthy()
        timeout = self.settings.stage_timeout(Stage.BENCHMARK, plan.duration)
        interval = self.cell.workload.telemetry_interval  # the effective cell: overrides and sandbox clock applied
        try:
            outcome, samples = run_async(
                watched(self._run, self.session, Stage.BENCHMARK, lambda watch:
                        measure_once(self.runtime, plan, timeout=timeout, telemetry_interval=interval,
                                     on_event=self._on_event, watch=watch, reconnect=self._reconnect),
                        guard=False),
                # After a stream cut at the deadline, reading the checkpoint still takes a moment.
                timeout + CHECKPOINT_SLACK + BRIDGE_SLACK,
            )
        except BenchmarkInterrupted as exc:
            self.measurement.add(exc.partial, getattr(exc, "samples", []), run_index)
            self._keep()
            raise
        self.measurement.add(outcome, samples, run_index)
        return outcome, samples

    def run(self) -> BenchmarkResult:
        """Stages ``benchmark`` then ``results``: measure (every run), summarise, judge, record.
        A ``rate: sweep`` cell runs its saturation sweep instead (:class:`SweepRun`, below), a
        ``concurrency: sweep`` cell its steps (:class:`ConcurrencySweepRun`)."""
        if self.cell.sweep is not None:
            return (ConcurrencySweepRun if self.cell.sweep_kind == "concurrency" else SweepRun)(self).run()
        recorder, settings, cell = self.recorder, self._run.settings, self.cell
        recorder.enter(Stage.BENCHMARK)
        run_index = 0
        while True:
            mark = self.measurement.mark()
            outcome, _ = self.measure_run(self.plan(run_index), run_index)
            if self._spoiled_by_a_crash(outcome, run_index):
                self.measurement.rewind(mark)
                continue
            run_index += 1
            values = [r["decode_tokens_per_second"] for r in self.measurement.runs]
            if enough_runs(cell, settings.runs, values):
                break
            last = self.measurement.runs[-1]
            recorder.progress.status("RUN_COMPLETE", run=run_index,
                                     output_tokens_per_second=last["output_tokens_per_second"],
                                     decode_tokens_per_second=last["decode_tokens_per_second"])
        self.accuracy_pass()
        recorder.enter(Stage.RESULTS)
        result = self._keep()
        recorder.progress.status("BENCHMARK_COMPLETE", output_tokens_per_second=result.output_tokens_per_second,
                                 decode_tokens_per_second=result.results.avg_tokens_per_second,
                                 requests=result.results.total_requests, tokens=result.results.total_tokens,
                                 runs=len(self.measurement.runs))
        recorder.progress.status("RESULTS_COLLECTED")
        recorder.progress.results(result)
        self._judge(result)
        return result

    def accuracy_pass(self) -> None:
        """The workload's ``accuracy:`` problems, each once, on the runtime just measured, after
        the measured runs: their requests join no measurement (no throughput, latency or
        energy counts them; no request record is kept), only :attr:`accuracy` (scored exactly,
        ``matrix/accuracy.py``). A pass cut short keeps what it scored and says why."""
        spec = self.cell.workload.accuracy
        if spec is None:
            return
        checkpoint = Path(self.plan(0).checkpoint_path)
        plan = replace(self.plan(0), prompts=spec.payload(), warmup_requests=0, duration=ACCURACY_DEADLINE_S,
                       concurrency=min(ACCURACY_CONCURRENCY, len(spec.problems)), rate=None,
                       requests=len(spec.problems), cut_at_deadline=False,
                       checkpoint_path=str(checkpoint.with_name(checkpoint.name.replace(".run0.", ".accuracy."))))
        timeout = self.settings.stage_timeout(Stage.BENCHMARK, ACCURACY_DEADLINE_S)
        self.recorder.progress.status("ACCURACY_STARTED", problems=len(spec.problems), source=spec.source)
        error = None
        try:
            self._ensure_healthy()
            outcome, _ = run_async(
                watched(self._run, self.session, Stage.BENCHMARK, lambda watch:
                        measure_once(self.runtime, plan, timeout=timeout, telemetry_interval=ACCURACY_DEADLINE_S,
                                     on_event=lambda event: None, watch=watch, reconnect=self._reconnect),
                        guard=False),
                timeout + CHECKPOINT_SLACK + BRIDGE_SLACK)
            records = outcome.records
        except StageError as exc:  # the throughput measured stands; the pass says what it scored
            partial = getattr(exc, "partial", None)
            records, error = (partial.records if partial is not None else []), exc.message
        self.accuracy = {**score(spec, records), "max_tokens": self.cell.workload.max_tokens,
                         "concurrency": plan.concurrency, **({"error": error} if error else {})}
        shown = {key: self.accuracy[key] for key in ("accuracy", "correct", "problems", "unanswered", "failed")}
        self.recorder.progress.status("ACCURACY", **shown)

    def _spoiled_by_a_crash(self, outcome: LoadgenPass, run_index: int) -> bool:
        """A run whose every request failed because the server crashed during it measured the
        crash, not the model: when the health check finds the server dead and restarts it (its
        one restart), the run is measured again. A server that still answers (every request
        failed for another reason), or a second crash, fails the cell as before."""
        if outcome.successful or not outcome.records:
            return False
        if not self._ensure_healthy():
            return False
        self.recorder.progress.status("RUN_REPEATED", run=run_index + 1,
                                      reason="the server stopped answering during the run and was restarted")
        return True

    def _ensure_healthy(self) -> bool:
        """Seed 001's health check before each run: a server that stopped answering is
        restarted once (and the model loaded again) before the cell fails. Whether it was restarted."""
        settings, recorder, runtime = self._run.settings, self.recorder, self.runtime
        timeout = settings.stage_timeout(Stage.RUNTIME_SETUP)

        def restarting(reason: str) -> None:
            recorder.progress.status("RUNTIME_RESTART", reason=reason)

        # A restart is a start command, then a wait for /api/version, then maybe the serve log.
        # Watched: a server that stopped answering because its instance died is the instance's
        # loss, named as such (not "SSH connection lost" from the restart that followed).
        if run_async(watched(self._run, self.session, Stage.BENCHMARK,
                             lambda _: runtime.ensure_healthy(timeout, Stage.BENCHMARK, restarting)),
                     timeout * 2 + 30 + BRIDGE_SLACK):
            load_timeout = settings.stage_timeout(Stage.MODEL_PULL)
            load = run_async(watched(self._run, self.session, Stage.BENCHMARK,
                                     lambda _: runtime.warm_up(self.cell.model, load_timeout, cold_start=False)),
                             load_timeout + BRIDGE_SLACK)
            recorder.progress.status("RUNTIME_RESTARTED", version=runtime.version, load_s=round(load, 2))
            return True
        return False

    def _reconnect(self) -> Awaitable[Connection]:
        """A new SSH connection to this cell's session (its host key must not have changed)."""
        return connect(self._run, self.session, min(self._run.settings.stage_timeout(Stage.SSH_CONNECT), 60.0))

    def _on_event(self, event: dict) -> None:
        if event["event"] == "worker" and "container" in event:  # a container worker's own status (seed 004)
            self.recorder.progress.status("WORKER", container=event["container"], status=event.get("status"),
                                          message=event.get("message"))
        elif event["event"] == "backoff":
            # Once when the load generator starts backing off from a server that fails at once, once
            # when a request succeeds again: never a line per error.
            if event.get("status") == "started":
                self.recorder.progress.status("LOADGEN_BACKOFF", errors=event.get("errors"),
                                              pause_s=event.get("pause_s"), max_pause_s=event.get("max_pause_s"),
                                              error=str(event.get("error") or "")[:300])  # instance output
            else:
                self.recorder.progress.status("LOADGEN_BACKOFF_ENDED", errors=event.get("errors"))
        elif event["event"] == "progress":
            # The load generator's "tps" is its tokens so far / time so far: output throughput.
            self.recorder.progress.progress(requests=event.get("requests"), tokens=event.get("tokens"),
                                            output_tokens_per_second=event.get("tps"), errors=event.get("errors"))

    def _keep(self) -> BenchmarkResult:
        """Build the result and details of what was measured so far and hand them to the recorder."""
        measurement, runtime = self.measurement, self.runtime
        residency = run_async(runtime.residency(self.cell.model), 30 + BRIDGE_SLACK)
        first_gpu = self.recorder.system.first if self.recorder.system else None
        capability = first_gpu.compute_capability if first_gpu else ""  # detected at ssh_connect
        try:
            result = build_result(self.cell, self.recorder, runtime, self.session, measurement)
        except ValidationError as exc:
            raise self._invalid([str(exc).replace("\n", " ")], None) from None
        problems = result_problems(result)
        if problems:
            why = commonest_error(self.measurement.records) if result.results.total_errors else None
            raise self._invalid([*problems, why] if why else problems, result)
        self.details = details_of(self.cell, measurement, runtime, residency=residency,
                                  compute_capability=capability)
        recorder = self.recorder
        pulled = recorder.pulled
        self.details["model"] = {"digest": pulled.digest if pulled else "",
                                 "quantization": pulled.quantization if pulled else ""}
        # The headline $/M tokens is the machine's (output throughput); the per-stream
        # figure the GPU Shopper server would compute is kept beside it.
        self.details["cost_analysis"] = {
            "per_stream": result.per_stream_cost_analysis().model_dump(mode="json"),
            "machine": result.cost_analysis().model_dump(mode="json"),
        }
        # What a baseline must share to be compared with this result (fingerprint.py).
        self.details["fingerprint"] = self.fingerprint().model_dump(mode="json")
        if self.accuracy is not None:
            self.details["accuracy"] = self.accuracy
        if self.session.ssh.local:  # nothing to probe: the hardware is what the matrix says
            self.details["hardware_declared"] = True
        if self.cell.sweep is None:  # a cell at one load is a one-point frontier (a sweep writes its steps)
            point = self.frontier_point(
                measurement.records, measurement.duration_seconds or self.cell.workload.duration,
                concurrency=self.cell.concurrency if self.cell.rate is None else None, rate=self.cell.rate,
                metrics=DetailedMetrics.model_validate(self.details["metrics"]),
                energy=Energy.model_validate(self.details["energy"]))
            self.details["frontier"] = frontier_details([point], "one load")
        recorder.result, recorder.records, recorder.samples = result, list(measurement.records), measurement.samples
        recorder.runs, recorder.details, self.result = measurement.runs, self.details, result
        return result

    def frontier_point(self, records: list[RequestRecord], duration: float, *, concurrency: int | None,
                       rate: float | None, run_index: int = 0, samples: list[GpuSample] | None = None,
                       metrics: DetailedMetrics | None = None, energy: Energy | None = None) -> FrontierPoint:
        """A frontier point of these records on this cell's session: its GPUs, billed price, and the
        batch limit its server ran under (``runtime.num_parallel``: what it was started with)."""
        if metrics is None:
            slo = self.cell.slo
            metrics = detailed_metrics(records, duration, slo=slo if slo.is_set else None, concurrency=concurrency)
        if energy is None:
            energy = energy_of(samples or [], records, duration, metrics.output_throughput_tps)
        return frontier_point(records, duration, concurrency=concurrency, rate=rate, gpus=self.cell.gpus,
                              price_per_hour=self.session.offer.offer.price_per_hour,
                              batch_limit=self.runtime.num_parallel, energy=energy, slo=self.cell.slo,
                              run_index=run_index, metrics=metrics)

    def fingerprint(self) -> Fingerprint:
        """This cell's workload and runtime, as a comparable baseline must match them."""
        workload, pulled = self.cell.workload, self.recorder.pulled
        return fingerprint(prompts=workload.prompt_payload(), max_tokens=workload.max_tokens,
                           concurrency=self.cell.concurrency, rate=self.cell.rate, think=workload.think,
                           warmup_requests=workload.warmup_requests, runtime=self.cell.runtime,
                           runtime_version=self.runtime.version, model_digest=pulled.digest if pulled else "",
                           prompt_source=workload.prompt_source.identity if workload.prompt_source else None,
                           launch_args=self.cell.runtime_args, port=self.cell.runtime_port, gpus=self.cell.gpus,
                           sweep=sweep_identity(self.cell.sweep, self.cell.slo, self.cell.sweep_kind or "rate")
                           if self.cell.sweep else None)

    def _invalid(self, problems: list[str], result: BenchmarkResult | None) -> ResultsInvalid:
        """Keep an invalid result raw under ``<reports>/invalid/`` and say so; nothing is recorded as measured."""
        recorder, run = self.recorder, self._run
        path = progress_path(run.settings.reports / "invalid", run.run_id, recorder.record_key).with_suffix(".json")
        keep_raw(path, {
            "cell": recorder.record_key, "run_id": run.run_id, "problems": problems,
            "result": result.model_dump(mode="python") if result is not None else None,
            "runs": self.measurement.runs,
            "records": [r.model_dump(mode="python") for r in self.measurement.records],
        })
        recorder.progress.status("RESULTS_INVALID", kept=str(path))
        return ResultsInvalid(f"the result failed validation: {'; '.join(problems)}", path)

    def _judge(self, result: BenchmarkResult) -> None:
        """Thresholds, then the baseline comparison: a miss fails the cell with the figures first."""
        cell, settings, recorder = self.cell, self._run.settings, self.recorder
        figures = result.results
        metrics = self.details["metrics"]
        violations = check_thresholds(
            cell.thresholds, tps=figures.avg_tokens_per_second,
            ttft_ms_by_percentile={50: metrics.get("ttft_p50_ms"), 90: metrics.get("ttft_p90_ms"),
                                   95: metrics.get("ttft_p95_ms"), 99: metrics.get("ttft_p99_ms")},
            error_rate=figures.error_rate,
            match_rate=figures.match_rate if figures.prompts_with_expected else None,
        )
        if settings.compare or settings.compare_fail:
            found = self._run.store.baseline(recorder.record_key, settings.compare or "last",
                                             exclude_run=self._run.run_id)
            baseline = found.figures() if found is not None else None
            # `--gpubench-compare` alone compares without rules: nothing to parse then.
            rules = parse_compare_fail(settings.compare_fail) if settings.compare_fail else []
            why_not = incomparable(self.fingerprint(), baseline) if baseline is not None else None
            if baseline is None:
                recorder.progress.status("COMPARED", line="no baseline for this cell")
            elif why_not is not None:
                # Figures of another workload or runtime say nothing about a regression: no gate.
                self.comparison_line = f"no comparable baseline ({why_not})"
                self.details["comparison"] = self.comparison_line
                recorder.progress.status("COMPARED", line=self.comparison_line)
            else:
                comparison = compare(figures_of(result, self._run.run_id), baseline, rules)
                self.comparison_line = comparison.line()
                self.details["comparison"] = self.comparison_line
                recorder.progress.status("COMPARED", line=self.comparison_line)
                if comparison.failed:
                    raise ThresholdMissed(comparison.failure())
        if violations and all(v.default for v in violations):
            # Only the default error budget: what was measured stays, the cell is partial.
            why = commonest_error(self.measurement.records)
            raise ErrorBudgetExceeded(describe_violations(violations) + (f"; {why}" if why else ""))
        if violations:
            raise ThresholdMissed(describe_violations(violations))


def build_result(cell: Cell, recorder: CellRecorder, runtime: Runtime, session: GpuSession,
                 measurement: Measurement) -> BenchmarkResult:
    """The GPU Shopper BenchmarkResult of everything measured (possibly cut short)."""
    pulled = recorder.pulled
    workload = cell.workload
    return BenchmarkResult(
        hardware=recorder.hardware or HardwareInfo(),
        model=ModelInfo(
            name=cell.model,
            family=pulled.family if pulled else "",
            parameter_count=pulled.parameter_size if pulled else "",
            quantization=pulled.quantization if pulled else "",
            size_gb=round(pulled.size_bytes / 1e9, 2) if pulled else 0.0,
            runtime=runtime.name,
            runtime_version=runtime.version,
        ),
        test_config=TestConfig(
            duration_minutes=round(workload.duration / 60),
            max_tokens=workload.max_tokens,
            prompt_types=[workload.prompts_label],
            concurrent_reqs=cell.concurrency,
            warmup_requests=workload.warmup_requests,
        ),
        results=summarize(measurement.records, measurement.duration_seconds or workload.duration),
        gpu_stats=summarize_gpu(measurement.samples),
        provider=cell.provider,
        location=session.offer.offer.location,
        price_per_hour=session.offer.offer.price_per_hour,
    )


def upload_now(run: RunContext, recorder: CellRecorder, benchmark_id: str) -> None:
    """POST a stored result to GPU Shopper now; a failure stays pending for ``gpubench upload``."""
    error = run_async(upload_result(run.store, run.api_client, benchmark_id), 60 + BRIDGE_SLACK)
    if error:
        recorder.progress.error(Stage.RESULTS, f"upload failed (kept; retry with gpubench upload): {error}")
    else:
        recorder.progress.status("IMPORTED", benchmark_id=benchmark_id)


# ---------------------------------------------------------------- the saturation sweep
# A ``rate: sweep`` cell's benchmark: the throughput probe and the rate steps on one session.
#
# The search is ``measure/saturation.py``; this runs its steps one after another on
# the cell's ready runtime (one model load), each a normal load-generator run with
# its own records, and writes a ``PROGRESS: stage=sweep ...`` line per step. The
# cell's headline result is the step at ``max_rate_meeting_slo`` (its output
# throughput and $/M tokens); every step's requests are kept with it, and the steps
# and the answer go into the result's ``details["sweep"]``. No rate meeting the goal
# fails the cell (after recording), as a missed threshold does.

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
        assert spec is not None, "a sweep runs only for a rate: sweep or concurrency: sweep cell"
        self.spec = spec
        self.duration = spec.duration or bench.cell.workload.duration
        self.everything = Measurement()  # every step, probe included: all requests are kept
        self.samples_of: dict[int, list[GpuSample]] = {}  # GPU telemetry by step (run index)
        self.steps: list[SweepStep] = []
        self.points: list[FrontierPoint] = []  # a frontier point per step (details["frontier"])

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
        duration = outcome.duration_seconds or self.duration
        figures = step_figures(outcome.records, duration, self.bench.cell.slo)
        met = search.record(rate, figures["goodput_share"]) if search is not None and rate is not None else None
        energy = energy_of(self.samples_of.get(index, []), outcome.records, duration,
                           figures["output_tokens_per_second"])
        step = SweepStep(step=len(self.steps), kind=kind, rate=rate, concurrency=concurrency, run_index=index,
                         met=met, joules_per_output_token=energy.joules_per_output_token,
                         output_tokens_per_second_per_watt=energy.output_tokens_per_second_per_watt, **figures)
        self.steps.append(step)
        # The probe is a closed-loop point, a rate step an open-loop one: both belong on the frontier.
        self.points.append(self.bench.frontier_point(outcome.records, duration, concurrency=concurrency, rate=rate,
                                                     run_index=index, energy=energy))
        shown = dict(stage="sweep", step=step.step, kind=kind, rate=rate, concurrency=concurrency,
                     request_throughput_rps=_rounded(step.request_throughput_rps),
                     goodput_share=_rounded(step.goodput_share),
                     output_tokens_per_second=_rounded(step.output_tokens_per_second), met=met)
        self.bench.recorder.progress.progress(**{key: value for key, value in shown.items() if value is not None})
        return step

    def keep_interrupted(self, exc: StageError, what: str, steps: int) -> tuple[bool, StageError]:
        """Whether the steps measured before ``exc`` are kept, and the error the cell fails with.

        An interrupted step's records were kept by Bench.measure_run. A step that measured nothing
        (the instance lost as it began) is no reason to lose the steps before it: they are kept as
        the cell's measurement. A benchmark-stage failure after measured steps is then a partial
        sweep; a failure at another stage (a reconnect at ssh_connect, a restart's warm-up at
        model_pull) keeps its own stage and hint, with the steps kept beside it."""
        if isinstance(exc, BenchmarkInterrupted):
            return True, exc
        if not any(record.ok for record in self.everything.records):
            return False, exc
        self.bench.measurement = self.everything
        self.bench._keep()
        if exc.stage is Stage.BENCHMARK:
            exc = BenchmarkInterrupted(f"{what} interrupted after {steps} step(s): {exc.message}")
        return True, exc

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
            bench.accuracy_pass()
        except StageError as failure:
            kept, exc = self.keep_interrupted(failure, "saturation sweep", len(self.steps))
            if kept and search is not None:
                bench.details["sweep"] = SweepOutcome.of(search, self.steps, bench.cell.slo, price).model_dump(
                    mode="json")
                bench.details["frontier"] = frontier_details(self.points, "interrupted")
            raise exc
        outcome = SweepOutcome.of(search, self.steps, bench.cell.slo, price)
        recorder.enter(Stage.RESULTS)
        headline = outcome.closest_step
        bench.measurement = self._only(headline.run_index) if headline is not None else self.everything
        result = bench._keep()
        # The headline is one step; the store keeps every step's requests and runs.
        recorder.records, recorder.runs = list(self.everything.records), self.everything.runs
        bench.details["sweep"] = outcome.model_dump(mode="json")
        bench.details["frontier"] = frontier_details(self.points, outcome.stop_reason)
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


def frontier_details(points: list[FrontierPoint], stop_reason: str, saturated_at: int | None = None) -> dict:
    """A result's ``details["frontier"]``: its points (one per load it ran, docs/metrics.md
    "Frontiers"), why the sweep stopped (``one load`` for a cell at one load), where the runtime
    saturated (a ``concurrency: sweep``'s; else None) and the interactivity the report reads first."""
    return {"points": [point.model_dump(mode="json") for point in points], "stop_reason": stop_reason,
            "saturated_at": saturated_at, "primary": PRIMARY_INTERACTIVITY}


# ---------------------------------------------------------------- the concurrency sweep
# A ``concurrency: sweep`` cell's benchmark: closed-loop steps on one session and one model load,
# the concurrency doubling from 1 (or the listed levels) until ConcurrencySearch
# (measure/saturation.py) stops: saturated, the SLO missed, or the cap. Each step is a normal
# load-generator run with its own records and telemetry, and a frontier point. The headline is
# the step with the highest output throughput among those that met the SLO (every step, without
# an SLO; the highest of all when none met it): the most the server gave under the user's bar.


class ConcurrencySweepRun(SweepRun):
    """The steps of one ``concurrency: sweep`` cell, on ``bench``'s session and runtime."""

    def run(self) -> BenchmarkResult:
        """Step until the search stops, then record the headline step as the cell's result (and every
        step's requests and points)."""
        bench = self.bench
        recorder = bench.recorder
        recorder.enter(Stage.BENCHMARK)
        search = ConcurrencySearch.of(self.spec, bench.cell.slo.is_set)
        met_by_index: dict[int, bool | None] = {}
        try:
            while (concurrency := search.next_concurrency()) is not None:
                outcome, samples, index = self._step(concurrency, None)
                met_by_index[index] = self._point(outcome, samples, index, concurrency, search)
            bench.accuracy_pass()
        except StageError as failure:
            kept, exc = self.keep_interrupted(failure, "concurrency sweep", len(self.points))
            if kept:
                bench.details["frontier"] = frontier_details(self.points, "interrupted", search.saturated_at)
            raise exc
        recorder.enter(Stage.RESULTS)
        headline = self.headline(met_by_index)
        bench.measurement = self._only(headline.run_index)
        result = bench._keep()
        # The headline figures are one step's, at its concurrency.
        result = result.model_copy(update={"test_config": result.test_config.model_copy(
            update={"concurrent_reqs": headline.concurrency})})
        bench.result = recorder.result = result
        recorder.records, recorder.runs = list(self.everything.records), self.everything.runs
        bench.details["frontier"] = frontier_details(self.points, search.stop_reason, search.saturated_at)
        bench.details["runs"] = self.everything.runs
        bench.details["load"] = {**bench.details.get("load", {}), "concurrency": headline.concurrency,
                                 "sweep": "concurrency"}
        answer = dict(kind="concurrency", stop=search.stop_reason.replace(" ", "_"), steps=len(self.points),
                      saturated_at=search.saturated_at, headline_concurrency=headline.concurrency,
                      output_tokens_per_second=_rounded(headline.output_tokens_per_second),
                      tpot_interactivity=_rounded(headline.tpot_interactivity))
        recorder.progress.status("SWEEP_COMPLETE", **{key: value for key, value in answer.items() if value is not None})
        recorder.progress.status("RESULTS_COLLECTED")
        recorder.progress.results(result)
        bench._judge(result)
        return result

    def _point(self, outcome: LoadgenPass, samples: list[GpuSample], index: int, concurrency: int,
               search: ConcurrencySearch) -> bool | None:
        duration = outcome.duration_seconds or self.duration
        point = self.bench.frontier_point(outcome.records, duration, concurrency=concurrency, rate=None,
                                          run_index=index, samples=samples)
        self.points.append(point)
        met = search.record(concurrency, point.output_tokens_per_second, point.goodput_share)
        shown = dict(stage="sweep", kind="concurrency", concurrency=concurrency,
                     output_tokens_per_second=_rounded(point.output_tokens_per_second),
                     tpot_interactivity=_rounded(point.tpot_interactivity),
                     goodput_share=_rounded(point.goodput_share), met=met, step=len(self.points) - 1)
        self.bench.recorder.progress.progress(**{key: value for key, value in shown.items() if value is not None})
        return met

    def headline(self, met_by_index: dict[int, bool | None]) -> FrontierPoint:
        """The step with the highest output throughput that met the SLO (any step without an SLO),
        else the highest of all."""
        def throughput(point: FrontierPoint) -> float:
            return point.output_tokens_per_second or 0.0

        meeting = [p for p in self.points if met_by_index.get(p.run_index) is not False]
        return max(meeting or self.points, key=throughput)
