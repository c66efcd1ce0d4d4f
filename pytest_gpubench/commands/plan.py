"""``gpubench plan``: what a run would rent, for how long and for how much, before paying.

For the cells pytest would run (:func:`..plugin.collect.collect_cells`), in run order, the plan
asks the live inventory which offer each cell would take, with the fixtures' own
constraints and rule (``Constraints.for_cell`` and the cell's ``cloud:`` provider's
:meth:`~pytest_gpubench.cloud.provider.Provider.choose_offer`, built by
:mod:`pytest_gpubench.cloud.registry` with ``fixed_offers``: one snapshot of the
inventory per marketplace). Then it walks the cells as
the session pool would (:mod:`.session_pool`): a cell whose reuse group already
holds a session that fits it runs on that session; otherwise it rents one. A
session pays its setup (provision, SSH wait, connect, Ollama) once; each cell on
it pays its model's pull (none when the model is already there) and its
benchmark. Times come from the stage estimates below; cost is the offer's price x
the session's hours, the renting cell carrying the setup (as the manifest
splits it). Wall time: everything back to back on one worker, and under
``-n N`` the reuse groups (one xdist group each) dealt longest first to the
least loaded worker (LPT), an estimate of the makespan. With ``-n N`` the groups
are first split over more sessions as the run would split them
(:mod:`.reuse_split`), and the plan also prices one session per group.

Nothing is provisioned: the only API calls are ``GET /health`` and one
``GET /api/v1/inventory`` per provider.

**How long each stage of a cell is expected to take** (:class:`StageHistory`).

Two sources, the first that has something to say wins:

* **History**: the manifest's finished cells (``success``, ``partial``, ``failed``)
  of earlier runs on the same kind of cloud (sandbox runs for a sandbox plan, real
  ones otherwise). Their progress files (the manifest's ``progress_file`` column)
  time every stage to the second, from one ``STATUS`` line to the next:

  ============== =========================================
  stage          from -> to
  ============== =========================================
  provision      ``INVENTORY_QUERY`` -> first ``PROVISIONING`` (the create call)
  ssh_wait       first ``PROVISIONING`` -> ``SSH_READY`` (boot; failed attempts included)
  ssh_connect    ``SSH_READY`` -> ``SYSTEM_INFO``
  runtime_setup  ``SYSTEM_INFO`` -> ``OLLAMA_INSTALLED`` (cells that rented their session)
  model_pull     ``OLLAMA_INSTALLED`` -> ``MODEL_READY`` (pull and warm-up load)
  ============== =========================================

  A stage's estimate is the median of its samples, from the most specific cells
  that have any: for setup stages the same provider and GPU, then the same
  provider; for the pull the same model on the same provider, then the same model.
  The manifest's other times do not split a cell into stages (``attempts`` only
  knows the create and the release, ``benchmark_manifest`` the cell's start and end).
* **Defaults** (:data:`DEFAULT_STAGE_SECONDS`, on a real cloud; a sandbox plan
  multiplies them by its time scale, as the sandbox does its delays): seed 000's
  example run where it times a stage, and the model's size for the pull.

The benchmark itself is the workload's duration times its runs plus the warm-up
requests (``max_tokens`` at the tokens/s earlier runs measured for that GPU and
model, or seed 000's figure); it is never time-scaled, in the sandbox neither.

**For people** (:func:`render`): aligned tables (like the run's summary), then the totals.
"""

from __future__ import annotations

import asyncio
import heapq
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import CommandProblem, NoEligibleOffer, Stage, StageError, redact
from ..matrix.cells import Cell, model_ref, normalize_gpu, normalize_provider
from ..cloud.offers import unfit
from ..cloud.provider import Constraints, Offer, OfferChoice, Provider
from ..plugin.collect import collect_cells
from ..cloud.registry import build_provider
from ..cloud.budget import usd
from ..cloud.reuse_split import (DEFAULT_STAGE_SECONDS, PULL_SECONDS_PER_GB, SplitPolicy, order_for_reuse, percent,
                                 planned_benchmark_seconds, split_groups)
from ..settings import Settings
from ..store.progress import ProgressLine, read_progress

#: The pull (and warm-up load) of a model takes ``PULL_SECONDS_PER_GB`` per GB of the
#: model's VRAM need: the figure session reuse orders groups by
#: (:mod:`pytest_gpubench.run.session_pool`); seed 000 pulled and loaded llama3:70b
#: (48 GB) in 4 minutes (``OLLAMA_INSTALLED`` 10:03 -> ``MODEL_READY`` 10:07), 5 s/GB.
DEFAULT_PULL_SECONDS_PER_GB = PULL_SECONDS_PER_GB
#: Tokens/s assumed for warm-up requests without history: seed 000's llama3:70b
#: figure (41.6), slow on purpose, so small models' warm-ups are not underestimated.
DEFAULT_TOKENS_PER_SECOND = 41.6
#: The stages a session pays once, in order; the pull is per cell.
SETUP_STAGES: tuple[Stage, ...] = (Stage.PROVISION, Stage.SSH_WAIT, Stage.SSH_CONNECT, Stage.RUNTIME_SETUP)
#: Progress-file labels that bound each stage (from, to).
STAGE_BOUNDS: Mapping[Stage, tuple[str, str]] = {
    Stage.PROVISION: ("INVENTORY_QUERY", "PROVISIONING"),
    Stage.SSH_WAIT: ("PROVISIONING", "SSH_READY"),
    Stage.SSH_CONNECT: ("SSH_READY", "SYSTEM_INFO"),
    Stage.RUNTIME_SETUP: ("SYSTEM_INFO", "OLLAMA_INSTALLED"),
    Stage.MODEL_PULL: ("OLLAMA_INSTALLED", "MODEL_READY"),
}
_FINISHED = ("success", "partial", "failed")


@dataclass(frozen=True)
class Estimate:
    """Seconds, and where the figure comes from (``history: ...`` or ``default``)."""

    seconds: float
    source: str


def stage_seconds(lines: Iterable[ProgressLine]) -> dict[Stage, float]:
    """Each stage's seconds in one cell's progress file (only stages it passed).

    A cell that ran on a session an earlier cell rented (``SESSION_REUSED``) only
    tells the pull: its connect and Ollama check are not a session's setup.
    """
    first: dict[str, float] = {}
    for line in lines:
        if line.kind == "STATUS" and line.label and line.label not in first:
            first[line.label] = line.timestamp.timestamp()
    reused = "SESSION_REUSED" in first
    found: dict[Stage, float] = {}
    for stage, (start, end) in STAGE_BOUNDS.items():
        if reused and stage is not Stage.MODEL_PULL:
            continue
        if start in first and end in first and first[end] >= first[start]:
            found[stage] = first[end] - first[start]
    return found


@dataclass
class _Sample:
    provider: str
    gpu: str
    model: str
    stages: dict[Stage, float]
    tokens_per_second: float | None


@dataclass
class StageHistory:
    """Stage times of earlier cells, and the estimates drawn from them (or the defaults)."""

    samples: list[_Sample] = field(default_factory=list)
    #: Multiplies the defaults: the sandbox's time scale for a sandbox plan, else 1.
    time_scale: float = 1.0
    #: What the history was read from, for the plan's footnote.
    description: str = "no manifest history"

    @classmethod
    def from_manifest(cls, path: Path | str, *, sandbox: bool, time_scale: float = 1.0) -> StageHistory:
        """Read the finished cells of ``path`` (left alone, and not created, when missing)."""
        history = cls(time_scale=time_scale)
        from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest
        from ..store.opening import open_store, redact, store_exists

        if not store_exists(path):
            history.description = f"no manifest at {redact(path)}"
            return history
        try:
            # A plan only reads: a file that is no manifest, or an older one, is left as it is.
            store = open_store(path, busy_timeout=5, retry_seconds=10, read_only=True)
        except (NotAManifest, MigrationNeeded, ManifestTooNew) as exc:
            history.description = f"no manifest history: {exc}"
            return history
        with store:
            runs = [store.run(run_id) for run_id in store.run_ids()]
            sandboxed = {run.run_id for run in runs if run is not None and run.sandbox}
            cells = [cell for cell in store.cells() if cell.status in _FINISHED
                     and (cell.run_id in sandboxed) == sandbox]
        for cell in cells:
            progress = _progress_file(cell.progress_file, path)
            if progress is None:
                continue
            try:
                stages = stage_seconds(read_progress(progress))
            except OSError:
                continue
            if stages or cell.decode_tokens_per_second:
                history.samples.append(_Sample(normalize_provider(cell.provider), normalize_gpu(cell.gpu_type),
                                               model_ref(cell.model).lower(), stages,
                                               cell.decode_tokens_per_second or None))
        kind = "sandbox" if sandbox else "real-cloud"
        history.description = f"{len(history.samples)} finished {kind} cell(s) in {path}"
        return history

    # ------------------------------------------------------------------ estimates

    def setup(self, stage: Stage, cell: Cell) -> Estimate:
        """A setup stage (paid once per session) of ``cell``'s session."""
        provider, gpu = normalize_provider(cell.provider), normalize_gpu(cell.gpu)
        found = self._median(stage, [
            (f"{cell.gpu} on {cell.provider}", lambda s: s.provider == provider and s.gpu == gpu),
            (f"{cell.provider}", lambda s: s.provider == provider),
        ])
        return found or Estimate(DEFAULT_STAGE_SECONDS[stage] * self.time_scale, "default")

    def pull(self, cell: Cell) -> Estimate:
        """Pulling and loading ``cell``'s model on a session that does not have it yet."""
        provider, model = normalize_provider(cell.provider), cell.model_ref.lower()
        found = self._median(Stage.MODEL_PULL, [
            (f"{cell.model} on {cell.provider}", lambda s: s.model == model and s.provider == provider),
            (f"{cell.model}", lambda s: s.model == model),
        ])
        seconds = DEFAULT_PULL_SECONDS_PER_GB * cell.vram_gb * self.time_scale
        return found or Estimate(seconds, f"default ({cell.vram_gb} GB x {DEFAULT_PULL_SECONDS_PER_GB:g} s/GB)")

    def tokens_per_second(self, cell: Cell) -> Estimate:
        """Tokens/s of one request of ``cell``'s model on its GPU (``seconds`` holds the rate)."""
        gpu, model = normalize_gpu(cell.gpu), cell.model_ref.lower()
        rates = [s.tokens_per_second for s in self.samples
                 if s.gpu == gpu and s.model == model and s.tokens_per_second]
        if rates:
            return Estimate(statistics.median(rates), f"history: {len(rates)} result(s) of {cell.model} on {cell.gpu}")
        return Estimate(DEFAULT_TOKENS_PER_SECOND, "default (seed 000)")

    def _median(self, stage: Stage, scopes: list[tuple[str, Any]]) -> Estimate | None:
        for label, wanted in scopes:
            values = [s.stages[stage] for s in self.samples if stage in s.stages and wanted(s)]
            if values:
                return Estimate(statistics.median(values), f"history: median of {len(values)} cell(s), {label}")
        return None


def _progress_file(recorded: str | None, manifest: Path | str) -> Path | None:
    """The progress file a row names: as recorded (absolute, or relative to here), or
    relative to the directory above the manifest's (``reports/manifest.db`` and
    ``reports/progress/...`` are both relative to where pytest ran)."""
    if not recorded:
        return None
    from ..store.opening import store_kind

    path = Path(recorded)
    # A server store (postgresql://) is in no directory: only the path as recorded.
    beside = [Path(manifest).resolve().parent.parent / path] if store_kind(manifest) == "sqlite" else []
    for candidate in (path, *beside):
        if candidate.is_file():
            return candidate
    return None


Choice = OfferChoice | NoEligibleOffer


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class StageTime(_Model):
    """One stage's expected seconds and where the figure comes from."""

    stage: str
    seconds: float
    source: str


class CellPlan(_Model):
    """One cell: the offer it would take (or why none), its expected time and cost."""

    cell: str
    gpu: str
    #: GPUs of one machine the cell spans (``gpus:``); its offer has that many, priced as a whole.
    gpus: int = 1
    provider: str
    model: str
    reuse_group: str | None
    #: The session it runs on (1-based, see ``Plan.sessions``); None without an offer.
    session: int | None = None
    #: True when this cell rents the session (and pays its setup).
    rents_session: bool = False
    offer_id: str | None = None
    price_per_hour: float | None = None
    location: str | None = None
    offers_found: int | None = None
    eligible_offers: int | None = None
    #: The reason the plugin would skip the cell with: no offer fits.
    no_offer_reason: str | None = None
    runs: int = 1
    stages: list[StageTime] = []
    setup_seconds: float = 0.0
    pull_seconds: float = 0.0
    benchmark_seconds: float = 0.0
    seconds: float = 0.0
    cost_usd: float = 0.0


class SessionPlan(_Model):
    """One session to create: its offer, the cells that run on it, time and cost."""

    session: int
    reuse_group: str | None
    offer_id: str
    gpu_type: str
    #: GPUs of the machine; its ``price_per_hour`` is all of them.
    gpu_count: int = 1
    price_per_hour: float
    cells: list[str]
    setup_seconds: float
    seconds: float
    cost_usd: float


class GroupPlan(_Model):
    """What one worker runs in one go: a reuse group (an xdist group), or a cell alone."""

    name: str
    cells: list[str]
    sessions: list[int]
    seconds: float
    cost_usd: float


class Totals(_Model):
    """Sums over the plan; ``wall_seconds`` is with one worker (which splits no group)."""

    cells: int
    cells_without_offer: int
    sessions: int
    gpu_hours: float
    cost_usd: float
    wall_seconds: float
    #: ``-n N``: the workers and the LPT estimate of the wall time with them.
    workers: int | None = None
    wall_seconds_workers: float | None = None


class GroupSplitPlan(_Model):
    """How many sessions a reuse group runs on under ``-n N`` (:mod:`.reuse_split`), and why not more."""

    group: str
    cells: int
    sessions: int
    #: The GPU time the split adds (setups, repeated pulls), a share of the group's on one session.
    extra_share: float
    why: str


class SplitPlan(_Model):
    """The run's split of reuse groups for ``-n N`` workers, and what not splitting would give."""

    workers: int
    #: ``--gpubench-sessions-per-group`` (None: auto, one per cell at most).
    sessions_per_group: int | None
    #: ``--gpubench-split-cost``: the extra GPU time accepted, a share of the group's.
    split_cost: float
    groups: list[GroupSplitPlan]
    #: The same cells with one session per reuse group.
    unsplit_sessions: int
    unsplit_cost_usd: float
    unsplit_wall_seconds_workers: float


class Plan(_Model):
    """The whole plan, as ``gpubench plan --json`` prints it."""

    api: str
    sandbox: bool
    #: Multiplies the default setup times (the sandbox's clock); 1 on a real cloud.
    time_scale: float
    history: str
    cells: list[CellPlan]
    sessions: list[SessionPlan]
    groups: list[GroupPlan]
    totals: Totals
    #: With ``-n N``: reuse groups split over more sessions so that workers do not idle.
    split: SplitPlan | None = None


# ----------------------------------------------------------------------------- choosing


async def choose_offers(cells: Sequence[Cell], providers: Mapping[str, Provider]) -> list[Choice]:
    """Each cell's offer choice from the provider its ``cloud:`` names in ``providers``, or the
    ``NoEligibleOffer`` the ``gpu_offer`` fixture would skip it with."""
    choices: list[Choice] = []
    for cell in cells:
        try:
            choices.append(await providers[cell.cloud].choose_offer(Constraints.for_cell(cell)))
        except NoEligibleOffer as exc:
            choices.append(exc)
        except StageError as exc:  # the provider could not read its inventory: say which, for which cell
            where = providers[cell.cloud].where
            source = cell.cloud if where == cell.cloud else f"{cell.cloud} at {where}"
            raise StageError(exc.stage, f"{cell.cell_id} ({source}): {exc}", hint=exc.hint) from None
    return choices


# ----------------------------------------------------------------------------- pricing


def planned_runs(cell: Cell, runs_override: int | None) -> int:
    """Runs the benchmark is at least measured: ``--gpubench-runs``, else the fixed count,
    else an ``until_cv`` spec's minimum."""
    return max(runs_override or cell.runs.count or cell.runs.min, 1)


def benchmark_time(cell: Cell, history: StageHistory, runs: int) -> StageTime:
    """Duration x runs (a saturation sweep: its most steps x their duration), plus the first
    run's warm-up requests (``max_tokens`` each at the expected tokens/s). Real time: the
    sandbox's clock does not scale token streams."""
    workload = cell.workload
    rate = history.tokens_per_second(cell)
    warmup = workload.warmup_requests * workload.max_tokens / rate.seconds
    seconds = planned_benchmark_seconds(cell, runs)
    what = (f"concurrency sweep: at most {seconds:g} s of steps" if cell.sweep_kind == "concurrency"
            else f"saturation sweep: at most {seconds:g} s of steps" if cell.sweep is not None
            else f"{workload.duration:g} s x {runs} run(s)")
    return StageTime(stage=Stage.BENCHMARK.value, seconds=seconds + warmup,
                     source=(f"{what} + {workload.warmup_requests} warm-up "
                             f"request(s) at {rate.seconds:.1f} tokens/s ({rate.source})"))


class _Session:
    """A session being planned: its offer, group and what is on it."""

    def __init__(self, number: int, group: str | None, offer: Offer) -> None:
        self.number, self.group, self.offer = number, group, offer
        self.cells: list[CellPlan] = []
        self.models: set[str] = set()


def build_plan(cells: Sequence[tuple[str, Cell]], choices: Sequence[Choice], history: StageHistory, *,
               api: str, sandbox: bool, runs_override: int | None = None, workers: int | None = None) -> Plan:
    """Walk ``cells`` in run order as the session pool would, and price every session."""
    sessions: list[_Session] = []
    planned: list[CellPlan] = []
    held: _Session | None = None
    for (key, cell), choice in zip(cells, choices, strict=True):
        group = cell.session_group
        # The pool releases a session after its group's last cell here, or when it cannot serve the next one.
        if held is not None and (held.group != group or unfit(held.offer, Constraints.for_cell(cell))):
            held = None
        base = dict(cell=key, gpu=cell.gpu, gpus=cell.gpus, provider=cell.provider, model=cell.model, reuse_group=group,
                    runs=planned_runs(cell, runs_override))
        if held is None and isinstance(choice, NoEligibleOffer):
            planned.append(CellPlan(**base, no_offer_reason=choice.message))
            continue
        stages: list[StageTime] = []
        session = held
        if session is None:
            assert isinstance(choice, OfferChoice)
            session = _Session(len(sessions) + 1, group, choice.offer)
            sessions.append(session)
            for stage in SETUP_STAGES:
                estimate = history.setup(stage, cell)
                stages.append(StageTime(stage=stage.value, seconds=estimate.seconds, source=estimate.source))
            base.update(offers_found=choice.offers_found, eligible_offers=len(choice.eligible))
            held = session if group is not None else None
        if cell.model_ref.lower() in session.models:  # an earlier cell of the session pulled it
            stages.append(StageTime(stage=Stage.MODEL_PULL.value, seconds=0.0, source="already on the session"))
        else:
            estimate = history.pull(cell)
            stages.append(StageTime(stage=Stage.MODEL_PULL.value, seconds=estimate.seconds, source=estimate.source))
        session.models.add(cell.model_ref.lower())
        stages.append(benchmark_time(cell, history, base["runs"]))
        setup = sum(s.seconds for s in stages if s.stage in {st.value for st in SETUP_STAGES})
        seconds = sum(s.seconds for s in stages)
        offer = session.offer
        plan = CellPlan(**base, session=session.number, rents_session=not session.cells, offer_id=offer.id,
                        price_per_hour=offer.price_per_hour, location=offer.location or None, stages=stages,
                        setup_seconds=setup, pull_seconds=stages[-2].seconds, benchmark_seconds=stages[-1].seconds,
                        seconds=seconds, cost_usd=offer.price_per_hour * seconds / 3600)
        session.cells.append(plan)
        planned.append(plan)
    session_plans = [_session_plan(s) for s in sessions]
    groups = _groups(cells, planned)
    return Plan(api=api, sandbox=sandbox, time_scale=history.time_scale, history=history.description,
                cells=planned, sessions=session_plans, groups=groups,
                totals=_totals(planned, session_plans, groups, workers))


def _session_plan(session: _Session) -> SessionPlan:
    seconds = sum(c.seconds for c in session.cells)
    return SessionPlan(session=session.number, reuse_group=session.group, offer_id=session.offer.id,
                       gpu_type=session.offer.gpu_type, gpu_count=session.offer.gpu_count,
                       price_per_hour=session.offer.price_per_hour,
                       cells=[c.cell for c in session.cells], setup_seconds=sum(c.setup_seconds for c in session.cells),
                       seconds=seconds, cost_usd=session.offer.price_per_hour * seconds / 3600)


def _groups(cells: Sequence[tuple[str, Cell]], planned: Sequence[CellPlan]) -> list[GroupPlan]:
    """The units workers take: a reuse group of more than one cell stays together (its
    ``xdist_group``, as collection marks it); any other cell goes alone."""
    sizes: dict[str, int] = {}
    for _, cell in cells:
        if cell.session_group:
            sizes[cell.session_group] = sizes.get(cell.session_group, 0) + 1
    units: dict[str, list[CellPlan]] = {}
    for (key, cell), plan in zip(cells, planned, strict=True):
        group = cell.session_group
        units.setdefault(group if group and sizes[group] > 1 else key, []).append(plan)
    return [GroupPlan(name=name, cells=[p.cell for p in members],
                      sessions=sorted({p.session for p in members if p.session is not None}),
                      seconds=sum(p.seconds for p in members), cost_usd=sum(p.cost_usd for p in members))
            for name, members in units.items()]


def makespan(durations: Sequence[float], workers: int) -> float:
    """Longest processing time first: each job to the least loaded worker; the latest finish."""
    loads = [0.0] * max(workers, 1)
    for seconds in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + seconds)  # loads stays a heap: loads[0] is the least loaded
    return max(loads)


def _totals(cells: Sequence[CellPlan], sessions: Sequence[SessionPlan], groups: Sequence[GroupPlan],
            workers: int | None) -> Totals:
    gpu_seconds = sum(s.seconds * s.gpu_count for s in sessions)  # a 2-GPU machine's hour is two GPU-hours
    durations = [g.seconds for g in groups]
    return Totals(cells=len(cells), cells_without_offer=sum(1 for c in cells if c.no_offer_reason),
                  sessions=len(sessions), gpu_hours=gpu_seconds / 3600, cost_usd=sum(s.cost_usd for s in sessions),
                  wall_seconds=sum(durations), workers=workers,
                  wall_seconds_workers=makespan(durations, workers) if workers else None)


# ----------------------------------------------------------------------------- the command


def plan_with_split(cells: Sequence[tuple[str, Cell]], choices: Sequence[Choice], history: StageHistory,
                    settings: Settings, *, api: str, sandbox: bool, workers: int | None) -> Plan:
    """The plan of the run ``pytest -n workers`` would make: reuse groups split as the run
    splits them (:mod:`.reuse_split`), with what one session per group would cost and take."""
    unsplit = build_plan(cells, choices, history, api=api, sandbox=sandbox, runs_override=settings.runs,
                         workers=workers)
    if not workers or workers <= 1:
        return unsplit
    policy = SplitPolicy.from_settings(settings, workers)
    split, decisions = split_groups([cell for _, cell in cells], policy)
    plan = unsplit
    if any(decision.sessions > 1 for decision in decisions):
        order = order_for_reuse(split, settings.runs)  # the run orders the sub-groups as groups
        plan = build_plan([(cells[i][0], split[i]) for i in order], [choices[i] for i in order], history,  # type: ignore[misc]
                          api=api, sandbox=sandbox, runs_override=settings.runs, workers=workers)
    totals = unsplit.totals
    summary = SplitPlan(workers=workers, sessions_per_group=policy.limit, split_cost=policy.max_extra_share,
                        groups=[GroupSplitPlan(group=d.group, cells=d.cells, sessions=d.sessions,
                                               extra_share=d.extra_share, why=d.why) for d in decisions],
                        unsplit_sessions=totals.sessions, unsplit_cost_usd=totals.cost_usd,
                        unsplit_wall_seconds_workers=totals.wall_seconds_workers or 0.0)
    # One worker runs everything back to back, and a run with one worker splits nothing.
    return plan.model_copy(update={"split": summary, "totals": plan.totals.model_copy(
        update={"wall_seconds": totals.wall_seconds})})


def make_plan(paths: list[str], *, keyword: str | None = None, gpus: list[str] | None = None,
              providers: list[str] | None = None, models: list[str] | None = None, api: str | None = None,
              sandbox: bool = False, manifest: Path | None = None, workers: int | None = None,
              options: Sequence[str] = ()) -> Plan:
    """Collect, read the inventory (of a sandbox started for it, with ``sandbox``), price.

    ``options`` are more pytest options for the collection (``--gpubench-sessions-per-group 2``).
    Raises :class:`CommandProblem`.
    """
    from ..errors import ApiUnreachable, GpubenchError, StageError
    from ..plugin.collect import CollectionProblem
    from ..sandbox.process import SandboxProcess

    try:
        collected = collect_cells(paths, keyword=keyword, gpus=gpus, providers=providers, models=models,
                                  options=[*(["--gpubench-sandbox"] if sandbox else []), *options])
    except CollectionProblem as exc:
        raise CommandProblem(str(exc), 2) from None
    settings, cells = collected.settings, collected.cells
    if not cells:
        raise CommandProblem(f"no matrix cells selected in {' '.join(paths)} (check the paths, -k and "
                          "--gpu/--provider/--model: pytest --collect-only lists what they select)", 2)
    sandbox = sandbox or settings.sandbox
    source = manifest or settings.store_location
    try:
        history = StageHistory.from_manifest(source, sandbox=sandbox,
                                             time_scale=settings.time_scale if sandbox else 1.0)
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file: say so in one line
        raise CommandProblem(f"cannot read the manifest {source}: {exc}", 2) from None
    process = None
    try:
        if sandbox:
            try:
                process = SandboxProcess.start(settings)
            except GpubenchError as exc:
                raise CommandProblem(str(exc), 1) from None
        url = process.url if process is not None else (api or settings.api)
        if process is not None:  # the sandbox's API needs the token drawn for it
            settings = settings.model_copy(update={"api_token": process.token})
        try:
            choices = asyncio.run(_read_inventory(url, settings, [cell for _, cell in cells]))
        except ApiUnreachable as exc:
            raise CommandProblem(f"{exc.message}: start the server, point --api or GPUBENCH_API_BASE at it, or "
                              "plan against the sandbox with --sandbox", 1) from None
        except StageError as exc:
            raise CommandProblem(f"reading the inventory failed: {exc}", 1) from None
    finally:
        if process is not None:
            process.stop()
    # The plan (its text and its JSON) names the API without the credentials a URL may carry.
    return plan_with_split(cells, choices, history, settings, api="sandbox" if process is not None else redact(url),
                           sandbox=sandbox, workers=workers)


async def _read_inventory(url: str, settings: Settings, cells: list[Cell]) -> list[Choice]:
    """Choose every cell's offer through its cloud's provider, each reading its inventory once."""
    at_url = settings.model_copy(update={"api": url})
    providers = {cloud: build_provider(cloud, at_url, fixed_offers=True)
                 for cloud in dict.fromkeys(cell.cloud for cell in cells)}
    try:
        for provider in providers.values():
            await provider.ready(attempts=5)
        return await choose_offers(cells, providers)
    finally:
        for provider in providers.values():
            await provider.aclose()


CELL_COLUMNS = ("cell", "offer", "$/h", "setup", "pull", "bench", "time", "cost $", "session")
SESSION_COLUMNS = ("session", "group", "offer", "$/h", "cells", "setup", "time", "cost $")
SPLIT_COLUMNS = ("group", "cells", "sessions", "extra", "why not more")


#: Widest an offer id or a group name is shown in a column: longer ones wrap after a
#: ``-`` (TensorDock's ids run to 70 characters and would push the table off the screen).
WRAP_AT = 26


def render(plan: Plan) -> list[str]:
    """The plan as terminal lines; a ``GPUs`` column (each offer's count, priced whole) when any cell spans several."""
    rows = [_cell_row(c) for c in plan.cells]
    columns: tuple[str, ...] = CELL_COLUMNS
    if any(c.gpus > 1 for c in plan.cells):
        columns, rows = (*columns, "GPUs"), [(*row, str(c.gpus)) for row, c in zip(rows, plan.cells)]
    lines = _table(columns, rows, left=(0, 1, 8), wrap={1: WRAP_AT})
    flagged = [c for c in plan.cells if c.no_offer_reason]
    if flagged:
        lines += ["", "no eligible offer (a run skips these cells; --gpubench-fail-on-skip fails them):"]
        lines += [f"  {c.cell}: {c.no_offer_reason}" for c in flagged]
    if plan.sessions:
        lines += ["", "sessions to create:"]
        lines += ["  " + line for line in _table(SESSION_COLUMNS, [
            (f"#{s.session}", s.reuse_group or "-", s.offer_id, f"{s.price_per_hour:.3f}", str(len(s.cells)),
             duration(s.setup_seconds), duration(s.seconds), f"{s.cost_usd:.4f}")
            for s in plan.sessions], left=(0, 1, 2), wrap={1: WRAP_AT, 2: WRAP_AT})]
    if plan.split is not None and plan.split.groups:
        lines += ["", *_split_lines(plan.split)]
    totals = plan.totals
    without = f" ({totals.cells_without_offer} without an offer)" if totals.cells_without_offer else ""
    lines += ["", f"total: {totals.cells} cell(s){without}, {totals.sessions} session(s), "
                  f"{totals.gpu_hours:.2f} GPU-hours, {usd(totals.cost_usd)}"]
    wall = f"wall time: {duration(totals.wall_seconds)} with 1 worker"
    if totals.workers and totals.wall_seconds_workers is not None:
        longest = max(plan.groups, key=lambda g: g.seconds, default=None)
        wall += f"; about {duration(totals.wall_seconds_workers)} with -n {totals.workers}"
        if longest is not None:
            wall += f" (longest group {longest.name}: {duration(longest.seconds)})"
    lines.append(wall)
    if plan.split is not None and plan.split.groups:
        lines += _split_choice(plan)
    where = "the sandbox" if plan.sandbox else plan.api
    scale = f", default setup times x {plan.time_scale:g} (its clock)" if plan.sandbox else ""
    lines.append(f"offers: live inventory of {where}{scale}; stage times: {plan.history}, defaults otherwise "
                 "(gpubench plan --json shows each figure's source)")
    return lines


def _cell_row(cell) -> tuple[str, ...]:
    if cell.no_offer_reason:
        return (cell.cell, "-", "-", "-", "-", "-", "-", "-", "NO OFFER")
    where = f"#{cell.session} {'rents' if cell.rents_session else 'reuses'}"
    return (cell.cell, cell.offer_id or "-", f"{cell.price_per_hour:.3f}",
            duration(cell.setup_seconds) if cell.rents_session else "-", duration(cell.pull_seconds),
            duration(cell.benchmark_seconds), duration(cell.seconds), f"{cell.cost_usd:.4f}", where)


def _split_lines(split: SplitPlan) -> list[str]:
    """Each reuse group's sessions under ``-n N`` and why not more."""
    limit = "auto" if split.sessions_per_group is None else str(split.sessions_per_group)
    head = (f"reuse groups with -n {split.workers} (--gpubench-sessions-per-group {limit}, "
            f"--gpubench-split-cost {percent(split.split_cost)}):")
    rows = [(g.group, str(g.cells), str(g.sessions), f"+{percent(g.extra_share)}", g.why) for g in split.groups]
    return [head, *["  " + line for line in _table(SPLIT_COLUMNS, rows, left=(0, 4), wrap={0: WRAP_AT})]]


def _split_choice(plan: Plan) -> list[str]:
    """The choice made, against one session per group: sessions, cost and wall time of each."""
    split, totals = plan.split, plan.totals
    assert split is not None and totals.wall_seconds_workers is not None
    workers = f"with -n {split.workers}"
    if totals.sessions == split.unsplit_sessions:
        return [f"split: none, one session per reuse group ({workers}, see why above)"]
    extra = totals.cost_usd - split.unsplit_cost_usd
    longer = split.unsplit_wall_seconds_workers - totals.wall_seconds_workers
    return [f"split over {totals.sessions} sessions: {usd(totals.cost_usd)}, about "
            f"{duration(totals.wall_seconds_workers)} {workers}",
            f"one session per group: {split.unsplit_sessions} session(s), {usd(split.unsplit_cost_usd)} "
            f"({usd(extra)} less), about {duration(split.unsplit_wall_seconds_workers)} {workers} "
            f"({duration(longer)} longer)"]


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int],
           wrap: Mapping[int, int] | None = None) -> list[str]:
    """Aligned columns; a column in ``wrap`` is at most that wide, its longer texts wrapped
    over more lines (the row's other columns blank on those)."""
    wrap = wrap or {}
    lines: list[tuple[str, ...]] = []
    for row in [tuple(columns), *rows]:
        pieces = [wrap_text(text, wrap[i]) if i in wrap else [text] for i, text in enumerate(row)]
        for n in range(max(len(p) for p in pieces)):
            lines.append(tuple(p[n] if n < len(p) else "" for p in pieces))
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return ["  ".join(text.ljust(widths[i]) if i in left else text.rjust(widths[i])
                      for i, text in enumerate(line)).rstrip() for line in lines]


def wrap_text(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a ``-`` where it can
    be (an id stays readable and copyable piece by piece), else cut."""
    if len(text) <= width:
        return [text]
    parts = re.findall(r"[^-]*-|[^-]+$", text)
    lines = [""]
    for part in parts:
        while len(part) > width:  # a piece longer than a line: cut it
            if lines[-1]:
                lines.append("")
            lines[-1], part = part[:width], part[width:]
            lines.append("")
        if len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return [line for line in lines if line]


def duration(seconds: float) -> str:
    """``2.4s``, ``45s``, ``8m53s``, ``1h02m``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
