"""The ``Store`` protocol: where every run, cell, attempt, session and result is kept.

A new store writes the few methods without a body below (``python bench/architecture.py``
counts them): the connection, runs, the one atomic change of a cell (:meth:`Store.change_cell`),
attempts, results, the baseline query, GPU leases and three plain table operations over
:mod:`.schema`'s tables (:meth:`Store.rows`, :meth:`Store.update_rows`,
:meth:`Store.replace_rows`). Every other method is implemented here once, over those, with the
rules every store shares (the claim rule at the end of this module, :mod:`.manifest`'s row
rules): a store subclasses ``Store`` and inherits them, and overrides one only to do it faster or atomically in its own
terms (PostgreSQL's claim waits on a locked row; the git store's claims reach its repository).

Everything above ``store/`` (the report, cleanup, the spend cap, export, plan
estimates, resume, the terminal) speaks this protocol and reads its typed records
(:mod:`.records`), never a database's rows, so another store (PostgreSQL, for many
machines sharing one matrix) plugs in without touching them. The SQLite manifest
(:class:`~.sqlite_store.SqliteStore`) is the embedded default.

The nouns, and the promises every implementation keeps (``tests/unit/test_store_contract.py``
holds each one to them):

* **runs**: :meth:`start_run` is idempotent (a second call, an xdist worker's,
  changes nothing; another owner takes the run over); :meth:`run_ids` is most
  recent first.
* **cells**: added ``pending`` (adding one twice changes nothing), claimed by one
  worker (``running``), finished with a final status; :meth:`restart_cell` makes a
  finished one ``pending`` again. Row ids are ``f"{run_id}/{cell_id}"``; an unknown
  one is a ``KeyError``, an unknown field or status a ``ValueError``.
* **attempts and sessions owned**: a session is recorded before it is used, so
  :meth:`unreleased_sessions` finds the one a dead worker left; a recorded release
  removes it from there.
* **results and requests**: a result written reads back equal, with its requests in
  order; writing it again (same id) replaces it and keeps its upload state.
* **baselines**: the latest (by run start) ``success`` or ``partial`` of the same
  cell key that has figures, outside the run being compared.
* **claims**: of two workers claiming one pending cell, exactly one wins. A claim made
  with a lease holds while it is renewed; a running cell whose lease expired is won by
  the next claimant (``taken_over_from`` names the old holder), and so is a cell cleanup
  marked ``failed`` as ``abandoned`` (its holder died; it runs again without its recorded
  end). Any other finished cell is never won: the claim says its final status.
* **systems**: what system detection found, once per session of a run, reads back equal.
* **GPU leases**: of a machine's GPUs, a claim gets ``count`` not held by another lease
  (released or expired ones are free) or nothing, atomically across processes; a lease
  renewed before it expires holds on, an expired or released one cannot be renewed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..cloud.gpu_leasing import GpuLease, GpuLeaseBook
from ..cloud.provider import OwnedSession
from ..cloud.processes import ProcessIdentity
from ..errors import Stage
from ..measure.microbench import MicrobenchRun
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from ..remote.sysinfo import SystemInfo
from .manifest import (
    GONE_SESSION_STATUSES,
    check_attempt_fields,
    check_cell_fields,
    details_row,
    end_released_attempt,
    finished_row,
    held_or_unguarded,
    merge_sessions,
    priced,
    released_fields,
    repeat_rows,
    restarted_row,
    sample_rows,
    upload_row,
)
from .manifest import _lease as lease_of_rows
from .manifest import _row as microbench_row
from .records import (
    AttemptRecord,
    Baseline,
    CellRecord,
    Claim,
    MicrobenchRecord,
    ResultRecord,
    RunRecord,
    SystemRecord,
    attempt_record,
    cell_record,
    microbench_record,
    present,
    result_record,
    run_record,
    system_record,
    system_row,
)
from .sqlite import utc_now

__all__ = ["ABANDONED", "Admission", "CellChange", "REOPENED", "Store", "abandoned", "claimable", "decide_claim"]

T = TypeVar("T")

#: Called inside the attempt's write with every attempt of the cell's run; returns
#: ``None`` to go ahead or the reason to refuse (the spend cap, :mod:`..cloud.budget`).
Admission = Callable[[list[AttemptRecord]], "str | None"]


#: What :meth:`Store.change_cell` calls inside its atomic write with the cell's stored row and the
#: store's clock (seconds since the epoch): the answer, and the columns to write (None or {}: nothing).
CellChange = Callable[[dict[str, Any], float], tuple[T, "dict[str, Any] | None"]]


def _of_run(run_id: str | None) -> dict[str, Any]:
    return {"run_id": run_id} if run_id is not None else {}


def _by(*names: str) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A sort key over a row's columns, NULL first (as SQL's ascending order puts them)."""
    return lambda row: tuple((row[name] is not None, row[name] if row[name] is not None else 0) for name in names)


def _guarded(current: Mapping[str, Any], row: dict[str, Any], if_held_by: str | None) -> tuple[bool, dict[str, Any]]:
    """A cell write unless ``if_held_by`` no longer holds it; ``running`` stamps ``started_at`` once."""
    if not held_or_unguarded(current, if_held_by):
        return False, {}
    if row.get("status") == "running" and not current["started_at"]:
        row.setdefault("started_at", utc_now())
    return True, row

@runtime_checkable
class Store(GpuLeaseBook, Protocol):
    """Runs, cells and their statuses, attempts and sessions owned, results and requests,
    baselines and claims. Safe to share between the threads of one process; several
    processes (xdist workers) may each open their own on the same store.

    The methods without a body are what a store implements; the others are shared rules over
    them (a store subclasses ``Store`` to inherit them)."""

    # ------------------------------------------------------------- connection

    #: Where the store is, for people: a file path or a database URL without its password.
    @property
    def location(self) -> str: ...

    def close(self) -> None:
        """Let go of the connection; the store is not used afterwards."""

    def __enter__(self) -> Store:
        """``with open_store(...) as store:`` closes it on the way out."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- table rows
    # The tables are :mod:`.schema`'s; a row is a dict of its columns, as stored.

    def rows(self, table: str, **equal: Any) -> list[dict[str, Any]]:
        """The rows of ``table`` whose columns equal ``equal`` (None: NULL), in the order written."""

    def update_rows(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        """Set ``values`` on the rows of ``table`` whose columns equal ``key``, in one write;
        how many rows matched."""

    def replace_rows(self, table: str, rows: Sequence[Mapping[str, Any]], *,
                     replacing: Mapping[str, Any] | None = None) -> None:
        """Insert ``rows`` into ``table``, in one write with deleting the rows whose columns equal
        ``replacing`` (None: nothing is deleted)."""

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Record that ``run_id`` started, owned by ``owner``; idempotent for the same owner.

        ``clouds``: clouds the run rents through (``cloud:`` name -> its settings, no secret),
        added to those the run recorded before, whoever calls."""

    def run_ids(self) -> list[str]:
        """Every run the store knows (from runs or from their cells), most recent first."""

    def finish_run(self, run_id: str, status: str) -> None:
        """Record the end of ``run_id`` with its final ``status`` (free text, e.g. ``passed``)."""
        if not self.update_rows("runs", {"run_id": run_id}, {"finished_at": utc_now(), "status": status}):
            raise KeyError(f"no runs row {run_id!r}")

    def run(self, run_id: str) -> RunRecord | None:
        """The run ``run_id``, or None."""
        found = self.rows("runs", run_id=run_id)
        return run_record(found[0]) if found else None

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        """Add a ``pending`` cell (once: adding it again changes nothing); returns its row id."""

    def change_cell(self, row_id: str, change: CellChange[T], *, now: float | None = None) -> T:
        """In one atomic write: read cell ``row_id``'s row (a ``KeyError`` if there is none), call
        ``change(row, at)`` (``at``: ``now``, else the store's clock) and write the columns it
        returns; returns its answer. Every claim, guarded write and restart is one of these."""

    def claim_cell(self, row_id: str, worker: str, *, lease_seconds: float | None = None,
                   now: float | None = None) -> Claim:
        """Claim a pending cell for ``worker``: it becomes ``running``, held by ``worker``.

        Atomic: of two workers claiming one cell exactly one wins; the holder
        claiming again wins again (and renews its lease). A finished cell cannot be
        claimed, except one cleanup marked ``abandoned`` (:func:`abandoned`). With
        ``lease_seconds`` the claim holds until ``now + lease_seconds`` unless renewed
        (:meth:`renew_cell_lease`); a running cell whose lease has expired, or an abandoned
        one, is taken over. ``now``: seconds since the epoch (tests).
        """
        def claim(current: dict[str, Any], at: float) -> tuple[Claim, dict[str, Any] | None]:
            return decide_claim(row_id, current, worker, at, at + lease_seconds if lease_seconds is not None else None)

        return self.change_cell(row_id, claim, now=now)

    def renew_cell_lease(self, row_id: str, worker: str, lease_seconds: float, *,
                         now: float | None = None) -> bool:
        """Hold ``worker``'s claim ``lease_seconds`` from now; False when the cell is no longer
        ``running`` under ``worker`` (finished, restarted or taken over)."""
        def renew(current: dict[str, Any], at: float) -> tuple[bool, dict[str, Any] | None]:
            if current["status"] != "running" or current["worker"] != worker:
                return False, None
            return True, {"lease_expires_at": at + lease_seconds}

        return self.change_cell(row_id, renew, now=now)

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        """Set fields of a cell (:class:`~.records.CellRecord` names); ``running`` stamps ``started_at`` once.

        With ``if_held_by``, only while the cell is ``running`` under that holder, checked
        in the same atomic write (a holder that lost its claim writes nothing); returns
        whether it was written (always True without ``if_held_by``).
        """
        row = check_cell_fields(fields)
        return self.change_cell(row_id, lambda current, at: _guarded(current, row, if_held_by))

    def finish_cell(self, row_id: str, *, status: str, failure_stage: Stage | str | None = None,
                    failure_reason: str | None = None, error_message: str | None = None,
                    if_held_by: str | None = None, **fields: Any) -> bool:
        """Record a cell's final ``status`` and ``completed_at``; a success clears earlier failures.

        Unless ``cost_usd`` is given it is the price x the time since :meth:`record_session`.
        With ``if_held_by``, only while the cell is ``running`` under that holder (atomic
        compare-and-set); returns whether it was written.
        """
        row = finished_row(status=status, failure_stage=failure_stage, failure_reason=failure_reason,
                           error_message=error_message, **fields)
        return self.change_cell(row_id, lambda current, at: _guarded(current, priced(row, current), if_held_by))

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        """Make a cell that ended ``pending`` again, without its earlier outcome.

        Never a ``running`` cell (its holder, alive or not, is dealt with by claims and
        leases) nor a pending one; with ``ended_before`` (ISO 8601) only a cell that ended
        before then, so a rerun asked of many controllers runs each cell once, not once per
        controller. Returns whether it was restarted; decided in one atomic write.
        """
        def restart(current: dict[str, Any], at: float) -> tuple[bool, dict[str, Any] | None]:
            row = restarted_row(current, ended_before)
            return row is not None, row

        return self.change_cell(row_id, restart)

    def cell(self, row_id: str) -> CellRecord | None:
        """The cell ``row_id``, or None."""
        found = self.rows("benchmark_manifest", id=row_id)
        return cell_record(found[0]) if found else None

    def cells(self, run_id: str | None = None) -> list[CellRecord]:
        """The cells of one run, or of all, in the order they were added."""
        return [cell_record(row) for row in
                sorted(self.rows("benchmark_manifest", **_of_run(run_id)), key=_by("created_at"))]

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        """Record that the cell starts provisioning attempt ``attempt``; the refusal reason, or None.

        ``admit`` sees every attempt of the run in the same write: two processes
        cannot both take the last dollar of a budget.
        """

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """The attempt's session is released (or never existed): stamp its end and cost, once."""

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """Set fields of one attempt; ``session_id`` also stamps ``session_started_at``."""
        row = check_attempt_fields(fields)
        if "session_id" in row and "session_started_at" not in row:
            row["session_started_at"] = utc_now()
        if not self.update_rows("attempts", {"manifest_id": row_id, "attempt": attempt}, row):
            raise KeyError(f"no attempts row {(row_id, attempt)!r}")

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[AttemptRecord]:
        """The attempts of one cell (``row_id``), one run, or all, in order."""
        where = {"manifest_id": row_id} if row_id is not None else _of_run(run_id)
        return [attempt_record(row) for row in
                sorted(self.rows("attempts", **where), key=_by("started_at", "manifest_id", "attempt"))]

    def record_session(self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
                       price_per_hour: float, if_held_by: str | None = None, **fields: Any) -> bool:
        """Record the session a cell rented, right after creating it and before using it.

        Also stamps ``session_started_at``, from which :meth:`finish_cell` computes ``cost_usd``.
        With ``if_held_by``, only while the cell is ``running`` under that holder (the
        session is then not the row's: the caller releases it); returns whether it was written.
        """
        row = check_cell_fields({"session_id": session_id, "consumer_id": consumer_id, "offer_id": offer_id,
                                 "price_per_hour": price_per_hour, "session_started_at": utc_now(), **fields})
        return self.change_cell(row_id, lambda current, at: _guarded(current, row, if_held_by))

    def unreleased_sessions(self, run_id: str | None = None) -> list[OwnedSession]:
        """Every session (of one run, or all) whose release was never recorded, once each, oldest first."""
        def still_open(row: Mapping[str, Any]) -> bool:
            return row["session_id"] is not None and row["session_status"] not in GONE_SESSION_STATUSES

        cells = {row["id"]: row for row in self.rows("benchmark_manifest", **_of_run(run_id))}

        def owned(cell: Mapping[str, Any], row: Mapping[str, Any], attempt: int | None, at: str | None) -> dict:
            return {"session_id": row["session_id"], "consumer_id": row["consumer_id"], "run_id": row["run_id"],
                    "row_id": cell["id"], "cell_id": cell["cell_id"], "cell_status": cell["status"],
                    "worker": cell["worker"], "progress_file": cell["progress_file"],
                    "session_status": row["session_status"], "attempt": attempt, "at": at}

        found = [owned(cell, cell, None, cell["created_at"]) for cell in cells.values() if still_open(cell)]
        found += [owned(cells[row["manifest_id"]], row, row["attempt"], row["started_at"])
                  for row in self.rows("attempts", **_of_run(run_id))
                  if row["manifest_id"] in cells and row["ended_at"] is None and still_open(row)]
        return [OwnedSession.model_validate(session) for session in merge_sessions(found)]

    def record_release(self, row_id: str, session_id: str, *, session_status: str, released_by: str,
                       attempt: int | None = None) -> None:
        """Record that a cell's session ended, found so by ``released_by``; ends its attempt too.

        The cell row is updated when the session is its own. Unknown rows are a ``KeyError``.
        """
        fields = released_fields(session_status, released_by)

        def release(current: dict[str, Any], at: float) -> tuple[None, dict[str, Any] | None]:
            return None, {**fields, "session_id": session_id} if current["session_id"] in (None, session_id) else None

        self.change_cell(row_id, release)
        end_released_attempt(self, row_id, attempt, session_status)

    def end_shared_session(self, session_id: str, *, session_status: str, released_by: str) -> int:
        """A session several cells ran on ended: every cell that used it says so. Returns how many."""
        fields = released_fields(session_status, released_by)

        def end(current: dict[str, Any], at: float) -> tuple[bool, dict[str, Any] | None]:
            changed = current["session_id"] == session_id and current["session_status"] not in GONE_SESSION_STATUSES
            return changed, fields if changed else None

        return sum(self.change_cell(row["id"], end) for row in self.rows("benchmark_manifest", session_id=session_id))

    # -------------------------------------------------- results and requests

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        """Store a cell's result and its requests; returns the result id (``result.id`` or a new one).

        Storing it again (same id) replaces it and its requests, keeping its upload state."""

    def set_result_details(self, result_id: str, details: Mapping[str, Any]) -> None:
        """Store the figures beyond the BenchmarkResult shape on a result."""
        if not self.update_rows("benchmarks", {"id": result_id}, details_row(details)):
            raise KeyError(f"no benchmark {result_id!r}")

    def add_repeats(self, result_id: str, runs: Iterable[Any]) -> int:
        """Store the repeated measurements behind a result (replacing earlier ones); how many."""
        rows = repeat_rows(result_id, runs)
        if not self.rows("benchmarks", id=result_id):
            raise KeyError(f"no benchmark {result_id!r}")
        self.replace_rows("benchmark_runs", rows, replacing={"benchmark_id": result_id})
        return len(rows)

    def add_gpu_samples(self, row_id: str, result_id: str | None, samples: Iterable[Any]) -> int:
        """Append a cell's GPU telemetry samples; how many. An unknown ``row_id`` is a ``KeyError``."""
        rows = sample_rows(row_id, result_id, samples)
        self._cell_row(row_id)
        self.replace_rows("gpu_samples", rows)
        return len(rows)

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        """Store a microbenchmark cell's figures (replacing earlier ones of the cell); how many."""
        created, cell = utc_now(), self._cell_row(row_id)
        rows = [microbench_row(cell, created, run, figure) for figure in run.figures]
        self.replace_rows("microbench_figures", rows, replacing={"manifest_id": row_id})
        return len(rows)

    def microbench(self, run_id: str | None = None) -> list[MicrobenchRecord]:
        """The microbenchmark figures of one run, or of all, in the order stored."""
        return [microbench_record(row) for row in
                sorted(self.rows("microbench_figures", **_of_run(run_id)), key=_by("created_at"))]

    def result(self, result_id: str) -> ResultRecord | None:
        """The result ``result_id``, or None."""
        found = self.rows("benchmarks", id=result_id)
        return result_record(found[0]) if found else None

    def results(self, run_id: str | None = None) -> list[ResultRecord]:
        """The results of one run, or of all, oldest first."""
        return [result_record(row) for row in sorted(self.rows("benchmarks", **_of_run(run_id)), key=_by("created_at"))]

    def known_result(self, identity: str) -> ResultRecord | None:
        """The result stored as ``identity`` or uploaded as it (its remote id), or None."""
        found = self.rows("benchmarks", id=identity) or self.rows("benchmarks", remote_id=identity)
        return result_record(found[0]) if found else None

    def requests(self, result_id: str) -> list[RequestRecord]:
        """The per-request records of one result, in request order."""
        return [RequestRecord.model_validate(present(row))
                for row in sorted(self.rows("requests", benchmark_id=result_id), key=_by("index"))]

    def request_uploads(self, run_id: str | None = None) -> int:
        """Ask for the upload of results never asked for; how many."""
        return sum(self.update_rows("benchmarks", {"id": row["id"], "upload_status": None},
                                    {"upload_status": "pending"})
                   for row in self.rows("benchmarks", upload_status=None, **_of_run(run_id)))

    def pending_uploads(self, run_id: str | None = None) -> list[ResultRecord]:
        """Results whose upload was asked for and has not succeeded, oldest first."""
        return [result for result in self.results(run_id) if result.upload_status in ("pending", "failed")]

    def mark_upload(self, result_id: str, *, status: str, remote_id: str | None = None,
                    error: str | None = None) -> None:
        """Record a result's upload state: ``pending``, ``uploaded`` (with ``remote_id``) or ``failed``."""
        if not self.update_rows("benchmarks", {"id": result_id}, upload_row(status=status, remote_id=remote_id,
                                                                            error=error)):
            raise KeyError(f"no benchmark {result_id!r}")

    # ------------------------------------------------------------------ systems

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        """Record what system detection found on ``session_id``'s machine (``machine``: the offer's
        machine id, a host's name), detected by cell ``row_id``.

        Once per session: recording the same session of the run again replaces it.
        An unknown ``row_id`` is a ``KeyError``.
        """
        row = system_row(self._cell_row(row_id), session_id, system, utc_now(), machine)
        self.replace_rows("systems", [row], replacing={"run_id": row["run_id"], "session_id": session_id})

    def systems(self, run_id: str | None = None) -> list[SystemRecord]:
        """The detected systems of one run, or of all, in the order they were recorded."""
        return [system_record(row) for row in sorted(self.rows("systems", **_of_run(run_id)), key=_by("recorded_at"))]

    # ---------------------------------------------------------------- baselines

    def baseline(self, record_key: str, run_id: str | None = "last",
                 exclude_run: str | None = None) -> Baseline | None:
        """The latest ``success`` or ``partial`` with figures of cell ``record_key``.

        In run ``run_id``, or (``"last"``/None) the most recent run other than ``exclude_run``.
        """

    # ---------------------------------------------------------------- GPU leases
    # claim_gpus, renew_gpu_lease, release_gpu_lease: :class:`GpuLeaseBook`'s, which Store
    # extends (cloud/gpu_leasing.py: the hosts and local providers lease through them).

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        """The leases (of one machine, or all), oldest first; with ``active_at`` only those holding then."""
        rows = sorted(self.rows("gpu_leases", **({"machine": machine} if machine is not None else {})),
                      key=_by("acquired_at", "lease_id", "gpu_index"))
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["lease_id"], []).append(row)
        leases = [lease_of_rows(group) for group in grouped.values()]
        return [lease for lease in leases if active_at is None or lease.active(active_at)]

    # ------------------------------------------------------------------ helpers

    def _cell_row(self, row_id: str) -> dict[str, Any]:
        found = self.rows("benchmark_manifest", id=row_id)
        if not found:
            raise KeyError(f"no manifest row {row_id!r}")
        return found[0]


# --------------------------------------------------------------------------------------------------
# Who wins a claim on a cell, given the cell as stored: the rule every store applies.
#
# Each store reads the cell inside its own atomic write (SQLite's ``BEGIN IMMEDIATE``,
# PostgreSQL's ``SELECT ... FOR UPDATE SKIP LOCKED``) and applies the answer; the rule
# itself is here once, so the stores cannot drift apart.


#: The failure reason of a cell cleanup closed because its holder's process was gone (not its
#: run's own failure): the claim rule lets the next claimant take it over.
ABANDONED = "abandoned"

#: What an abandoned cell's row says of its end, cleared when it is taken over (it runs again).
REOPENED = ("completed_at", "failure_stage", "failure_reason", "error_message", "cost_usd")


def abandoned(status: str | None, failure_reason: str | None) -> bool:
    """Whether a cell so ended was abandoned: cleanup found its holder's process gone, released
    its session and marked it ``failed`` as ``abandoned`` (``run/cleanup.py``). Its run never
    failed it: like a running cell whose lease ran out, the next claimant takes it over."""
    return status == "failed" and failure_reason == ABANDONED


def _expired(current: Mapping[str, Any], worker: str, at: float) -> bool:
    expires = current.get("lease_expires_at")
    return (current["status"] == "running" and current["worker"] != worker and expires is not None
            and expires <= at)


def _taken_over(current: Mapping[str, Any], worker: str, at: float) -> bool:
    """Whether ``worker``'s claim at ``at`` takes the cell from a holder gone (an expired lease, or abandoned)."""
    return _expired(current, worker, at) or abandoned(current["status"], current.get("failure_reason"))


def claimable(current: Mapping[str, Any], worker: str, at: float) -> bool:
    """Whether ``worker`` would win the cell ``current`` at ``at`` (seconds since the epoch)."""
    status = current["status"]
    return status == "pending" or (status == "running" and current["worker"] == worker) or _taken_over(
        current, worker, at)


def decide_claim(row_id: str, current: Mapping[str, Any], worker: str, at: float,
                 lease: float | None) -> tuple[Claim, dict[str, Any] | None]:
    """The claim ``worker`` makes on ``current`` at ``at``, and the cell's columns to write (None: nothing).

    A pending cell, the claimant's own, a running one whose lease expired before ``at``,
    or an abandoned one (taken over: it runs again, without its recorded end) is won
    (``lease``: the new expiry); any other is held by its worker, or ended.
    """
    status, holder = current["status"], current["worker"]
    if not claimable(current, worker, at):
        return Claim(row_id=row_id, holder=holder, won=False, status=status, since=current["started_at"],
                     lease_expires_at=current.get("lease_expires_at")), None
    taken = _taken_over(current, worker, at)
    started = (current["started_at"] if status == "running" and holder == worker else None) or utc_now()
    claim = Claim(row_id=row_id, holder=worker, won=True, since=started, lease_expires_at=lease,
                  taken_over_from=holder if taken else None)
    columns: dict[str, Any] = {"status": "running", "worker": worker, "started_at": started, "lease_expires_at": lease}
    if status != "running" and taken:
        columns.update(dict.fromkeys(REOPENED))
    return claim, columns
