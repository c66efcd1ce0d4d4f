"""The ``Store`` protocol: where every run, cell, attempt, session and result is kept.

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

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..cloud.gpu_lease import GpuLeaseBook
from ..cloud.processes import ProcessIdentity
from ..errors import Stage
from ..measure.microbench import MicrobenchRun
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from ..remote.sysinfo import SystemInfo
from .records import (AttemptRecord, Baseline, CellRecord, Claim, MicrobenchRecord, OwnedSession, ResultRecord,
                      RunRecord, SystemRecord)

__all__ = ["Admission", "Store"]

#: Called inside the attempt's write with every attempt of the cell's run; returns
#: ``None`` to go ahead or the reason to refuse (the spend cap, :mod:`..cloud.budget`).
Admission = Callable[[list[AttemptRecord]], "str | None"]


@runtime_checkable
class Store(GpuLeaseBook, Protocol):
    """Runs, cells and their statuses, attempts and sessions owned, results and requests,
    baselines and claims. Safe to share between the threads of one process; several
    processes (xdist workers) may each open their own on the same store."""

    #: Where the store is, for people: a file path or a database URL without its password.
    @property
    def location(self) -> str: ...

    def close(self) -> None:
        """Let go of the connection; the store is not used afterwards."""

    def __enter__(self) -> Store:
        """``with open_store(...) as store:`` closes it on the way out."""

    def __exit__(self, *exc: object) -> None: ...

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Record that ``run_id`` started, owned by ``owner``; idempotent for the same owner.

        ``clouds``: clouds the run rents through (``cloud:`` name -> its settings, no secret),
        added to those the run recorded before, whoever calls."""

    def finish_run(self, run_id: str, status: str) -> None:
        """Record the end of ``run_id`` with its final ``status`` (free text, e.g. ``passed``)."""

    def run(self, run_id: str) -> RunRecord | None:
        """The run ``run_id``, or None."""

    def run_ids(self) -> list[str]:
        """Every run the store knows (from runs or from their cells), most recent first."""

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        """Add a ``pending`` cell (once: adding it again changes nothing); returns its row id."""

    def claim_cell(self, row_id: str, worker: str, *, lease_seconds: float | None = None,
                   now: float | None = None) -> Claim:
        """Claim a pending cell for ``worker``: it becomes ``running``, held by ``worker``.

        Atomic: of two workers claiming one cell exactly one wins; the holder
        claiming again wins again (and renews its lease). A finished cell cannot be
        claimed, except one cleanup marked ``abandoned`` (``store/claim_rule.py``). With
        ``lease_seconds`` the claim holds until ``now + lease_seconds`` unless renewed
        (:meth:`renew_cell_lease`); a running cell whose lease has expired, or an abandoned
        one, is taken over. ``now``: seconds since the epoch (tests).
        """

    def renew_cell_lease(self, row_id: str, worker: str, lease_seconds: float, *,
                         now: float | None = None) -> bool:
        """Hold ``worker``'s claim ``lease_seconds`` from now; False when the cell is no longer
        ``running`` under ``worker`` (finished, restarted or taken over)."""

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        """Set fields of a cell (:class:`~.records.CellRecord` names); ``running`` stamps ``started_at`` once.

        With ``if_held_by``, only while the cell is ``running`` under that holder, checked
        in the same atomic write (a holder that lost its claim writes nothing); returns
        whether it was written (always True without ``if_held_by``).
        """

    def finish_cell(self, row_id: str, *, status: str, failure_stage: Stage | str | None = None,
                    failure_reason: str | None = None, error_message: str | None = None,
                    if_held_by: str | None = None, **fields: Any) -> bool:
        """Record a cell's final ``status`` and ``completed_at``; a success clears earlier failures.

        Unless ``cost_usd`` is given it is the price x the time since :meth:`record_session`.
        With ``if_held_by``, only while the cell is ``running`` under that holder (atomic
        compare-and-set); returns whether it was written.
        """

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        """Make a cell that ended ``pending`` again, without its earlier outcome.

        Never a ``running`` cell (its holder, alive or not, is dealt with by claims and
        leases) nor a pending one; with ``ended_before`` (ISO 8601) only a cell that ended
        before then, so a rerun asked of many controllers runs each cell once, not once per
        controller. Returns whether it was restarted; decided in one atomic write.
        """

    def cell(self, row_id: str) -> CellRecord | None:
        """The cell ``row_id``, or None."""

    def cells(self, run_id: str | None = None) -> list[CellRecord]:
        """The cells of one run, or of all, in the order they were added."""

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        """Record that the cell starts provisioning attempt ``attempt``; the refusal reason, or None.

        ``admit`` sees every attempt of the run in the same write: two processes
        cannot both take the last dollar of a budget.
        """

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """Set fields of one attempt; ``session_id`` also stamps ``session_started_at``."""

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """The attempt's session is released (or never existed): stamp its end and cost, once."""

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[AttemptRecord]:
        """The attempts of one cell (``row_id``), one run, or all, in order."""

    def record_session(self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
                       price_per_hour: float, if_held_by: str | None = None, **fields: Any) -> bool:
        """Record the session a cell rented, right after creating it and before using it.

        With ``if_held_by``, only while the cell is ``running`` under that holder (the
        session is then not the row's: the caller releases it); returns whether it was written.
        """

    def unreleased_sessions(self, run_id: str | None = None) -> list[OwnedSession]:
        """Every session (of one run, or all) whose release was never recorded, once each, oldest first."""

    def record_release(self, row_id: str, session_id: str, *, session_status: str, released_by: str,
                       attempt: int | None = None) -> None:
        """Record that a cell's session ended, found so by ``released_by``; ends its attempt too."""

    def end_shared_session(self, session_id: str, *, session_status: str, released_by: str) -> int:
        """A session several cells ran on ended: every cell that used it says so. Returns how many."""

    # -------------------------------------------------- results and requests

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        """Store a cell's result and its requests; returns the result id (``result.id`` or a new one)."""

    def set_result_details(self, result_id: str, details: Mapping[str, Any]) -> None:
        """Store the figures beyond the BenchmarkResult shape on a result."""

    def add_repeats(self, result_id: str, runs: Iterable[Any]) -> int:
        """Store the repeated measurements behind a result (replacing earlier ones); how many."""

    def add_gpu_samples(self, row_id: str, result_id: str | None, samples: Iterable[Any]) -> int:
        """Append a cell's GPU telemetry samples; how many."""

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        """Store a microbenchmark cell's figures (replacing earlier ones of the cell); how many."""

    def microbench(self, run_id: str | None = None) -> list[MicrobenchRecord]:
        """The microbenchmark figures of one run, or of all, in the order stored."""

    def result(self, result_id: str) -> ResultRecord | None:
        """The result ``result_id``, or None."""

    def results(self, run_id: str | None = None) -> list[ResultRecord]:
        """The results of one run, or of all, oldest first."""

    def known_result(self, identity: str) -> ResultRecord | None:
        """The result stored as ``identity`` or uploaded as it (its remote id), or None."""

    def requests(self, result_id: str) -> list[RequestRecord]:
        """The per-request records of one result, in request order."""

    def request_uploads(self, run_id: str | None = None) -> int:
        """Ask for the upload of results never asked for; how many."""

    def pending_uploads(self, run_id: str | None = None) -> list[ResultRecord]:
        """Results whose upload was asked for and has not succeeded, oldest first."""

    def mark_upload(self, result_id: str, *, status: str, remote_id: str | None = None,
                    error: str | None = None) -> None:
        """Record a result's upload state: ``pending``, ``uploaded`` (with ``remote_id``) or ``failed``."""

    # ------------------------------------------------------------------ systems

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        """Record what system detection found on ``session_id``'s machine (``machine``: the offer's
        machine id, a host's name), detected by cell ``row_id``.

        Once per session: recording the same session of the run again replaces it.
        An unknown ``row_id`` is a ``KeyError``.
        """

    def systems(self, run_id: str | None = None) -> list[SystemRecord]:
        """The detected systems of one run, or of all, in the order they were recorded."""

    # ---------------------------------------------------------------- baselines

    def baseline(self, record_key: str, run_id: str | None = "last",
                 exclude_run: str | None = None) -> Baseline | None:
        """The latest ``success`` or ``partial`` with figures of cell ``record_key``.

        In run ``run_id``, or (``"last"``/None) the most recent run other than ``exclude_run``.
        """

    # ---------------------------------------------------------------- GPU leases
    # claim_gpus, renew_gpu_lease, release_gpu_lease, gpu_leases: :class:`GpuLeaseBook`'s, which
    # Store extends (cloud/gpu_lease.py: the hosts and local providers lease through them).
