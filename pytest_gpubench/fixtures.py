"""The fixtures a benchmark cell runs through, one seed stage each.

``gpubench_cell`` -> ``gpubench_recorder`` -> ``gpu_offer`` (inventory) ->
``gpu_session`` (provision, ssh_wait) -> ``gpu_ssh`` (ssh_connect, nvidia-smi)
-> ``ollama_runtime`` (ollama_install, model_pull) -> ``gpubench`` (benchmark,
results). Each acquires one thing and releases it in teardown, whatever
happened; ``pytest --fixtures`` documents them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import ValidationError

from .aio import run as run_async
from .benchmark import BenchmarkPlan
from .budget import exhausted, spend_of
from .compare import compare, figures_of, parse_compare_fail
from .errors import BenchmarkInterrupted, NoEligibleOffer, Stage, StageError
from .export import upload_result
from .matrix import Cell
from .measure import Measurement, details_of, enough_runs, measure_once
from .offers import Constraints
from .outcome import outcome_of
from .providers.shopper import OfferChoice
from .provisioning import BudgetRefused, Provisioning
from .record import CellRecorder, progress_path
from .remote.ssh import KEEPALIVE_INTERVAL, MIN_KEEPALIVE_INTERVAL, Connection, KeyFile
from .remote.system import compute_capability, probe_system
from .result_checks import keep_raw, result_problems
from .results import BenchmarkResult, HardwareInfo, ModelInfo, TestConfig, summarize
from .run import RunContext
from .runtimes.ollama import OllamaRuntime
from .session_pool import Lease, SessionPool, make_room, note_model
from .settings import DEFAULT_OLLAMA_INSTALL
from .shopper import Session
from .stash import (
    CELL_KEY,
    LEASE_KEY,
    NEXT_GROUP_KEY,
    RECORD_KEY,
    RECORDER_KEY,
    REUSE_GROUPS_KEY,
    run_context,
)
from .telemetry import summarize_gpu
from .thresholds import check_thresholds, describe_violations
from .vram import vram_shortfall
from .watch import SessionWatch, watch_interval

#: Seconds of slack on top of a stage timeout for the bridge into the loop.
BRIDGE_SLACK = 10.0
#: Seconds the benchmark may take beyond its timeout to read the instance's checkpoint.
CHECKPOINT_SLACK = 90.0
T = TypeVar("T")


@pytest.fixture(scope="session")
def gpubench_run(pytestconfig: pytest.Config) -> RunContext:
    """This process's run: settings, run id, manifest and GPU Shopper API."""
    return run_context(pytestconfig)


@pytest.fixture(scope="session")
def gpubench_pool(pytestconfig: pytest.Config, gpubench_run: RunContext) -> Iterator[SessionPool]:
    """Sessions kept for the next cell of their reuse group (pay once per GPU).

    Cells of one GPU and provider run one after another on one session unless the
    matrix says ``reuse: cell``; whatever is still held at the end of the run is
    released then.
    """
    pool = SessionPool(gpubench_run, pytestconfig.stash.get(REUSE_GROUPS_KEY, {}))
    yield pool
    pool.close()


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
def gpu_offer(request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
              gpubench_recorder: CellRecorder, gpubench_pool: SessionPool) -> OfferChoice:
    """Stage ``inventory``: the cheapest eligible offer (seed 000's rule).

    A session an earlier cell of the reuse group rented, still running and
    eligible for this cell, is taken instead of a new offer. No eligible offer
    skips the cell with the reason (``--gpubench-fail-on-skip`` fails it instead);
    so does a ``--gpubench-budget`` already used up.
    """
    recorder, cell = gpubench_recorder, gpubench_cell
    recorder.enter(Stage.INVENTORY)
    lease = gpubench_pool.lease_for(cell, Constraints.for_cell(cell), recorder)
    if lease is not None:
        request.node.stash[LEASE_KEY] = lease
        choice = lease.gpu_session.offer
        recorder.progress.status("INVENTORY_QUERY", selected_offer_id=choice.offer.id,
                                 price=choice.offer.price_per_hour, reused_session=lease.session_id)
        return choice
    budget = gpubench_run.settings.budget
    if budget is not None:  # nothing left: no need to ask the inventory (the decisive check is at provision)
        used_up = exhausted(budget, spend_of(gpubench_run.manifest.attempts(gpubench_run.run_id),
                                             datetime.now(timezone.utc)))
        if used_up:
            recorder.skip_reason = used_up
            pytest.skip(f"[inventory] {used_up}")
    wanted = Constraints.for_cell(cell)
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
    request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
    gpubench_recorder: CellRecorder, gpu_offer: OfferChoice, gpubench_pool: SessionPool,
) -> Iterator[GpuSession]:
    """Stages ``provision`` and ``ssh_wait``: a session that is ``running``.

    A provisioning failure (the create refused, the session ``failed``, SSH never
    up) fails over to the next eligible offer, up to ``--gpubench-max-attempts``
    offers (:mod:`pytest_gpubench.provisioning`). A ``--gpubench-budget`` that has
    no room for the session skips the cell. Every attempt's session is released
    in teardown whatever happened, also when creation itself broke off after the
    server made the session (found by consumer_id); a session rented for the
    cell's reuse group is kept instead when the next cell here belongs to the
    group and the session is still well (:mod:`pytest_gpubench.session_pool`).
    """
    recorder, cell, node = gpubench_recorder, gpubench_cell, request.node
    lease: Lease | None = node.stash.get(LEASE_KEY, None)
    if lease is not None:  # an earlier cell of the group rented it
        gpubench_pool.adopt(lease, recorder)
        try:
            yield lease.gpu_session
        finally:
            _hand_back(gpubench_pool, lease, node, recorder)
        return
    wanted = gpu_offer.wanted or Constraints.for_cell(cell)
    planned = gpubench_pool.remaining(recorder.record_key, cell) if cell.session_group else [cell]
    provisioning = Provisioning(gpubench_run, recorder, cell, gpu_offer, wanted, planned=planned)
    key_file: KeyFile | None = None
    try:
        try:
            ready = provisioning.run_until_ready()
        except BudgetRefused as exc:
            recorder.skip_reason = exc.message
            pytest.skip(f"[provision] {exc.message}")
        key_file = KeyFile(ready.created.ssh_private_key, name=ready.session.id)
        # The offer that came up, which after a failover is not the one first chosen.
        session = GpuSession(ready.session, ready.created.ssh_private_key, key_file,
                             replace(gpu_offer, offer=ready.attempt.offer))
        if provisioning.shared:
            lease = node.stash[LEASE_KEY] = gpubench_pool.open(cell, provisioning, session)
            recorder.manifest.update_cell(recorder.row_id, reuse_group=cell.session_group, session_turn=1,
                                          session_owner=recorder.record_key)
        yield session
    finally:
        if lease is not None:
            _hand_back(gpubench_pool, lease, node, recorder)
        else:
            _release(provisioning)
            if key_file is not None:
                key_file.remove()


def _hand_back(pool: SessionPool, lease: Lease, node: pytest.Item, recorder: CellRecorder) -> None:
    """Keep the group's session for the next cell, or release it (never raises)."""
    recorder.time_as(str(Stage.CLEANUP))
    try:
        pool.hand_back(lease, recorder, outcome_of(node, recorder.stage), node.stash.get(NEXT_GROUP_KEY, None))
    except Exception as exc:  # noqa: BLE001 - whatever broke, the session must not be left behind
        pool.release(lease, recorder, f"handing it back failed: {exc}")



def _release(provisioning: Provisioning) -> None:
    """Stage ``cleanup``: end every session this cell owns (every attempt's); never raises."""
    provisioning.recorder.time_as(str(Stage.CLEANUP))
    provisioning.release_all()


@pytest.fixture
def gpu_ssh(request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
            gpubench_recorder: CellRecorder, gpu_session: GpuSession) -> Iterator[Connection]:
    """Stage ``ssh_connect``: an SSH connection, checked, to the expected GPU.

    ``nvidia-smi`` must report the GPU the offer promised; its system info is
    kept for the result's ``hardware`` section (on a reused session, the first
    cell's is kept: the machine is the same, its host key pinned).
    """
    settings, recorder = gpubench_run.settings, gpubench_recorder
    recorder.enter(Stage.SSH_CONNECT)
    session = gpu_session.session
    timeout = settings.stage_timeout(Stage.SSH_CONNECT)
    # The first connection to a session pins its host key; a later one that meets another key fails.
    conn = run_async(gpubench_run.host_keys.connect(session.id, session.ssh_host, session.ssh_port,
                                                    session.ssh_user or "root", gpu_session.key_pem,
                                                    timeout=timeout), timeout + BRIDGE_SLACK)
    try:
        recorder.manifest.update_cell(recorder.row_id, host_key_fingerprint=conn.host_key_fingerprint)
        check = run_async(conn.run("echo gpubench-ssh-ok", stage=Stage.SSH_CONNECT,
                                   what="the SSH connectivity check", timeout=timeout), timeout + BRIDGE_SLACK)
        if "gpubench-ssh-ok" not in check.stdout:
            raise StageError(Stage.SSH_CONNECT, "the SSH connectivity check printed nothing")
        lease: Lease | None = request.node.stash.get(LEASE_KEY, None)
        if lease is not None and lease.hardware is not None:
            recorder.hardware = lease.hardware
        else:
            recorder.hardware = run_async(probe_system(conn, gpubench_cell.gpu, timeout),
                                          timeout * 3 + BRIDGE_SLACK)
            if lease is not None:
                lease.hardware = recorder.hardware
        recorder.progress.status("SYSTEM_INFO", gpu=recorder.hardware.gpu_name,
                                 memory_mib=recorder.hardware.gpu_memory_mib,
                                 driver=recorder.hardware.driver_version, cuda=recorder.hardware.cuda_version)
        yield conn
    finally:
        run_async(conn.close(), 15)


@pytest.fixture
def ollama_runtime(request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
                   gpubench_recorder: CellRecorder, gpu_session: GpuSession, gpu_ssh: Connection) -> OllamaRuntime:
    """Stages ``ollama_install`` and ``model_pull``: Ollama serving the cell's model, warm.

    A model larger than the GPU memory ``nvidia-smi`` reports on the instance skips
    the cell (stage ``model_pull``) before anything is installed or pulled. While the
    model is pulled the session is watched through the API: an instance the
    provider stops ends the stage at once, with the API's reason.
    """
    settings, recorder, cell = gpubench_run.settings, gpubench_recorder, gpubench_cell
    # Keepalives on the run's clock: a link that went silent is noticed in seconds in the sandbox too.
    gpu_ssh.set_keepalive(settings.scaled(KEEPALIVE_INTERVAL, MIN_KEEPALIVE_INTERVAL))
    shortfall = vram_shortfall(cell.model, cell.vram_gb, recorder.hardware)
    if shortfall:
        recorder.enter(Stage.MODEL_PULL)
        if settings.fail_on_skip:
            raise StageError(Stage.MODEL_PULL, shortfall)
        recorder.skip_reason = shortfall
        pytest.skip(f"[model_pull] {shortfall}")
    recorder.enter(Stage.OLLAMA_INSTALL)
    runtime = OllamaRuntime(gpu_ssh)
    lease: Lease | None = request.node.stash.get(LEASE_KEY, None)
    if lease is not None and lease.ollama_started_here:  # an earlier cell of the group started it
        runtime.started_here, runtime.num_parallel = True, lease.ollama_parallel
    timeout = settings.stage_timeout(Stage.OLLAMA_INSTALL)
    install = cell.ollama_install or DEFAULT_OLLAMA_INSTALL

    async def install_and_serve() -> tuple[bool, str]:
        # On a reused session an earlier cell installed it: serving is what is checked.
        known = lease is not None and lease.ollama_started_here
        installed = False if known else await runtime.ensure_installed(install, timeout)
        await runtime.locate(timeout)
        return installed, await runtime.ensure_serving(timeout, num_parallel=ollama_parallelism(cell))

    # Watched like the pull: an instance killed mid-install is named as the cause,
    # not the broken SSH channel it leaves behind.
    installed, version = run_async(_watched(gpubench_run, gpu_session, Stage.OLLAMA_INSTALL,
                                            lambda _: install_and_serve()), 3 * timeout + BRIDGE_SLACK)
    recorder.progress.status("OLLAMA_INSTALLED", version=version, installed_now=installed)

    recorder.enter(Stage.MODEL_PULL)
    timeout = settings.stage_timeout(Stage.MODEL_PULL)

    async def pull_and_warm_up() -> float:
        if lease is not None and lease.models:  # a reused session: earlier cells' models are there
            await make_room(runtime, lease, cell, recorder.progress, min(timeout, 60.0))
        await runtime.pull(cell.model, timeout, _pull_reporter(recorder))
        recorder.pulled = await asyncio.wait_for(runtime.model_info(cell.model), 30)
        # The model the previous cell ran is still loaded: its load is no cold start.
        return await runtime.warm_up(cell.model, timeout, cold_start=lease is None or lease.last_model != cell.model)

    load = run_async(_watched(gpubench_run, gpu_session, Stage.MODEL_PULL, lambda _: pull_and_warm_up()),
                     3 * timeout + 30 + BRIDGE_SLACK)
    if lease is not None:
        note_model(lease, runtime, cell.model)
    recorder.progress.status("MODEL_READY", model=cell.model, load_s=round(load, 2))
    return runtime


async def _watched(run: RunContext, session: GpuSession, stage: Stage,
                   work: Callable[[SessionWatch], Awaitable[T]], *, guard: bool = True) -> T:
    """Await ``work(watch)`` while the API is asked every few seconds whether the instance still runs.

    With ``guard``, a lost instance cancels the work and raises ``InstanceLost``;
    without, the work itself reacts to ``watch`` (the benchmark keeps what it measured).
    """
    async with SessionWatch(run.provider.client, session.session.id, watch_interval(run.settings), stage) as watch:
        job = work(watch)
        return await (watch.guard(job, stage) if guard else job)


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


class ResultsInvalid(StageError):
    """The measured figures cannot be right: kept raw for inspection, not recorded as a result."""

    def __init__(self, message: str, kept: Path) -> None:
        super().__init__(Stage.RESULTS, f"{message}; kept raw in {kept}",
                         hint="nothing from this cell was stored as a measurement")
        self.kept = kept


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
            seed=run_index, request_timeout=self._run.settings.stall_seconds(workload.stall_timeout),
        )

    def run(self) -> BenchmarkResult:
        """Stages ``benchmark`` then ``results``: measure (every run), summarise, judge, record."""
        recorder, settings, cell = self.recorder, self._run.settings, self.cell
        recorder.enter(Stage.BENCHMARK)
        interval = settings.telemetry_interval or cell.workload.telemetry_interval
        run_index = 0
        while True:
            plan = self.plan(run_index)
            self._ensure_ollama()
            timeout = settings.stage_timeout(Stage.BENCHMARK, plan.duration)
            try:
                outcome, samples = run_async(
                    _watched(self._run, self.session, Stage.BENCHMARK, lambda watch, plan=plan, timeout=timeout:
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

    def _ensure_ollama(self) -> None:
        """Seed 001's health check before each run: an Ollama that stopped answering is
        restarted once (and the model loaded again) before the cell fails."""
        settings, recorder, runtime = self._run.settings, self.recorder, self.runtime
        timeout = settings.stage_timeout(Stage.OLLAMA_INSTALL)

        def restarting(reason: str) -> None:
            recorder.progress.status("OLLAMA_RESTART", reason=reason)

        # A restart is a start command, then a wait for /api/version, then maybe the serve log.
        if run_async(runtime.ensure_healthy(timeout, Stage.BENCHMARK, restarting), timeout * 2 + 30 + BRIDGE_SLACK):
            load_timeout = settings.stage_timeout(Stage.MODEL_PULL)
            load = run_async(runtime.warm_up(self.cell.model, load_timeout, cold_start=False),
                             load_timeout + BRIDGE_SLACK)
            recorder.progress.status("OLLAMA_RESTARTED", version=runtime.version, load_s=round(load, 2))

    def _reconnect(self) -> Awaitable[Connection]:
        """A new SSH connection to this cell's session (its host key must not have changed)."""
        session, timeout = self.session.session, min(self._run.settings.stage_timeout(Stage.SSH_CONNECT), 60.0)
        return self._run.host_keys.connect(session.id, session.ssh_host, session.ssh_port, session.ssh_user or "root",
                                           self.session.key_pem, timeout=timeout)

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
        try:
            result = build_result(self.cell, self.recorder, runtime, self.session, measurement)
        except ValidationError as exc:
            raise self._invalid([str(exc).replace("\n", " ")], None) from None
        problems = result_problems(result)
        if problems:
            raise self._invalid(problems, result)
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

