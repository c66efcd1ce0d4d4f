"""One cell's record keeping: manifest row, progress file and report properties.

A ``CellRecorder`` is created before anything is rented and finished after
cleanup, whatever happened in between, so every cell ends with exactly one
manifest outcome, an ``ERROR:`` or ``COMPLETED`` line, and JUnit properties.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from ..errors import ClaimLost, Stage, StageError
from ..figures import FIGURES, FigureSource, figure_values
from ..store.base import Store
from ..matrix.cells import Cell
from ..store.progress import ProgressWriter, cell_progress_path
from ..measure.results import BenchmarkResult
from ..remote.readings import HardwareInfo, RequestRecord
from ..remote.sysinfo import SystemInfo
from ..runtimes.base import PulledModel

class ClaimKeeper(Protocol):
    """What renews a running cell's claim (:class:`.claims.ClaimHeartbeat`)."""

    lease_seconds: float

    def hold(self, row_id: str, lost: Callable[[str | None], None]) -> None: ...

    def drop(self, row_id: str) -> float: ...

    def spent(self, row_id: str) -> float: ...


STATUSES = ("pending", "running", "success", "partial", "failed", "skipped")


def progress_path(progress_dir: Path, run_id: str, record_key: str) -> Path:
    """``reports/progress/<run>/<cell>.log``, with a file-name-safe cell (:func:`.cell_progress_path`)."""
    return cell_progress_path(progress_dir, run_id, record_key)


@dataclass
class CellOutcome:
    """How a cell ended, as the manifest and reports state it."""

    status: str
    failure_stage: str | None = None
    failure_reason: str | None = None
    error_message: str | None = None


@dataclass
class CellRecorder:
    """Everything recorded about one cell while it runs."""

    store: Store
    run_id: str
    cell: Cell
    record_key: str
    progress: ProgressWriter
    worker: str = "main"
    row_id: str = ""
    stage: Stage = Stage.INVENTORY
    offer_id: str | None = None
    session_id: str | None = None
    price_per_hour: float | None = None
    session_started: float | None = None
    session_ended: float | None = None
    session_status: str | None = None
    api_cost_usd: float | None = None
    #: Offers tried (failover); the cost of the sessions before the current one.
    attempts: int = 0
    earlier_cost_usd: float = 0.0
    earlier_api_cost_usd: float | None = None
    result: BenchmarkResult | None = None
    hardware: HardwareInfo | None = None
    #: What system detection found on the cell's machine (None: not detected, as for a running endpoint).
    system: SystemInfo | None = None
    pulled: PulledModel | None = None
    skip_reason: str | None = None
    cleanup_error: str | None = None
    samples: list[Any] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    #: Called with the stored benchmark id when results are to be uploaded.
    upload: Callable[[str], None] | None = None
    records: list[RequestRecord] = field(default_factory=list)
    #: A microbenchmark cell's figures (``measure.microbench.MicrobenchRun``), stored when it finishes.
    microbench: Any = None
    finished: bool = False
    #: The cell's ``ERROR:`` line is written (as soon as its test failed, before pytest reports it).
    error_written: bool = False
    #: The cost fixed when the cell finished: what its ``COMPLETED`` line, manifest row and
    #: report properties all state (a session that stays up must not make them differ).
    final_cost_usd: float | None = None
    #: Seconds spent in each stage so far (``enter`` moves the clock on).
    stage_seconds: dict[str, float] = field(default_factory=dict)
    _stage_since: float = field(default_factory=time.monotonic, repr=False)
    _timed: str = str(Stage.INVENTORY)
    #: Renews the cell's claim while it runs (:class:`.claims.ClaimHeartbeat`), if any.
    heartbeat: ClaimKeeper | None = None
    #: Why the cell's claim is no longer this worker's (taken over), once the heartbeat found out.
    claim_lost: str | None = None
    #: The outcome was written to the row while this worker held it: a renewal refused from
    #: then on (the row is no longer ``running``) is not a lost claim.
    row_finished: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def start(cls, store: Store, run_id: str, cell: Cell, record_key: str,
              progress_dir: Path, worker: str, labels: dict[str, Any] | None = None, *,
              lease_seconds: float | None = None, heartbeat: ClaimKeeper | None = None,
              claim_seconds: float = 0.0) -> CellRecorder:
        """Claim the cell for ``worker`` and record it as running; ``labels`` go on its progress
        file's first line (a sandbox run says so there: :func:`..store.records.progress_labels`).

        The claim holds ``lease_seconds`` unless ``heartbeat`` renews it (:mod:`.claims`); the time
        spent claiming (``claim_seconds`` before this, this claim, the renewals) counts as the
        cell's ``claim`` in ``stage_seconds``. A cell
        held by another worker, or already ended in this run, is not started: whether to run an
        ended cell again is the caller's decision (``Store.restart_cell`` first: :mod:`.claims`).
        """
        path = progress_path(progress_dir, run_id, record_key)
        recorder = cls(store, run_id, cell, record_key, ProgressWriter(path), worker)
        recorder.row_id = store.add_cell(
            run_id, record_key, gpu_type=cell.gpu, provider=cell.provider, model=cell.model,
            matrix_file=cell.source,
        )
        started = time.perf_counter()
        claim = store.claim_cell(recorder.row_id, worker, lease_seconds=lease_seconds)
        recorder.stage_seconds["claim"] = claim_seconds + time.perf_counter() - started
        if not claim.won:  # another process runs (or ran) this very cell: it must not run twice
            recorder.progress.close()
            raise StageError(Stage.INVENTORY, f"cell {record_key} of run {run_id} is already {claim.status} under "
                                              f"worker {claim.holder}: not run a second time")
        if heartbeat is not None:
            recorder.heartbeat = heartbeat
            heartbeat.hold(recorder.row_id, recorder.lose_claim)
        if not store.update_cell(recorder.row_id, started_at=_now(), progress_file=str(path), if_held_by=worker):
            recorder.lose_claim(_holder_of(store, recorder.row_id))
        recorder.progress.status("STARTING", gpu=cell.gpu, provider=cell.provider, model=cell.model,
                                 worker=worker, run=run_id, **(labels or {}))
        return recorder

    def lose_claim(self, new_holder: str | None) -> None:
        """The heartbeat's renewal was refused: another worker took the cell over (this one was
        presumed dead). The cell fails at its next stage and writes nothing more to the row."""
        with self._lock:
            if self.row_finished:
                return  # refused because this worker just finished the row
            self.claim_lost = (f"lost its claim on cell {self.record_key}: taken over by "
                               f"{new_holder or 'another worker'} after this worker's lease expired; "
                               "its result, if any, is not recorded")

    def enter(self, stage: Stage) -> None:
        """Note the stage the cell is in: an error from here on is blamed on it, and the
        time from now on counts as its (``stage_seconds``). A cell whose claim was taken
        over stops here."""
        if self.claim_lost is not None:
            raise ClaimLost(stage, self.claim_lost)
        self.stage = stage
        self.time_as(str(stage))

    def time_as(self, label: str) -> None:
        """From now on the cell's time counts as ``label``'s in ``stage_seconds`` (teardown
        counts as ``cleanup`` without the cell's errors being blamed on it)."""
        now = time.monotonic()
        self.stage_seconds[self._timed] = self.stage_seconds.get(self._timed, 0.0) + (now - self._stage_since)
        self._timed, self._stage_since = label, now

    def session_created(self, session_id: str, consumer_id: str, offer_id: str, price: float) -> None:
        """Record ownership right away, before the session is used.

        A session of an earlier attempt (failover) adds its cost to the cell's.
        """
        earlier = self.cost_usd
        if earlier is not None:
            self.earlier_cost_usd = earlier
        if self.api_cost_usd is not None:
            self.earlier_api_cost_usd = (self.earlier_api_cost_usd or 0.0) + self.api_cost_usd
        self.session_ended = self.session_status = self.api_cost_usd = None
        self.session_id, self.offer_id, self.price_per_hour = session_id, offer_id, price
        self.session_started = time.monotonic()
        if not self.store.record_session(self.row_id, session_id=session_id, consumer_id=consumer_id,
                                         offer_id=offer_id, price_per_hour=price, if_held_by=self.worker):
            # The row is another worker's: the session is not on it, so its creator (the
            # attempt, on this error) releases it now; cleanup would never find it there.
            self.lose_claim(_holder_of(self.store, self.row_id))
            raise ClaimLost(self.stage, self.claim_lost or "claim lost")

    def session_adopted(self, owner: str, session: Any, offer: Any, *, consumer: str, turn: int) -> None:
        """The cell runs on a session another cell of its reuse group rented.

        Recorded at once, like a session of its own, so that cleanup finds the session
        through this row too; the cell's cost is its share: from now to the hand-back.
        """
        self.session_id, self.offer_id, self.price_per_hour = session.id, offer.id, offer.price_per_hour
        self.session_started, self.session_ended = time.monotonic(), None
        if not self.store.record_session(self.row_id, session_id=session.id, consumer_id=consumer,
                                         offer_id=offer.id, price_per_hour=offer.price_per_hour,
                                         instance_ip=session.ssh_host, ssh_port=session.ssh_port,
                                         reuse_group=self.cell.session_group, session_turn=turn,
                                         session_owner=owner, if_held_by=self.worker):
            # The session is its group owner's, which releases it; this cell stops at its next stage.
            self.lose_claim(_holder_of(self.store, self.row_id))
        self.progress.status("SESSION_REUSED", session_id=session.id, rented_by=owner, turn=turn)

    def session_handed_back(self) -> None:
        """The cell is done with a session that stays up for the next cell of its group."""
        self.session_ended = time.monotonic()

    def session_released(self, status: str | None, api_cost: float | None) -> None:
        """The cell's session is released; recorded at once, so that a crash before the
        cell's outcome is written does not leave it looking alive to cleanup."""
        self.session_ended = time.monotonic()
        self.session_status = status
        self.api_cost_usd = api_cost
        if status in ("stopped", "failed", "not_found") and self.session_id:
            self.store.record_release(self.row_id, self.session_id, session_status=status,
                                         released_by="teardown")

    @property
    def cost_usd(self) -> float | None:
        """Price x session lifetime, over every session the cell rented: what it really cost.

        Fixed once the cell finished (:attr:`final_cost_usd`)."""
        if self.final_cost_usd is not None:
            return self.final_cost_usd
        if self.price_per_hour is None or self.session_started is None:
            return None
        end = self.session_ended if self.session_ended is not None else time.monotonic()
        return self.earlier_cost_usd + self.price_per_hour * (end - self.session_started) / 3600

    @property
    def total_api_cost_usd(self) -> float | None:
        """The API's cost figures of every session, summed; None when it gave none."""
        if self.api_cost_usd is None:
            return self.earlier_api_cost_usd
        return (self.earlier_api_cost_usd or 0.0) + self.api_cost_usd

    def failed_now(self, outcome: CellOutcome) -> None:
        """The cell's test just failed: write its ``ERROR:`` line now, once, so that it comes
        before the cell's status in the terminal (``finish`` writes it otherwise)."""
        if outcome.status in ("failed", "partial") and outcome.failure_stage and not self.error_written:
            self.error_written = True
            self.progress.error(outcome.failure_stage, outcome.error_message or outcome.status)

    def finish(self, outcome: CellOutcome) -> dict[str, Any]:
        """Write the outcome everywhere once; return the report properties."""
        with self._lock:
            if self.finished:
                return self.properties(outcome)
            self.finished = True
        # The heartbeat keeps renewing through the result writes and the upload (which may
        # outlast a lease); it is dropped only once the outcome is on the row.
        if self.heartbeat is not None and self.claim_lost is None and not self._still_held():
            self.lose_claim(_holder_of(self.store, self.row_id))
        if self.claim_lost is not None:  # the row is another worker's now: nothing is written to it
            self._drop_heartbeat()
            return self._lost(outcome)
        self.failed_now(outcome)
        benchmark_id = None
        if self.result is not None:
            benchmark_id = self.store.add_result(self.row_id, self.result, self.records)
            self.store.add_gpu_samples(self.row_id, benchmark_id, self.samples)
            if self.runs:
                self.store.add_repeats(benchmark_id, self.runs)
            if self.details:
                self.store.set_result_details(benchmark_id, self.details)
            if self.upload is not None:
                self.upload(benchmark_id)
        elif self.samples:  # a cell without a result (a microbenchmark): its telemetry is the cell's
            self.store.add_gpu_samples(self.row_id, None, self.samples)
        if self.microbench is not None:
            self.store.add_microbench(self.row_id, self.microbench)
        results = self.result.results if self.result else None
        figures = self.figures()
        cost = self.cost_usd
        if cost is not None:
            self.final_cost_usd = cost = round(cost, 6)
        self.time_as(self._timed)
        if self.heartbeat is not None:  # the renewals so far; the last ones are too few to count
            self.stage_seconds["claim"] = self.stage_seconds.get("claim", 0.0) + self.heartbeat.spent(self.row_id)
        measured = {
            "stage_seconds": json.dumps({k: round(v, 3) for k, v in self.stage_seconds.items()}),
            "output_tokens_per_second": figures.get("output_tokens_per_second"),
            "decode_tokens_per_second": figures.get("decode_tokens_per_second"),
            "total_requests": results.total_requests if results else None,
            "error_count": results.total_errors if results else None,
            "ttft_p50_ms": results.p50_ttft_ms if results else None,
            "cost_per_million_tokens": self._cost_per_million(),
            "cost_usd": cost,
            "api_cost_usd": self.total_api_cost_usd,
            "session_status": self.session_status,
            "benchmark_id": benchmark_id,
        }
        # Unknown values are left out so they never overwrite what is already known.
        try:
            written = self.store.finish_cell(
                self.row_id,
                status=outcome.status,
                failure_stage=outcome.failure_stage,
                failure_reason=outcome.failure_reason,
                error_message=outcome.error_message,
                if_held_by=self.worker,
                **{name: value for name, value in measured.items() if value is not None},
            )
            if written:
                with self._lock:  # a renewal refused from now on is this very write's doing
                    self.row_finished, self.claim_lost = True, None
        finally:
            self._drop_heartbeat()
        if not written:  # taken over during the writes: the row is the new holder's
            self.lose_claim(_holder_of(self.store, self.row_id))
            return self._lost(outcome)
        self.progress.status(
            "COMPLETED" if outcome.status == "success" else outcome.status.upper(),
            output_tokens_per_second=figures.get("output_tokens_per_second"),
            decode_tokens_per_second=figures.get("decode_tokens_per_second"),
            cost=cost_text(cost),
        )
        return self.properties(outcome)

    def _still_held(self) -> bool:
        """Renew the claim once before the outcome is written: False when it was taken over.

        A store that cannot say (a git push that failed, a database blip) is taken as "still
        this worker's": the result is written locally and the guarded finish decides."""
        assert self.heartbeat is not None
        started = time.perf_counter()
        try:
            return self.store.renew_cell_lease(self.row_id, self.worker, self.heartbeat.lease_seconds)
        except Exception:  # noqa: BLE001 - unknown (StoreProblem, a blip): still this worker's
            return True
        finally:
            self.stage_seconds["claim"] = self.stage_seconds.get("claim", 0.0) + time.perf_counter() - started

    def _drop_heartbeat(self) -> None:
        """Stop renewing the claim (its renewals' time was counted already: :meth:`finish`)."""
        if self.heartbeat is not None:
            self.heartbeat.drop(self.row_id)

    def _lost(self, outcome: CellOutcome) -> dict[str, Any]:
        """Finish a cell whose claim was taken over: its progress file says why, its report
        fails; the store is left to the new holder."""
        lost = CellOutcome("failed", failure_stage=outcome.failure_stage or str(self.stage),
                           failure_reason="claim_lost", error_message=self.claim_lost)
        if not self.error_written:
            self.error_written = True
            self.progress.error(lost.failure_stage or str(self.stage), self.claim_lost or "claim lost")
        self.progress.status("FAILED", reason="claim_lost")
        return self.properties(lost)

    def _cost_per_million(self) -> float | None:
        if self.result is None:
            return None
        return self.result.cost_analysis().cost_per_million_tokens

    def figures(self) -> dict[str, Any]:
        """The registered figures (:mod:`.figures`) of the cell's result; empty without one."""
        if self.result is None:
            return {}
        source = FigureSource(self.result.model_dump(mode="json"), self.details or {}, self.run_id)
        return {name: value for name, value in figure_values(source).items() if value is not None}

    def properties(self, outcome: CellOutcome) -> dict[str, Any]:
        """Plain JSON values only: they cross the xdist channel into JUnit XML.

        The cell's identity and outcome, then every registered figure of its result
        as ``gpubench_<name>`` (docs/metrics.md defines each).
        """
        props: dict[str, Any] = {
            "gpubench_cell": self.record_key,
            "gpubench_status": outcome.status,
            "gpubench_failure_stage": outcome.failure_stage or "",
            "gpubench_gpu": self.cell.gpu,
            "gpubench_provider": self.cell.provider,
            "gpubench_model": self.cell.model,
            "gpubench_session_id": self.session_id or "",
            "gpubench_offer_id": self.offer_id or "",
            "gpubench_price_per_hour": self.price_per_hour,
            "gpubench_cost_usd": round(self.cost_usd, 6) if self.cost_usd is not None else None,
            "gpubench_progress_file": str(self.progress.path),
            "gpubench_attempts": self.attempts or None,
        }
        for name, value in self.figures().items():
            digits = FIGURES[name].digits
            props[f"gpubench_{name}"] = round(value, digits) if isinstance(value, float) else value
        validity = self.details.get("validity") if self.details else None
        if validity is not None:
            props["gpubench_valid"] = bool(validity.get("valid"))
            if validity.get("reasons"):
                props["gpubench_invalid_because"] = "; ".join(validity["reasons"])
        if self.details.get("comparison"):
            props["gpubench_comparison"] = self.details["comparison"]
        for figure in getattr(self.microbench, "figures", ()):  # a microbench cell's: gpubench_microbench_matmul_fp16
            if figure.value is not None:
                props[f"gpubench_microbench_{figure.label}"] = round(figure.value, 2)
        return {k: v for k, v in props.items() if v is not None}


def cost_text(cost: float | None) -> str | None:
    """A cell's cost as its ``COMPLETED`` line and the terminal summary show it: ``0.0123``
    (4 decimals: a sandbox or short cell costs well under a cent)."""
    return f"{cost:.4f}" if cost is not None else None


def _holder_of(store: Store, row_id: str) -> str | None:
    current = store.cell(row_id)
    return current.worker if current is not None else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
