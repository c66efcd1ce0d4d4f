"""The fixtures a benchmark cell runs through, one seed stage each.

``gpubench_cell`` -> ``gpubench_recorder`` -> ``gpu_offer`` (inventory) ->
``gpu_session`` (provision, ssh_wait) -> ``gpu_ssh`` (ssh_connect, nvidia-smi)
-> ``gpu_runtime`` (runtime_setup, model_pull) -> ``gpubench`` (benchmark,
results). Each acquires one thing and releases it in teardown, whatever
happened; ``pytest --fixtures`` documents them. After them: the calls of the user
hooks the fixtures make, and a cell's outcome read from its phase reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from ..aio import run as run_async
from ..cloud.budget import exhausted, spend_of
from ..run.cell_benchmark import BRIDGE_SLACK, Bench, GpuSession, connect, upload_now, watched
from ..run.cell_microbench import Microbench
from ..errors import (BenchmarkInterrupted, BudgetRefused, ErrorBudgetExceeded, GpubenchError, MatrixError,
                      NoEligibleOffer, Stage, StageError)
from ..matrix.adjust import with_workload
from ..matrix.cells import Cell
from ..matrix.fields import KEPT_MACHINES
from ..run.hints import host_key_pinned
from ..cloud.offers import EVICTION_SECONDS, MIN_RECHECK_WAIT, choose_offer_rechecking, put_first
from ..cloud.provider import Constraints, OfferChoice
from ..run.provisioning import Provisioning
from .claims import claim_keeping
from ..run.record import CellOutcome, CellRecorder
from ..remote.ssh import KEEPALIVE_INTERVAL, MIN_KEEPALIVE_INTERVAL, Connection, KeyFile
from ..remote.sysinfo import detect_system, hardware_of
from ..remote.readings import HardwareInfo
from ..measure.finished import FinishedCell, figures_of
from ..run.run_context import RunContext
from ..runtimes.base import Runtime, vram_shortfall
from ..runtimes.openai_server import adopt_image_server
from ..cloud.ssh_wait import stage_timeout
from ..runtimes.registry import has_model, keep_apart, leave_as_found, runtime_for
from ..run.session_pool import make_room, note_model, take_over_server
from ..store.records import junit_property, progress_labels
from ..store.records import matrix_key
from ..run.session_pool import Lease, SessionPool
from .stash import (
    CELL_KEY,
    LEASE_KEY,
    NEXT_GROUP_KEY,
    RECORD_KEY,
    RECORDER_KEY,
    REPORTS_KEY,
    REUSE_GROUPS_KEY,
    run_context,
)


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
    return adjust_workload(request.config, gpubench_run.effective_cell(cell))


@pytest.fixture
def gpubench_recorder(
    request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell
) -> Iterator[CellRecorder]:
    """Records the cell in the manifest, its progress file and JUnit properties.

    Set up before anything is rented and finished after everything is released,
    so every outcome (success, partial, failed with its stage, skipped) is kept.
    """
    key = request.node.stash.get(RECORD_KEY, matrix_key(gpubench_cell.cell_id))
    recorder = CellRecorder.start(
        gpubench_run.store, gpubench_run.run_id, gpubench_cell, key,
        gpubench_run.settings.progress_dir, gpubench_run.worker, labels=progress_labels(gpubench_run.settings),
        **claim_keeping(request.node),
    )
    request.node.stash[RECORDER_KEY] = recorder
    yield recorder
    outcome = outcome_of(request.node, recorder.stage)
    properties = recorder.finish(outcome)
    for name, value in properties.items():
        request.node.user_properties.append((name, value))
    request.node.user_properties.append(junit_property(gpubench_run.settings))
    cell_finished(request.config, recorder, outcome.status, outcome.failure_stage, outcome.error_message,
                             properties)
    if recorder.claim_lost is not None and outcome.status != "failed":
        pytest.fail(recorder.claim_lost, pytrace=False)  # taken over: whatever it measured is not this run's


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
        used_up = exhausted(budget, spend_of(gpubench_run.store.attempts(gpubench_run.run_id),
                                             datetime.now(timezone.utc)))
        if used_up:
            recorder.skip_reason = used_up
            pytest.skip(f"[inventory] {used_up}")
    wanted = Constraints.for_cell(cell)
    provider = gpubench_run.provider_for(cell.cloud)
    # An offer of this group listed earlier may be away for a provider's cache TTL (cloud/offers.py).
    wait = gpubench_run.settings.scaled(EVICTION_SECONDS, MIN_RECHECK_WAIT)

    def waiting(reason: str, seconds: float) -> None:
        recorder.progress.status("OFFERS_RECHECK", reason=reason, wait_s=round(seconds, 1))

    try:
        choice = run_async(choose_offer_rechecking(provider, wanted, wait=wait, on_wait=waiting,
                                                   offered_before=gpubench_run.offers_seen.seen(cell.reuse_group)),
                           gpubench_run.settings.stage_timeout(Stage.INVENTORY) + wait + BRIDGE_SLACK)
    except NoEligibleOffer as exc:
        if gpubench_run.settings.fail_on_skip:
            raise
        recorder.skip_reason = exc.message
        pytest.skip(f"[inventory] {exc.message}")
    gpubench_run.offers_seen.saw(cell.reuse_group)
    choice = select_offer(request.config, cell, choice)
    recorder.progress.status("INVENTORY_QUERY", offers_found=choice.offers_found,
                             selected_offer_id=choice.offer.id, price=choice.offer.price_per_hour)
    return choice


@pytest.fixture
def gpu_session(
    request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
    gpubench_recorder: CellRecorder, gpu_offer: OfferChoice, gpubench_pool: SessionPool,
) -> Iterator[GpuSession]:
    """Stages ``provision`` and ``ssh_wait``: a session that is ``running``.

    A provisioning failure (the create refused, the session ``failed``, SSH never
    up) fails over to the next eligible offer, up to ``--gpubench-max-attempts``
    offers (:mod:`pytest_gpubench.run.provisioning`). A ``--gpubench-budget`` that has
    no room for the session skips the cell. Every attempt's session is released
    in teardown whatever happened, also when creation itself broke off after the
    server made the session (found by consumer_id); a session rented for the
    cell's reuse group is kept instead when the next cell here belongs to the
    group and the session is still well (:mod:`pytest_gpubench.run.session_pool`).
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
        # A rented session's key is written for `ssh -i`; a host's key file is used where it is, never
        # copied, and an agent host or this machine has none to write.
        key_file = KeyFile(ready.ssh.private_key, name=ready.session.id) if ready.ssh.private_key else None
        # The offer that came up, which after a failover is not the one first chosen.
        session = GpuSession(ready.session, ready.ssh, key_file,
                             replace(gpu_offer, offer=ready.attempt.offer), cloud=cell.cloud, image=ready.image)
        if provisioning.shared:
            lease = node.stash[LEASE_KEY] = gpubench_pool.open(cell, provisioning, session)
            recorder.store.update_cell(recorder.row_id, reuse_group=cell.session_group, session_turn=1,
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
    timeout = settings.stage_timeout(Stage.SSH_CONNECT)
    pinned = host_key_pinned(recorder, gpu_session.ssh)  # a host's key trusted on first use is said
    conn = run_async(connect(gpubench_run, gpu_session, timeout, on_pinned=pinned), timeout + BRIDGE_SLACK)
    try:
        recorder.store.update_cell(recorder.row_id, host_key_fingerprint=conn.host_key_fingerprint)
        check = run_async(conn.run("echo gpubench-ssh-ok", stage=Stage.SSH_CONNECT,
                                   what="the SSH connectivity check", timeout=timeout), timeout + BRIDGE_SLACK)
        if "gpubench-ssh-ok" not in check.stdout:
            raise StageError(Stage.SSH_CONNECT, "the SSH connectivity check printed nothing")
        lease: Lease | None = request.node.stash.get(LEASE_KEY, None)
        if gpu_session.ssh.declared_hardware:  # nothing to probe (a running endpoint): the matrix's GPU
            recorder.hardware = HardwareInfo(gpu_name=gpubench_cell.gpu, gpu_count=gpubench_cell.gpus)
        elif lease is not None and lease.system is not None:
            recorder.system, recorder.hardware = lease.system, hardware_of(lease.system)
        else:  # the session's first connection: detect the system, record it once for the session
            system = run_async(detect_system(conn, gpubench_cell.gpu, timeout, gpu_count=gpubench_cell.gpus,
                                             gpu_indices=gpu_session.ssh.gpu_indices),
                               timeout * 5 + BRIDGE_SLACK)
            recorder.system, recorder.hardware = system, hardware_of(system)
            recorder.store.record_system(recorder.row_id, gpu_session.session.id, system,
                                         machine=gpu_session.offer.offer.machine)
            if lease is not None:
                lease.system = system
        recorder.progress.status("SYSTEM_INFO", gpu=recorder.hardware.gpu_name,
                                 memory_mib=recorder.hardware.gpu_memory_mib,
                                 driver=recorder.hardware.driver_version, cuda=recorder.hardware.cuda_version,
                                 **({"declared": True} if gpu_session.ssh.declared_hardware else {}))
        yield conn
    finally:
        run_async(conn.close(), 15)


@pytest.fixture
def gpu_runtime(request: pytest.FixtureRequest, gpubench_run: RunContext, gpubench_cell: Cell,
                gpubench_recorder: CellRecorder, gpu_session: GpuSession, gpu_ssh: Connection) -> Runtime:
    """Stages ``runtime_setup`` and ``model_pull``: the cell's runtime serving its model, warm.

    The runtime is the one the cell's ``runtime:`` names (default ``ollama``), built
    by :func:`~pytest_gpubench.runtimes.registry.runtime_for`.

    A model larger than the GPU memory ``nvidia-smi`` reports on the instance skips
    the cell (stage ``model_pull``) before anything is installed or pulled. While the
    model is pulled the session is watched through the API: an instance the
    provider stops ends the stage at once, with the API's reason.

    On a machine the run does not own (``cloud: hosts``, ``local``), teardown leaves it as
    found: a server started here is stopped, a pulled model removed when the inventory says
    ``keep_models: false`` (``runtimes/registry.py``).
    """
    settings, recorder, cell = gpubench_run.settings, gpubench_recorder, gpubench_cell
    if cell.microbench is not None:
        recorder.enter(Stage.RUNTIME_SETUP)
        raise StageError(Stage.RUNTIME_SETUP, f"{cell.cell_id} is a microbenchmark cell: it has no model to "
                                               "serve; use the gpubench_microbench fixture (docs/hardware.md)")
    # Keepalives on the run's clock: a link that went silent is noticed in seconds in the sandbox too.
    gpu_ssh.set_keepalive(settings.scaled(KEEPALIVE_INTERVAL, MIN_KEEPALIVE_INTERVAL))
    shortfall = vram_shortfall(cell.model, cell.vram_gb, recorder.hardware, gpus=cell.gpus)
    if shortfall:
        recorder.enter(Stage.MODEL_PULL)
        if settings.fail_on_skip:
            raise StageError(Stage.MODEL_PULL, shortfall)
        recorder.skip_reason = shortfall
        pytest.skip(f"[model_pull] {shortfall}")
    recorder.enter(Stage.RUNTIME_SETUP)
    runtime = runtime_for(cell, gpu_ssh, gpu_indices=gpu_session.ssh.gpu_indices)
    if hasattr(runtime, "on_status"):  # a server it starts: a stale pid file of one is reported here
        runtime.on_status = recorder.progress.status
    lease: Lease | None = request.node.stash.get(LEASE_KEY, None)
    known = take_over_server(lease, runtime)  # an earlier cell of the group started it
    known = adopt_image_server(runtime, cell.launch) or known  # the session's image serves the model
    timeout = stage_timeout(settings, Stage.RUNTIME_SETUP, gpu_session.image)  # longer for a heavy image
    kept_machine, pulled_here = cell.cloud in KEPT_MACHINES, {"model": False}

    def leave_machine() -> None:
        if lease is None or request.node.stash.get(NEXT_GROUP_KEY, None) != lease.group:  # its last cell here
            _leave_as_found(gpubench_run, recorder, runtime, cell.model, pulled_here["model"])

    if kept_machine:  # not ours: kept apart from other cells there, left as found, also after a failure
        keep_apart(runtime, gpu_session.ssh.gpu_indices)
        request.addfinalizer(leave_machine)

    async def install_and_serve() -> tuple[bool, str]:
        # On a reused session an earlier cell installed it: serving is what is checked.
        installed = False if known else await runtime.ensure_installed(timeout)
        await runtime.locate(timeout)
        return installed, await runtime.ensure_serving(timeout, num_parallel=server_parallelism(cell))

    # Watched like the pull: an instance killed mid-install is named as the cause,
    # not the broken SSH channel it leaves behind.
    installed, version = run_async(watched(gpubench_run, gpu_session, Stage.RUNTIME_SETUP,
                                            lambda _: install_and_serve()), 3 * timeout + BRIDGE_SLACK)
    # The seed-000 label (seed tooling reads it) for every runtime; runtime= says which one started.
    recorder.progress.status("OLLAMA_INSTALLED", version=version, installed_now=installed, runtime=runtime.name)

    recorder.enter(Stage.MODEL_PULL)
    timeout = settings.stage_timeout(Stage.MODEL_PULL)

    async def pull_and_warm_up() -> float:
        if lease is not None and lease.models:  # a reused session: earlier cells' models are there
            await make_room(runtime, lease, cell, recorder.progress.status, min(timeout, 60.0))
        absent = kept_machine and not gpu_session.ssh.keep_models and not await has_model(runtime, cell.model)
        await runtime.pull(cell.model, timeout, _pull_reporter(recorder))
        pulled_here["model"] = absent
        recorder.pulled = await asyncio.wait_for(runtime.model_info(cell.model), 30)
        # The model the previous cell ran is still loaded: its load is no cold start.
        return await runtime.warm_up(cell.model, timeout, cold_start=lease is None or lease.last_model != cell.model)

    load = run_async(watched(gpubench_run, gpu_session, Stage.MODEL_PULL, lambda _: pull_and_warm_up()),
                     3 * timeout + 30 + BRIDGE_SLACK)
    if lease is not None:
        note_model(lease, runtime, cell.model)
    recorder.progress.status("MODEL_READY", model=cell.model, load_s=round(load, 2))
    return runtime


def _leave_as_found(run: RunContext, recorder: CellRecorder, runtime: Runtime, model: str, remove: bool) -> None:
    """Stage ``cleanup`` on a machine the run does not own; never raises (it reports)."""
    timeout = run.settings.stage_timeout(Stage.CLEANUP)
    try:
        done = run_async(leave_as_found(runtime, model, remove_model=remove, timeout=timeout),
                         2 * timeout + BRIDGE_SLACK)
        if done:
            recorder.progress.status("LEFT_AS_FOUND", done="; ".join(done))
    except Exception as exc:  # noqa: BLE001 - the cell's own outcome stands; the leftover is reported
        recorder.progress.error(Stage.CLEANUP, f"leaving the machine as found failed: {exc}")
        recorder.cleanup_error = str(exc)


def server_parallelism(cell: Cell) -> int:
    """The requests the cell's server batches at once: the matrix's ``runtime.batch_limit``, else the
    default for the cell's load (:attr:`Cell.batch_limit`, docs/runtimes.md)."""
    return cell.batch_limit


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


@pytest.fixture
def gpubench(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder,
             gpu_runtime: Runtime, gpu_session: GpuSession) -> Bench:
    """A ready benchmark for this cell: call ``gpubench.run()`` in the test body.

    Everything before it (offer, session, SSH, runtime, model) is set up by the
    fixtures it depends on, and released in their teardown.
    """
    if gpubench_run.settings.upload:
        gpubench_recorder.upload = lambda benchmark_id: upload_now(gpubench_run, gpubench_recorder, benchmark_id)
    return Bench(gpubench_run, gpubench_cell, gpubench_recorder, gpu_runtime, gpu_session)


@pytest.fixture
def gpubench_microbench(gpubench_run: RunContext, gpubench_cell: Cell, gpubench_recorder: CellRecorder,
                        gpu_session: GpuSession, gpu_ssh: Connection) -> Microbench:
    """A microbenchmark cell (``microbench:``) on its checked SSH connection: call ``.run()``.

    No runtime and no model: ``run()`` makes torch importable on the instance (stage
    ``runtime_setup``) and measures the GPU (stage ``benchmark``), docs/hardware.md.
    """
    return Microbench(gpubench_run, gpubench_cell, gpubench_recorder, gpu_session, gpu_ssh)


# --------------------------------------------------------------------------------------------------
# Calls of the user hooks (:mod:`.hookspec`) where the fixtures need them: one function each.
#
# Thin on purpose: the answers are checked and applied by plain modules.


def select_offer(config: pytest.Config, cell: Cell, choice: OfferChoice) -> OfferChoice:
    """``choice`` with the offer a ``pytest_gpubench_select_offer`` picked first, if one did."""
    chosen = config.hook.pytest_gpubench_select_offer(cell=cell, eligible=list(choice.eligible),
                                                      chosen=choice.offer, config=config)
    if chosen is None:
        return choice
    eligible = put_first(choice.eligible, chosen, "pytest_gpubench_select_offer")
    return replace(choice, offer=eligible[0], eligible=eligible)


def adjust_workload(config: pytest.Config, cell: Cell) -> Cell:
    """``cell`` with the workload a ``pytest_gpubench_adjust_workload`` returned, if one did."""
    returned = config.hook.pytest_gpubench_adjust_workload(cell=cell, workload=cell.workload, config=config)
    try:
        return with_workload(cell, returned, "pytest_gpubench_adjust_workload")
    except MatrixError as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: the report shows one message, not two


def cell_finished(config: pytest.Config, recorder: Any, status: str, failure_stage: str | None,
                  error_message: str | None, properties: dict[str, Any]) -> None:
    """Tell every ``pytest_gpubench_cell_finished`` how the cell ``recorder`` recorded ended."""
    if not config.pluginmanager.hook.pytest_gpubench_cell_finished.get_hookimpls():
        return  # nobody listens: build nothing
    finished = FinishedCell(run_id=recorder.run_id, cell_key=recorder.record_key, cell=recorder.cell,
                            status=status, failure_stage=failure_stage, error_message=error_message,
                            result=recorder.result, figures=figures_of(properties),
                            progress_file=str(recorder.progress.path))
    config.hook.pytest_gpubench_cell_finished(finished=finished, config=config)


# --------------------------------------------------------------------------------------------------
# A cell's outcome from its pytest phase reports: success, partial, failed, skipped.


#: How a run ended, by pytest's exit status, as the manifest's ``runs.status`` says it.
RUN_STATUS = {pytest.ExitCode.OK: "passed", pytest.ExitCode.TESTS_FAILED: "failed",
              pytest.ExitCode.INTERRUPTED: "interrupted"}


def run_status(exitstatus: int) -> str:
    """``passed``, ``failed``, ``interrupted``, or ``exit N`` for pytest's other statuses."""
    return RUN_STATUS.get(int(exitstatus), f"exit {int(exitstatus)}")


def outcome_of(item: pytest.Item, current_stage: Stage) -> CellOutcome:
    """Classify the cell from its setup and call reports (teardown is not yet known).

    ``current_stage`` is where the cell was when it stopped: the stage blamed for
    an error that does not carry its own (an assertion, an interrupt).
    """
    reports = item.stash.get(REPORTS_KEY, {})
    for when in ("setup", "call"):
        report, error = reports.get(when, (None, None))
        if report is None:
            continue
        if report.skipped:
            # The stage says where the cell stopped: inventory (no offer), model_pull (too large)...
            return CellOutcome("skipped", failure_stage=str(current_stage), failure_reason="skipped",
                           error_message=_skip_reason(report))
        if report.failed:
            return _failure(error, current_stage)
    if "call" in reports:
        return CellOutcome("success")
    return CellOutcome("failed", failure_stage=str(current_stage), failure_reason="interrupted",
                   error_message="the run stopped before this cell finished")


def write_error_now(item: pytest.Item) -> None:
    """A cell's setup or call just failed: its ``ERROR:`` line goes to its progress file
    now, before pytest reports the failure (the terminal then shows it before the ``F``)."""
    recorder = item.stash.get(RECORDER_KEY, None)
    if recorder is not None:
        recorder.failed_now(outcome_of(item, recorder.stage))


def _failure(error: BaseException | None, stage: Stage) -> CellOutcome:
    if isinstance(error, BenchmarkInterrupted):
        return CellOutcome("partial", failure_stage=str(error.stage), failure_reason="interrupted",
                       error_message=str(error))
    if isinstance(error, ErrorBudgetExceeded):  # measured and kept, but mostly errors: seed 001's partial
        return CellOutcome("partial", failure_stage=str(error.stage), failure_reason="ErrorBudgetExceeded",
                           error_message=str(error))
    if isinstance(error, StageError):
        return CellOutcome("failed", failure_stage=str(error.stage), failure_reason=type(error).__name__,
                       error_message=str(error))
    if isinstance(error, GpubenchError):
        return CellOutcome("failed", failure_stage=str(stage), failure_reason=type(error).__name__,
                       error_message=str(error))
    message = f"{type(error).__name__}: {error}" if error is not None else "failed"
    return CellOutcome("failed", failure_stage=str(stage), failure_reason=type(error).__name__ if error else "failed",
                   error_message=message.strip())


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "skipped")
