"""The manifest: every run, every cell's outcome, every result, in one SQLite file.

Tables (sqlite-utils creates them and adds columns a newer version needs):

* ``runs``: one row per pytest run.
* ``benchmark_manifest``: one row per matrix cell of a run, with seed 001's columns
  exactly, plus what this project learned to keep (offer, price and cost, the
  session's last API status, the worker, the progress file).
* ``benchmarks``: one row per result, the flattened ``PerformanceResults`` and the
  full ``BenchmarkResult`` JSON in ``result_json``.
* ``requests``: the per-request records behind each result.
* ``attempts``: one row per offer a cell tried (failover), with its session, stage,
  error, times and cost; the spend cap (``budget.py``) is computed from them.

Several pytest-xdist workers write to the same file at once. That works because the
database is in WAL mode (readers never wait), every write is one short
``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so two writers
cannot deadlock upgrading a read lock), SQLite's busy timeout lets writers queue,
and a write that still meets "database is locked" is retried with backoff.

A session is recorded (:meth:`Manifest.record_session`) before it is used, so the
session of a worker that died can be found (:meth:`Manifest.open_sessions`) and
released. Nothing that looks like key material is ever stored.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import Stage, current_stage_name
from . import record_keys
from .attempts import AttemptsMixin
from .gpu_leases import GpuLeasesMixin
from .result_tables import ResultsMixin
from .schema import (
    CELL_STATUSES,
    FINAL_STATUSES,
    FIXED_COLUMNS,
    MANIFEST_COLUMNS,
    UPLOAD_STATUSES,
)
from .microbench_table import MicrobenchMixin
from .systems_table import SystemsMixin
from .sqlite import ManifestStore, plain, refuse_secrets, utc_now
from .redaction import redact
from ..cloud.processes import ProcessIdentity

__all__ = ["CELL_STATUSES", "FINAL_STATUSES", "UPLOAD_STATUSES", "Manifest"]

# "not_found": the API has no such session (any more); recorded by cleanup.
_GONE_SESSION_STATUSES = ("stopped", "failed", "not_found")


class Manifest(ResultsMixin, AttemptsMixin, MicrobenchMixin, SystemsMixin, GpuLeasesMixin, ManifestStore):
    """The SQLite manifest at ``path``; one instance per process, shareable by threads.

    Opening creates the file, its parent directories and the schema as needed.
    ``busy_timeout`` is how long SQLite waits for another writer before reporting
    "database is locked"; ``retry_seconds`` how long a write keeps retrying after that.
    Row ids are ``f"{run_id}/{cell_id}"``; an unknown row id is a ``KeyError``.
    Runs, cells and their sessions are here; results in :mod:`.manifest_results`,
    attempts in :mod:`.manifest_attempts`, the plumbing in :mod:`.manifest_store`.
    """

    @staticmethod
    def _check_cell_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        unknown = [k for k in fields if k not in MANIFEST_COLUMNS or k in FIXED_COLUMNS]
        if unknown:
            raise ValueError(f"not updatable manifest columns: {', '.join(sorted(unknown))}")
        row = {key: plain(value) for key, value in fields.items()}
        if "status" in row and row["status"] not in CELL_STATUSES:
            raise ValueError(
                f"manifest status must be one of {', '.join(CELL_STATUSES)}, got {row['status']!r}"
            )
        if row.get("failure_stage") is not None:
            row["failure_stage"] = Stage(current_stage_name(row["failure_stage"])).value  # an older name: today's
        refuse_secrets(row)
        return row

    def _update(self, row_id: str, row: dict[str, Any], if_held_by: str | None = None,
                current: Mapping[str, Any] | None = None) -> bool:
        """Inside a transaction: apply ``row`` (unless ``if_held_by`` no longer holds the cell);
        ``running`` stamps ``started_at`` once. Whether it was written."""
        current = self._cell_or_raise(row_id) if current is None else current
        if not held_or_unguarded(current, if_held_by):
            return False
        if row.get("status") == "running" and not current["started_at"]:
            row.setdefault("started_at", utc_now())
        if row:
            self.db.table("benchmark_manifest").update(row_id, row)
        return True

    # ---------------------------------------------------------------------- runs

    def start_run(
        self, run_id: str, argv: list[str], matrix_files: list[str], *, owner: ProcessIdentity | None = None,
        api: str | None = None, sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Record that run ``run_id`` started; a second call (an xdist worker's) changes nothing.

        ``owner`` is the process that owns the run (the xdist controller); ``api`` the
        GPU Shopper URL it rents from and ``sandbox`` whether that is the run's own
        sandbox. Cleanup reads them to leave a live run alone. When another process
        owned the run before (``--gpubench-resume``, or a run id given again), the
        new owner takes it over: the run is ``running`` again, ``resumed_at`` stamped.
        """
        row = run_row(run_id, argv, matrix_files, owner=owner, api=api, sandbox=sandbox, clouds=clouds)

        def start() -> None:
            table = self.db.table("runs")
            found = list(table.rows_where("run_id = ?", [run_id]))
            if not found:
                table.insert(row)
                return
            update = (taken_over(found[0], row, owner) if owner is not None else {}) | more_clouds(found[0], clouds)
            if update:
                table.update(run_id, update)

        self._write(start)

    def finish_run(self, run_id: str, status: str) -> None:
        """Record the end of run ``run_id`` with its final ``status`` (free text, e.g. ``passed``)."""
        self._update_row("runs", run_id, {"finished_at": utc_now(), "status": status})

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The ``runs`` row of ``run_id``, ``argv`` and ``matrix_files`` still JSON text."""
        rows = self._retry(lambda: list(self.db.table("runs").rows_where("run_id = ?", [run_id])))
        return rows[0] if rows else None

    def latest_run_id(self) -> str | None:
        """The most recently started run, or ``None`` for an empty manifest."""

        def query() -> str | None:
            for sql in (
                "SELECT run_id FROM runs ORDER BY started_at DESC, rowid DESC LIMIT 1",
                "SELECT run_id FROM benchmark_manifest ORDER BY created_at DESC LIMIT 1",
            ):
                found = self.db.execute(sql).fetchone()
                if found:
                    return found[0]
            return None

        return self._retry(query)

    # --------------------------------------------------------------------- cells

    def add_cell(
        self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
        matrix_file: str,
    ) -> str:
        """Add cell ``cell_id`` of ``run_id`` as ``pending``; returns ``f"{run_id}/{cell_id}"``.

        Adding a row that exists changes nothing, so the controller and every worker
        may add the same cell.
        """
        row = cell_row(run_id, cell_id, gpu_type=gpu_type, provider=provider, model=model,
                       matrix_file=matrix_file)
        self._write(lambda: self.db.table("benchmark_manifest").insert(row, ignore=True))
        return row["id"]

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        """Set manifest columns of ``row_id``; an unknown column or status is a ``ValueError``.

        The first change to ``running`` also sets ``started_at``. With ``if_held_by``, only
        while the cell runs under that holder (checked in the same transaction); whether it was written.
        """
        row = self._check_cell_fields(fields)
        return self._write(lambda: self._update(row_id, row, if_held_by))

    def record_session(
        self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
        price_per_hour: float, if_held_by: str | None = None, **fields: Any,
    ) -> bool:
        """Record the session a cell rented, right after creating it and before using it.

        Also stamps ``session_started_at``, from which :meth:`finish_cell` computes
        ``cost_usd``. Extra ``fields`` (``session_status``, ``worker``, ...) are set too.
        With ``if_held_by``, only while the cell runs under that holder; whether it was written.
        """
        row = self._check_cell_fields(
            {
                "session_id": session_id,
                "consumer_id": consumer_id,
                "offer_id": offer_id,
                "price_per_hour": price_per_hour,
                "session_started_at": utc_now(),
                **fields,
            }
        )
        return self._write(lambda: self._update(row_id, row, if_held_by))

    def finish_cell(
        self,
        row_id: str,
        *,
        status: str,
        failure_stage: Stage | str | None = None,
        failure_reason: str | None = None,
        error_message: str | None = None,
        if_held_by: str | None = None,
        **fields: Any,
    ) -> bool:
        """Record a cell's outcome: a final ``status`` and ``completed_at``.

        The failure columns are always written, so a success clears an earlier
        failure. Unless ``cost_usd`` is given, it is computed as ``price_per_hour``
        x the time since :meth:`record_session` (a lower bound if the session is
        released after this call). With ``if_held_by``, only while the cell runs
        under that holder (compare-and-set); whether it was written.
        """
        row = finished_row(status=status, failure_stage=failure_stage, failure_reason=failure_reason,
                           error_message=error_message, **fields)

        def finish() -> bool:
            current = self._cell_or_raise(row_id)
            return self._update(row_id, priced(row, current), if_held_by, current)

        return self._write(finish)

    def cell(self, row_id: str) -> dict[str, Any] | None:
        """The manifest row ``row_id``, or ``None``."""
        rows = self._retry(
            lambda: list(self.db.table("benchmark_manifest").rows_where("id = ?", [row_id]))
        )
        return rows[0] if rows else None

    def cells(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Manifest rows, of one run or all, in the order they were added."""
        return self._rows("benchmark_manifest", run_id)

    def open_sessions(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Rows whose session may still be alive: a session id, and no stopped/failed status seen.

        These are what cleanup must release when a worker or a run died.
        """
        gone = ", ".join("?" * len(_GONE_SESSION_STATUSES))
        where = f"session_id IS NOT NULL AND (session_status IS NULL OR session_status NOT IN ({gone}))"
        params: list[Any] = list(_GONE_SESSION_STATUSES)
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)
        return self._retry(
            lambda: list(
                self.db.table("benchmark_manifest").rows_where(
                    where, params, order_by="created_at, rowid"
                )
            )
        )

    def unreleased_sessions(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every session the manifest knows whose release was never recorded.

        The cells' sessions (:meth:`open_sessions`) and those of earlier provisioning
        attempts not yet ended, once each, oldest first. Each is a dict with
        ``session_id``, ``consumer_id``, ``run_id``, ``row_id``, ``cell_id``,
        ``cell_status``, ``worker``, ``progress_file``, ``session_status`` and
        ``attempt`` (the attempt number, or None when only the cell row knows it).
        """
        gone = ", ".join("?" * len(_GONE_SESSION_STATUSES))

        def still_open(table: str) -> str:
            return f"({table}.session_status IS NULL OR {table}.session_status NOT IN ({gone}))"

        run_filter = " AND m.run_id = ?" if run_id is not None else ""
        cells_sql = f"""
            SELECT m.session_id, m.consumer_id, m.run_id, m.id, m.cell_id, m.status, m.worker,
                   m.progress_file, m.session_status, NULL, m.created_at
            FROM benchmark_manifest m
            WHERE m.session_id IS NOT NULL AND {still_open("m")} {run_filter}
        """
        attempts_sql = f"""
            SELECT a.session_id, a.consumer_id, a.run_id, m.id, m.cell_id, m.status, m.worker,
                   m.progress_file, a.session_status, a.attempt, a.started_at
            FROM attempts a JOIN benchmark_manifest m ON m.id = a.manifest_id
            WHERE a.session_id IS NOT NULL AND a.ended_at IS NULL AND {still_open("a")} {run_filter}
        """
        params: list[Any] = list(_GONE_SESSION_STATUSES) + ([run_id] if run_id is not None else [])
        names = ("session_id", "consumer_id", "run_id", "row_id", "cell_id", "cell_status", "worker",
                 "progress_file", "session_status", "attempt")

        def query() -> list[dict[str, Any]]:
            rows = self.db.execute(cells_sql, params).fetchall()
            if self.db.table("attempts").exists():
                rows += self.db.execute(attempts_sql, params).fetchall()
            return merge_sessions([{**dict(zip(names, row[:-1], strict=True)), "at": row[-1]} for row in rows])

        return self._retry(query)

    def record_release(
        self, row_id: str, session_id: str, *, session_status: str, released_by: str,
        attempt: int | None = None,
    ) -> None:
        """Record that ``session_id`` of cell ``row_id`` ended, found so by ``released_by``.

        The cell row is updated when the session is its own; an attempt's row is
        ended too (``attempt``). Unknown rows are a ``KeyError``.
        """
        fields = released_fields(session_status, released_by)

        def record() -> None:
            current = self._cell_or_raise(row_id)
            if current["session_id"] in (None, session_id):
                self.db.table("benchmark_manifest").update(
                    row_id, {**fields, "session_id": session_id})

        self._write(record)
        end_released_attempt(self, row_id, attempt, session_status)

    def end_shared_session(self, session_id: str, *, session_status: str, released_by: str) -> int:
        """A session several cells ran on (session reuse) is released: every row that used
        it and does not know yet says so. Returns how many rows changed."""
        fields = released_fields(session_status, released_by)
        gone = ", ".join("?" * len(_GONE_SESSION_STATUSES))

        def record() -> int:
            cursor = self.db.execute(
                f"UPDATE benchmark_manifest SET session_status = ?, released_by = ?, session_released_at = ? "
                f"WHERE session_id = ? AND (session_status IS NULL OR session_status NOT IN ({gone}))",
                [fields["session_status"], fields["released_by"], fields["session_released_at"], session_id,
                 *_GONE_SESSION_STATUSES])
            return cursor.rowcount

        return self._write(record)

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        """Make a cell that already ran ``pending`` again, with nothing of its earlier outcome.

        For a cell run again in the same run (``--gpubench-resume``): its row is
        updated, not duplicated. A pending or running cell is left as it is, and with
        ``ended_before`` (ISO 8601) one that ended since then (returns False).
        Results stored earlier stay in ``benchmarks``. A session of the earlier
        attempt that was never released is named in ``notes``, not forgotten.
        """

        def restart() -> bool:
            row = restarted_row(self._cell_or_raise(row_id), ended_before)
            if row is None:
                return False
            self.db.table("benchmark_manifest").update(row_id, row)
            return True

        return self._write(restart)


# ------------------------------------------------- rows, the same for every store
# What the manifest writes, decided without a database, so the PostgreSQL store
# (postgres_store.py) writes exactly the same rows.

#: What a cell's earlier attempt leaves in its row and a new attempt must not inherit.
ATTEMPT_FIELDS = (
    "session_id", "instance_ip", "ssh_port", "started_at", "completed_at", "benchmark_id",
    "decode_tokens_per_second", "output_tokens_per_second", "total_requests", "error_count",
    "failure_reason", "failure_stage",
    "error_message", "offer_id", "price_per_hour", "cost_usd", "api_cost_usd", "session_status",
    "session_started_at", "consumer_id", "worker", "lease_expires_at", "ttft_p50_ms", "cost_per_million_tokens",
    "host_key_fingerprint", "attempts", "released_by", "session_released_at",
)


def run_row(run_id: str, argv: list[str], matrix_files: list[str], *, owner: ProcessIdentity | None,
            api: str | None, sandbox: bool | None,
            clouds: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The ``runs`` row a run starts with (see :meth:`Manifest.start_run`)."""
    row: dict[str, Any] = {
        "run_id": run_id,
        "started_at": utc_now(),
        # Every element, so both --gpubench-store=URL and --gpubench-store URL lose their password.
        "argv": json.dumps([redact(arg) for arg in argv]),
        "matrix_files": json.dumps([str(f) for f in matrix_files]),
        "host": owner.host if owner is not None else socket.gethostname(),
        "status": "running",
    }
    if owner is not None:
        row.update(pid=owner.pid, pid_start=owner.start)
    if api is not None:
        row["api"] = redact(api)  # shown by gpubench browse and cleanup: never its password
    if sandbox is not None:
        row["sandbox"] = int(sandbox)
    if clouds:
        row["clouds"] = clouds_text(clouds)
    refuse_secrets(row)
    return row


def clouds_text(clouds: Mapping[str, Mapping[str, str]]) -> str:
    """``runs.clouds`` as stored: JSON, each setting redacted (a URL never keeps its password)."""
    return json.dumps({str(cloud): {str(key): redact(str(value)) for key, value in settings.items()}
                       for cloud, settings in sorted(clouds.items())}, sort_keys=True)


def more_clouds(current: Mapping[str, Any], clouds: Mapping[str, Mapping[str, str]] | None) -> dict[str, Any]:
    """The ``runs`` update that adds ``clouds`` to those the stored run ``current`` recorded
    (a cloud recorded again takes its new settings); {}: nothing new."""
    if not clouds:
        return {}
    try:
        known = json.loads(current.get("clouds") or "{}")
    except ValueError:
        known = {}
    merged = clouds_text({**(known if isinstance(known, dict) else {}), **clouds})
    return {} if merged == current.get("clouds") else {"clouds": merged}


def taken_over(current: Mapping[str, Any], row: Mapping[str, Any], owner: ProcessIdentity) -> dict[str, Any]:
    """What the stored run ``current`` changes to when ``owner`` starts it (``row``) again; {}: nothing."""
    if current["pid"] is not None and (current["pid"], current["pid_start"]) == (owner.pid, owner.start):
        return {}  # its own process again (a worker, or a store opened after the run ended): no change
    taken = current["finished_at"] is not None or current["pid"] is not None
    update = {key: row[key] for key in ("host", "pid", "pid_start", "api", "sandbox") if key in row}
    if taken:
        update.update(finished_at=None, status="running", resumed_at=utc_now())
    return update


def cell_row(run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
             matrix_file: str) -> dict[str, Any]:
    """The ``pending`` row of a new cell, its id ``f"{run_id}/{cell_id}"``."""
    if not run_id or not cell_id:
        raise ValueError("run_id and cell_id must not be empty")
    row = {
        "id": record_keys.row_id(run_id, cell_id),
        "run_id": run_id,
        "created_at": utc_now(),
        "cell_id": cell_id,
        "gpu_type": gpu_type,
        "provider": provider,
        "model": model,
        "matrix_file": str(matrix_file),
        "status": "pending",
    }
    refuse_secrets(row)
    return row


def finished_row(*, status: str, failure_stage: Stage | str | None, failure_reason: str | None,
                 error_message: str | None, **fields: Any) -> dict[str, Any]:
    """A finished cell's columns, checked; the failure columns always written (a success clears them)."""
    if status not in FINAL_STATUSES:
        raise ValueError(f"a finished cell's status is one of {', '.join(FINAL_STATUSES)}")
    return Manifest._check_cell_fields({"status": status, "failure_stage": failure_stage,
                                        "failure_reason": failure_reason, "error_message": error_message,
                                        **fields})


def priced(row: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` of a cell finishing now: ``completed_at``, no lease, and unless given ``cost_usd``:
    the price x the time since its session was recorded."""
    now = datetime.now(timezone.utc)
    # A finished cell holds no lease: nothing may take it over.
    values = {**row, "completed_at": now.isoformat(timespec="milliseconds"), "lease_expires_at": None}
    price = values.get("price_per_hour", current["price_per_hour"])
    started = current["session_started_at"]
    if "cost_usd" not in values and price is not None and started:
        hours = (now - datetime.fromisoformat(started)).total_seconds() / 3600
        values["cost_usd"] = price * max(hours, 0.0)
    return values


def held_or_unguarded(current: Mapping[str, Any], if_held_by: str | None) -> bool:
    """Whether a guarded write (:meth:`Manifest.update_cell` and friends) applies to the cell ``current``:
    always without ``if_held_by``, else only while the cell runs under that holder."""
    return if_held_by is None or (current["status"] == "running" and current["worker"] == if_held_by)


def ended_since(current: Mapping[str, Any], ended_before: str | None) -> bool:
    """Whether the ended cell ``current`` ended at or after ``ended_before`` (ISO 8601; None: never).
    A cell ended without ``completed_at`` (an older row) counts as ended long ago."""
    if ended_before is None or not current["completed_at"]:
        return False
    return _instant(current["completed_at"]) >= _instant(ended_before)


def _instant(text: str) -> datetime:
    found = datetime.fromisoformat(text)
    return found if found.tzinfo is not None else found.replace(tzinfo=timezone.utc)


def restarted_row(current: Mapping[str, Any], ended_before: str | None = None) -> dict[str, Any] | None:
    """The columns that make the cell ``current`` pending again without its outcome; None: it has not
    ended (pending, or running: its holder is the claims' business) or it ended since ``ended_before``."""
    if current["status"] not in FINAL_STATUSES or ended_since(current, ended_before):
        return None
    row: dict[str, Any] = {name: None for name in ATTEMPT_FIELDS if name in current}
    row["status"] = "pending"
    if current["session_id"] and current["session_status"] not in _GONE_SESSION_STATUSES:
        note = f"an earlier attempt's session {current['session_id']} was never seen released"
        row["notes"] = "; ".join(filter(None, [current["notes"], note]))
    return row


def merge_sessions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sessions from cell rows and attempt rows (each with its time under ``at``), once each, oldest first."""
    found: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["at"] or ""):
        entry = {key: value for key, value in row.items() if key != "at"}
        known = found.setdefault(entry["session_id"], entry)
        if known is not entry and entry["attempt"] is not None:
            known["attempt"] = entry["attempt"]  # the cell's session is also its last attempt
    return list(found.values())


def released_fields(session_status: str, released_by: str) -> dict[str, Any]:
    """The cell columns that say its session ended (``session_status``), found so by ``released_by``, now."""
    return Manifest._check_cell_fields({"session_status": session_status, "released_by": released_by,
                                        "session_released_at": utc_now()})


def end_released_attempt(store: Any, row_id: str, attempt: int | None, session_status: str) -> None:
    """After a release: end ``store``'s attempt ``attempt`` of the cell too, if it was ever recorded."""
    if attempt is None:
        return
    try:
        store.end_attempt(row_id, attempt, session_status=session_status)
    except KeyError:
        pass  # the attempt was never recorded: the cell row says it all
