"""The fixtures a benchmark cell runs through, one seed stage each.

``gpubench_cell`` -> ``gpubench_recorder`` -> ``gpu_offer`` (inventory) ->
``gpu_session`` (provision, ssh_wait) -> ``gpu_ssh`` (ssh_connect, nvidia-smi)
-> ``ollama_runtime`` (ollama_install, model_pull) -> ``gpubench`` (benchmark,
results). Each acquires one thing and releases it in teardown, whatever
happened; ``pytest --fixtures`` documents them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .aio import run as run_async
from .benchmark import BenchmarkPlan
from .compare import compare, figures_of, parse_compare_fail
from .errors import BenchmarkInterrupted, NoEligibleOffer, Stage, StageError
from .export import upload_result
from .matrix import Cell
from .measure import Measurement, details_of, enough_runs, measure_once
from .offers import Constraints
from .outcome import outcome_of
from .providers.shopper import OfferChoice, consumer_id, reservation_hours
from .record import CellRecorder, progress_path
from .remote.ssh import Connection, KeyFile
from .remote.system import compute_capability, probe_system
from .results import BenchmarkResult, HardwareInfo, ModelInfo, TestConfig, summarize
from .run import RunContext
from .runtimes.ollama import OllamaRuntime
from .settings import DEFAULT_OLLAMA_INSTALL
from .shopper import Session
from .stash import CELL_KEY, RECORD_KEY, RECORDER_KEY, run_context
from .telemetry import summarize_gpu
from .thresholds import check_thresholds, describe_violations

#: Seconds of slack on top of a stage timeout for the bridge into the loop.
BRIDGE_SLACK = 10.0


@pytest.fixture(scope="session")
def gpubench_run(pytestconfig: pytest.Config) -> RunContext:
    """This process's run: settings, run id, manifest and GPU Shopper API."""
    return run_context(pytestconfig)


@pytest.fixture
def gpubench_cell(request: pytest.FixtureRequest, gpubench_run: RunContext) -> Cell:
    """The matrix cell of this test (GPU, provider, model, workload), with overrides applied.

    Matrix files provide it per item; Python tests get it from
    ``@pytest.mark.gpubench("matrix/file.yaml", gpu=..., model=...)``.
    """
    cell = request.node.stash.get(CELL_KEY, None) or getattr(request, "param", None)
    if not isinstance(cell, Cell):
        pytest.fail("gpubench_cell needs a matrix file item or @pytest.mark.gpubench(MATRIX_FILE)", pytrace=False)
    return gpubench_run.effective_cell(cell)


@pytest.fixture
def gpubench_recorder(
    request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell
) -> Iterator[CellRecorder]:
    """Records the cell in the manifest, its progress file and JUnit properties.

    Set up before anything is rented and finished after everything is released,
    so every outcome (success, partial, failed with its stage, skipped) is kept.
    """
    key = request.node.stash.get(RECORD_KEY, gpubench_cell.cell_id)
    recorder = CellRecorder.start(
        gpubench_run.manifest, gpubench_run.run_id, gpubench_cell, key,
        gpubench_run.settings.progress_dir, gpubench_run.worker,
    )
    request.node.stash[RECORDER_KEY] = recorder
    yield recorder
    outcome = outcome_of(request.node, recorder.stage)
    for name, value in recorder.finish(outcome).items():
        request.node.user_properties.append((name, value))


@pytest.fixture
def gpu_offer(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder) -> OfferChoice:
    """Stage ``inventory``: the cheapest eligible offer (seed 000's rule).

    No eligible offer skips the cell with the reason (``--gpubench-fail-on-skip``
    fails it instead).
    """
    recorder, cell = gpubench_recorder, gpubench_cell
    recorder.enter(Stage.INVENTORY)
    wanted = Constraints(
        gpu=cell.gpu, provider=cell.provider, vram_gb=cell.vram_gb,
        min_confidence=cell.offer.min_availability_confidence, max_price=cell.offer.max_price,
    )
    provider = gpubench_run.provider
    try:
        choice = run_async(provider.choose_offer(wanted),
                           gpubench_run.settings.stage_timeout(Stage.INVENTORY) + BRIDGE_SLACK)
    except NoEligibleOffer as exc:
        if gpubench_run.settings.fail_on_skip:
            raise
        recorder.skip_reason = exc.message
        pytest.skip(f"[inventory] {exc.message}")
    recorder.progress.status("INVENTORY_QUERY", offers_found=choice.offers_found,
                             selected_offer_id=choice.offer.id, price=choice.offer.price_per_hour)
    return choice


@dataclass
class GpuSession:
    """A running GPU session and its key file."""

    session: Session
    key_pem: str = field(repr=False)
    key_file: KeyFile = field(repr=False)
    offer: OfferChoice = field(repr=False)


@pytest.fixture
def gpu_session(
    gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder, gpu_offer: OfferChoice
) -> Iterator[GpuSession]:
    """Stages ``provision`` and ``ssh_wait``: a session that is ``running``.

    Released with ``done`` in teardown whatever happened, also when creation
    itself broke off after the server made the session (found by consumer_id).
    """
    settings, recorder, cell = gpubench_run.settings, gpubench_recorder, gpubench_cell
    provider = gpubench_run.provider
    consumer = consumer_id(settings.run_id, recorder.record_key)
    key_file: KeyFile | None = None
    try:
        recorder.enter(Stage.PROVISION)
        created = run_async(
            provider.create(gpu_offer.offer, consumer, reservation_hours(settings, cell.workload.duration)),
            settings.stage_timeout(Stage.PROVISION) + BRIDGE_SLACK,
        )
        session = created.session
        recorder.session_created(session.id, consumer, gpu_offer.offer.id, gpu_offer.offer.price_per_hour)
        key_file = KeyFile(created.ssh_private_key, name=session.id)
        recorder.progress.status("PROVISIONING", session_id=session.id, offer_id=gpu_offer.offer.id)

        def polled(current: Session, waited: float) -> None:
            recorder.enter(Stage.SSH_WAIT)
            recorder.progress.progress(stage="provision", status=current.status, waited_s=round(waited, 1))

        running = run_async(provider.wait_running(session.id, polled),
                            settings.stage_timeout(Stage.PROVISION) + BRIDGE_SLACK)
        recorder.manifest.update_cell(recorder.row_id, instance_ip=running.ssh_host, ssh_port=running.ssh_port)
        recorder.progress.status("SSH_READY", host=running.ssh_host, port=running.ssh_port)
        yield GpuSession(running, created.ssh_private_key, key_file, gpu_offer)
    finally:
        _release(gpubench_run, recorder, consumer)
        if key_file is not None:
            key_file.remove()


def _release(run: RunContext, recorder: CellRecorder, consumer: str) -> None:
    """Stage ``cleanup``: end every session this cell owns; never raises."""
    timeout = run.settings.stage_timeout(Stage.CLEANUP) + BRIDGE_SLACK
    try:
        provider = run.provider
        ids = [recorder.session_id] if recorder.session_id else []
        if not ids:  # creation may have reached the server before it broke off
            ids = [s.id for s in run_async(provider.client.list_sessions(consumer_id=consumer), timeout) if s.is_active]
        for session_id in ids:
            final = run_async(provider.release(session_id), timeout)
            cost = run_async(provider.client.session_cost(session_id), timeout)
            recorder.session_released(final.status if final else None, cost)
            recorder.progress.status("CLEANUP", session_id=session_id,
                                     status=final.status if final else "unknown")
    except Exception as exc:  # noqa: BLE001 - cleanup reports, it does not mask the cell's error
        recorder.progress.error(Stage.CLEANUP, f"releasing the session failed: {exc}")
        recorder.cleanup_error = str(exc)


@pytest.fixture
def gpu_ssh(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder,
            gpu_session: GpuSession) -> Iterator[Connection]:
    """Stage ``ssh_connect``: an SSH connection, checked, to the expected GPU.

    ``nvidia-smi`` must report the GPU the offer promised; its system info is
    kept for the result's ``hardware`` section.
    """
    settings, recorder = gpubench_run.settings, gpubench_recorder
    recorder.enter(Stage.SSH_CONNECT)
    session = gpu_session.session
    timeout = settings.stage_timeout(Stage.SSH_CONNECT)
    conn = run_async(Connection.open(session.ssh_host, session.ssh_port, session.ssh_user or "root",
                                     gpu_session.key_pem, timeout=timeout), timeout + BRIDGE_SLACK)
    try:
        check = run_async(conn.run("echo gpubench-ssh-ok", stage=Stage.SSH_CONNECT,
                                   what="the SSH connectivity check", timeout=timeout), timeout + BRIDGE_SLACK)
        if "gpubench-ssh-ok" not in check.stdout:
            raise StageError(Stage.SSH_CONNECT, "the SSH connectivity check printed nothing")
        recorder.hardware = run_async(probe_system(conn, gpubench_cell.gpu, timeout), timeout * 3 + BRIDGE_SLACK)
        recorder.progress.status("SYSTEM_INFO", gpu=recorder.hardware.gpu_name,
                                 memory_mib=recorder.hardware.gpu_memory_mib,
                                 driver=recorder.hardware.driver_version, cuda=recorder.hardware.cuda_version)
        yield conn
    finally:
        run_async(conn.close(), 15)


@pytest.fixture
def ollama_runtime(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder,
                   gpu_ssh: Connection) -> OllamaRuntime:
    """Stages ``ollama_install`` and ``model_pull``: Ollama serving the cell's model, warm."""
    settings, recorder, cell = gpubench_run.settings, gpubench_recorder, gpubench_cell
    recorder.enter(Stage.OLLAMA_INSTALL)
    runtime = OllamaRuntime(gpu_ssh)
    timeout = settings.stage_timeout(Stage.OLLAMA_INSTALL)
    install = cell.ollama_install or DEFAULT_OLLAMA_INSTALL
    installed = run_async(runtime.ensure_installed(install, timeout), timeout + BRIDGE_SLACK)
    run_async(runtime.locate(timeout), timeout + BRIDGE_SLACK)
    version = run_async(runtime.ensure_serving(timeout, num_parallel=ollama_parallelism(cell)), timeout + BRIDGE_SLACK)
    recorder.progress.status("OLLAMA_INSTALLED", version=version, installed_now=installed)

    recorder.enter(Stage.MODEL_PULL)
    timeout = settings.stage_timeout(Stage.MODEL_PULL)
    run_async(runtime.pull(cell.model, timeout, _pull_reporter(recorder)), timeout + BRIDGE_SLACK)
    recorder.pulled = run_async(runtime.model_info(cell.model), 30 + BRIDGE_SLACK)
    load = run_async(runtime.warm_up(cell.model, timeout), timeout + BRIDGE_SLACK)
    recorder.progress.status("MODEL_READY", model=cell.model, load_s=round(load, 2))
    return runtime


#: OLLAMA_NUM_PARALLEL for a request-rate cell, whose in-flight count is not fixed.
RATE_MODE_PARALLEL = 64


def ollama_parallelism(cell: Cell) -> int:
    """At least the cell's concurrency: Ollama queues whatever is beyond it."""
    return cell.concurrency if cell.rate is None else max(cell.concurrency, RATE_MODE_PARALLEL)


def _pull_reporter(recorder: CellRecorder):
    """A PROGRESS line whenever the pull passes another 10 %."""
    last = {"decile": -1}

    def report(status: dict) -> None:
        total, completed = status.get("total"), status.get("completed")
        if not total or completed is None:
            return
        pct = int(100 * completed / total)
        if pct // 10 > last["decile"]:
            last["decile"] = pct // 10
            recorder.progress.progress(stage="model_pull", pct=pct, completed_mb=completed // 1_000_000,
                                       total_mb=total // 1_000_000)

    return report


class ThresholdMissed(StageError):
    """The benchmark ran but missed a threshold or regressed against its baseline."""

    def __init__(self, message: str) -> None:
        super().__init__(Stage.RESULTS, message)


class Bench:
    """Runs the cell's benchmark on a ready runtime; ``run()`` returns the result."""

    def __init__(self, run: RunContext, cell: Cell, recorder: CellRecorder, runtime: OllamaRuntime,
                 session: GpuSession) -> None:
        self._run, self.cell, self.recorder, self.runtime, self.session = run, cell, recorder, runtime, session
        self.result: BenchmarkResult | None = None
        self.measurement = Measurement()
        self.details: dict = {}
        self.comparison_line = ""

    def plan(self, run_index: int = 0) -> BenchmarkPlan:
        workload = self.cell.workload
        # Relative to the SSH login directory on the instance.
        checkpoint = progress_path(Path(".gpubench"), self._run.run_id, self.recorder.record_key)
        checkpoint = checkpoint.with_name(f"{checkpoint.stem}.run{run_index}.checkpoint.json")
        return BenchmarkPlan(
            model=self.cell.model, duration=workload.duration, max_tokens=workload.max_tokens,
            prompts=workload.prompt_payload(), warmup_requests=workload.warmup_requests if run_index == 0 else 0,
            progress_interval=workload.progress_interval, checkpoint_every=workload.checkpoint_every,
            checkpoint_path=str(checkpoint), concurrency=self.cell.concurrency, rate=self.cell.rate,
            seed=run_index,
        )

    def run(self) -> BenchmarkResult:
        """Stages ``benchmark`` then ``results``: measure (every run), summarise, judge, record."""
        recorder, settings, cell = self.recorder, self._run.settings, self.cell
        recorder.enter(Stage.BENCHMARK)
        interval = settings.telemetry_interval or cell.workload.telemetry_interval
        run_index = 0
        while True:
            plan = self.plan(run_index)
            timeout = settings.stage_timeout(Stage.BENCHMARK, plan.duration)
            try:
                outcome, samples = run_async(
                    measure_once(self.runtime, plan, timeout=timeout, telemetry_interval=interval,
                                 on_event=self._on_event),
                    timeout + BRIDGE_SLACK,
                )
            except BenchmarkInterrupted as exc:
                self.measurement.add(exc.partial, getattr(exc, "samples", []), run_index)
                self._keep()
                raise
            self.measurement.add(outcome, samples, run_index)
            run_index += 1
            values = [r["tokens_per_second"] for r in self.measurement.runs]
            if enough_runs(cell, settings.runs, values):
                break
            recorder.progress.status("RUN_COMPLETE", run=run_index, tps=values[-1])
        recorder.enter(Stage.RESULTS)
        result = self._keep()
        recorder.progress.status("BENCHMARK_COMPLETE", tps=result.results.avg_tokens_per_second,
                                 requests=result.results.total_requests, tokens=result.results.total_tokens,
                                 runs=len(self.measurement.runs))
        recorder.progress.status("RESULTS_COLLECTED")
        recorder.progress.results(result)
        self._judge(result)
        return result

    def _on_event(self, event: dict) -> None:
        if event["event"] == "progress":
            self.recorder.progress.progress(requests=event.get("requests"), tokens=event.get("tokens"),
                                            tps=event.get("tps"), errors=event.get("errors"))

    def _keep(self) -> BenchmarkResult:
        """Build the result and details of what was measured so far and hand them to the recorder."""
        measurement, runtime = self.measurement, self.runtime
        residency = run_async(runtime.residency(self.cell.model), 30 + BRIDGE_SLACK)
        capability = ""
        if not runtime.conn.closed:
            capability = run_async(compute_capability(runtime.conn, 30), 30 + BRIDGE_SLACK)
        result = build_result(self.cell, self.recorder, runtime, self.session, measurement)
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
        recorder.result, recorder.records, recorder.samples = result, list(measurement.records), measurement.samples
        recorder.runs, recorder.details, self.result = measurement.runs, self.details, result
        return result

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
            manifest = self._run.manifest
            baseline = manifest.baseline(recorder.record_key, settings.compare or "last",
                                         exclude_run=self._run.run_id)
            if baseline is not None:
                comparison = compare(figures_of(result, self._run.run_id), baseline,
                                     parse_compare_fail(settings.compare_fail or ""))
                self.comparison_line = comparison.line()
                self.details["comparison"] = self.comparison_line
                recorder.progress.status("COMPARED", line=self.comparison_line)
                if comparison.failed:
                    raise ThresholdMissed(comparison.failure())
            else:
                recorder.progress.status("COMPARED", line="no baseline for this cell")
        if violations:
            raise ThresholdMissed(describe_violations(violations))


def build_result(cell: Cell, recorder: CellRecorder, runtime: OllamaRuntime, session: GpuSession,
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
            runtime="ollama",
            runtime_version=runtime.version,
        ),
        test_config=TestConfig(
            duration_minutes=round(workload.duration / 60),
            max_tokens=workload.max_tokens,
            prompt_types=[workload.prompt_set or "custom"],
            concurrent_reqs=cell.concurrency,
            warmup_requests=workload.warmup_requests,
        ),
        results=summarize(measurement.records, measurement.duration_seconds or workload.duration),
        gpu_stats=summarize_gpu(measurement.samples),
        provider=cell.provider,
        location=session.offer.offer.location,
        price_per_hour=session.offer.offer.price_per_hour,
    )


@pytest.fixture
def gpubench(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder,
             ollama_runtime: OllamaRuntime, gpu_session: GpuSession) -> Bench:
    """A ready benchmark for this cell: call ``gpubench.run()`` in the test body.

    Everything before it (offer, session, SSH, Ollama, model) is set up by the
    fixtures it depends on, and released in their teardown.
    """
    if gpubench_run.settings.upload:
        gpubench_recorder.upload = lambda benchmark_id: _upload(gpubench_run, gpubench_recorder, benchmark_id)
    return Bench(gpubench_run, gpubench_cell, gpubench_recorder, ollama_runtime, gpu_session)


def _upload(run: RunContext, recorder: CellRecorder, benchmark_id: str) -> None:
    error = run_async(upload_result(run.manifest, run.provider.client, benchmark_id), 60 + BRIDGE_SLACK)
    if error:
        recorder.progress.error(Stage.RESULTS, f"upload failed (kept; retry with gpubench upload): {error}")
    else:
        recorder.progress.status("IMPORTED", benchmark_id=benchmark_id)

