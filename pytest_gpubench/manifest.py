"""The manifest: every run, every cell's outcome, every result, in one SQLite file.

Tables (sqlite-utils creates them and adds columns a newer version needs):

* ``runs``: one row per pytest run.
* ``benchmark_manifest``: one row per matrix cell of a run, with seed 001's columns
  exactly, plus what this project learned to keep (offer, price and cost, the
  session's last API status, the worker, the progress file).
* ``benchmarks``: one row per result, the flattened ``PerformanceResults`` and the
  full ``BenchmarkResult`` JSON in ``result_json``.
* ``requests``: the per-request records behind each result.

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
import random
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from sqlite_utils.db import NotFoundError

from .errors import Stage
from .manifest_schema import (
    BENCHMARK_RUN_COLUMNS,
    CELL_STATUSES,
    FINAL_STATUSES,
    FIXED_COLUMNS,
    GPU_SAMPLE_COLUMNS,
    MANIFEST_COLUMNS,
    UPLOAD_COLUMNS,
    UPLOAD_STATUSES,
    create_schema,
)
from .results import BenchmarkResult, RequestRecord

__all__ = ["CELL_STATUSES", "FINAL_STATUSES", "UPLOAD_STATUSES", "Manifest"]

T = TypeVar("T")
_GONE_SESSION_STATUSES = ("stopped", "failed")
_SECRET_MARKERS = ("PRIVATE KEY", "-----BEGIN")
_BASELINE_STATUSES = ("success", "partial")


def utc_now() -> str:
    """The current time as the manifest stores it: ISO-8601, UTC, milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _refuse_secrets(row: Mapping[str, Any]) -> None:
    for key, value in row.items():
        if isinstance(value, str) and any(marker in value for marker in _SECRET_MARKERS):
            raise ValueError(f"refusing to store key material in the manifest (column {key})")


def _plain(value: Any) -> Any:
    """Enums as their value, paths as text: what SQLite can store."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


class Manifest:
    """The SQLite manifest at ``path``; one instance per process, shareable by threads.

    Opening creates the file, its parent directories and the schema as needed.
    ``busy_timeout`` is how long SQLite waits for another writer before reporting
    "database is locked"; ``retry_seconds`` how long a write keeps retrying after that.
    Row ids are ``f"{run_id}/{cell_id}"``; an unknown row id is a ``KeyError``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 30.0,
        retry_seconds: float = 120.0,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._retry_seconds = retry_seconds
        self._lock = threading.RLock()
        conn = sqlite3.connect(str(self.path), timeout=busy_timeout, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self.db.execute("PRAGMA foreign_keys = ON")
        # Changing the journal mode needs the file to itself for a moment.
        self._retry(self.db.enable_wal)
        # In WAL mode NORMAL is still crash-safe for the database; it only skips
        # an fsync per commit.
        self.db.execute("PRAGMA synchronous = NORMAL")
        self._write(lambda: create_schema(self.db))

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.db.close()

    def __enter__(self) -> Manifest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry(self, action: Callable[[], T]) -> T:
        deadline = time.monotonic() + self._retry_seconds
        delay = 0.005
        while True:
            try:
                with self._lock:
                    return action()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() >= deadline:
                    raise
            # Jitter keeps retrying workers from colliding again in lockstep.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)

    def _write(self, action: Callable[[], T]) -> T:
        """Run ``action`` in one ``BEGIN IMMEDIATE`` transaction, retried while locked."""

        def transaction() -> T:
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = action()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        return self._retry(transaction)

    def _cell_or_raise(self, row_id: str) -> dict[str, Any]:
        try:
            return self.db.table("benchmark_manifest").get(row_id)
        except NotFoundError:
            raise KeyError(f"no manifest row {row_id!r}") from None

    @staticmethod
    def _check_cell_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        unknown = [k for k in fields if k not in MANIFEST_COLUMNS or k in FIXED_COLUMNS]
        if unknown:
            raise ValueError(f"not updatable manifest columns: {', '.join(sorted(unknown))}")
        row = {key: _plain(value) for key, value in fields.items()}
        if "status" in row and row["status"] not in CELL_STATUSES:
            raise ValueError(
                f"manifest status must be one of {', '.join(CELL_STATUSES)}, got {row['status']!r}"
            )
        if row.get("failure_stage") is not None:
            row["failure_stage"] = Stage(row["failure_stage"]).value
        _refuse_secrets(row)
        return row

    def _update(self, row_id: str, row: dict[str, Any]) -> None:
        """Inside a transaction: apply ``row``; ``running`` stamps ``started_at`` once."""
        current = self._cell_or_raise(row_id)
        if row.get("status") == "running" and not current["started_at"]:
            row.setdefault("started_at", utc_now())
        if row:
            self.db.table("benchmark_manifest").update(row_id, row)

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str]) -> None:
        """Record that run ``run_id`` started; a second call (an xdist worker's) changes nothing."""
        row = {
            "run_id": run_id,
            "started_at": utc_now(),
            "argv": json.dumps(list(argv)),
            "matrix_files": json.dumps([str(f) for f in matrix_files]),
            "host": socket.gethostname(),
            "status": "running",
        }
        _refuse_secrets(row)
        self._write(lambda: self.db.table("runs").insert(row, ignore=True))

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
        if not run_id or not cell_id:
            raise ValueError("run_id and cell_id must not be empty")
        row_id = f"{run_id}/{cell_id}"
        row = {
            "id": row_id,
            "run_id": run_id,
            "created_at": utc_now(),
            "cell_id": cell_id,
            "gpu_type": gpu_type,
            "provider": provider,
            "model": model,
            "matrix_file": str(matrix_file),
            "status": "pending",
        }
        _refuse_secrets(row)
        self._write(lambda: self.db.table("benchmark_manifest").insert(row, ignore=True))
        return row_id

    def update_cell(self, row_id: str, **fields: Any) -> None:
        """Set manifest columns of ``row_id``; an unknown column or status is a ``ValueError``.

        The first change to ``running`` also sets ``started_at``.
        """
        row = self._check_cell_fields(fields)
        self._write(lambda: self._update(row_id, row))

    def record_session(
        self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
        price_per_hour: float, **fields: Any,
    ) -> None:
        """Record the session a cell rented, right after creating it and before using it.

        Also stamps ``session_started_at``, from which :meth:`finish_cell` computes
        ``cost_usd``. Extra ``fields`` (``session_status``, ``worker``, ...) are set too.
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
        self._write(lambda: self._update(row_id, row))

    def finish_cell(
        self,
        row_id: str,
        *,
        status: str,
        failure_stage: Stage | str | None = None,
        failure_reason: str | None = None,
        error_message: str | None = None,
        **fields: Any,
    ) -> None:
        """Record a cell's outcome: a final ``status`` and ``completed_at``.

        The failure columns are always written, so a success clears an earlier
        failure. Unless ``cost_usd`` is given, it is computed as ``price_per_hour``
        x the time since :meth:`record_session` (a lower bound if the session is
        released after this call).
        """
        if status not in FINAL_STATUSES:
            raise ValueError(f"a finished cell's status is one of {', '.join(FINAL_STATUSES)}")
        row = self._check_cell_fields(
            {
                "status": status,
                "failure_stage": failure_stage,
                "failure_reason": failure_reason,
                "error_message": error_message,
                **fields,
            }
        )

        def finish() -> None:
            now = datetime.now(timezone.utc)
            values = {**row, "completed_at": now.isoformat(timespec="milliseconds")}
            current = self._cell_or_raise(row_id)
            price = values.get("price_per_hour", current["price_per_hour"])
            started = current["session_started_at"]
            if "cost_usd" not in values and price is not None and started:
                hours = (now - datetime.fromisoformat(started)).total_seconds() / 3600
                values["cost_usd"] = price * max(hours, 0.0)
            self._update(row_id, values)

        self._write(finish)

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

    def _rows(self, table: str, run_id: str | None) -> list[dict[str, Any]]:
        where, params = ("run_id = ?", [run_id]) if run_id is not None else (None, None)
        return self._retry(
            lambda: list(
                self.db.table(table).rows_where(where, params, order_by="created_at, rowid")
            )
        )

    # ---------------------------------------------------------------- benchmarks

    def add_benchmark(
        self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = ()
    ) -> str:
        """Store ``result`` and its ``requests`` for cell ``row_id``; returns the benchmark id.

        The id is ``result.id`` when set, else a new UUID (written into
        ``result_json`` too). The manifest row gets the id and the headline figures in
        the same transaction. Storing a result with the same id again replaces it.
        """
        benchmark_id = result.id or str(uuid.uuid4())
        result = result.model_copy(update={"id": benchmark_id})
        figures = result.results
        cost = result.cost_analysis()
        benchmark_row = {
            "id": benchmark_id,
            "manifest_id": row_id,
            "gpu_name": result.hardware.gpu_name,
            "location": result.location,
            "price_per_hour": result.price_per_hour,
            "tokens_per_second": figures.avg_tokens_per_second,
            **figures.model_dump(),
            "cost_per_million_tokens": cost.cost_per_million_tokens,
            "result_json": result.model_dump_json(),
        }
        request_rows = [
            {"benchmark_id": benchmark_id, "manifest_id": row_id, **record.model_dump()}
            for record in requests
        ]
        _refuse_secrets(benchmark_row)
        for request_row in request_rows:
            _refuse_secrets(request_row)

        def store() -> None:
            cell = self._cell_or_raise(row_id)
            benchmark_row.update(
                run_id=cell["run_id"],
                created_at=utc_now(),
                gpu_type=cell["gpu_type"],
                provider=result.provider or cell["provider"],
                model=result.model.name or cell["model"],
            )
            self.db.execute("DELETE FROM requests WHERE benchmark_id = ?", [benchmark_id])
            # Storing a result again keeps its upload bookkeeping: an upload asked
            # for stays asked for, one done is not repeated.
            columns = ", ".join(UPLOAD_COLUMNS)
            kept = self.db.execute(
                f"SELECT {columns} FROM benchmarks WHERE id = ?", [benchmark_id]
            ).fetchone()
            if kept is not None:
                benchmark_row.update(zip(UPLOAD_COLUMNS, kept, strict=True))
            self.db.table("benchmarks").insert(benchmark_row, replace=True)
            if request_rows:
                self.db.table("requests").insert_all(request_rows)
            summary = {
                "benchmark_id": benchmark_id,
                "tokens_per_second": figures.avg_tokens_per_second,
                "total_requests": figures.total_requests,
                "error_count": figures.total_errors,
                "ttft_p50_ms": figures.p50_ttft_ms,
                "cost_per_million_tokens": cost.cost_per_million_tokens,
            }
            if cell["price_per_hour"] is None and result.price_per_hour:
                summary["price_per_hour"] = result.price_per_hour
            self.db.table("benchmark_manifest").update(row_id, summary)

        self._write(store)
        return benchmark_id

    def benchmarks(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Benchmark rows, of one run or all, oldest first (``result_json`` as text)."""
        return self._rows("benchmarks", run_id)

    def requests(self, benchmark_id: str) -> list[dict[str, Any]]:
        """The per-request rows of one benchmark, in request order."""
        return self._retry(
            lambda: list(
                self.db.table("requests").rows_where(
                    "benchmark_id = ?", [benchmark_id], order_by="\"index\""
                )
            )
        )

    def benchmark(self, benchmark_id: str) -> dict[str, Any] | None:
        """The benchmarks row ``benchmark_id``, or ``None``."""
        rows = self._retry(
            lambda: list(self.db.table("benchmarks").rows_where("id = ?", [benchmark_id]))
        )
        return rows[0] if rows else None

    def _benchmark_or_raise(self, benchmark_id: str) -> None:
        found = self.db.execute("SELECT 1 FROM benchmarks WHERE id = ?", [benchmark_id]).fetchone()
        if found is None:
            raise KeyError(f"no benchmark {benchmark_id!r}")

    # ----------------------------------------------------------- repeated runs

    def add_benchmark_runs(self, benchmark_id: str, runs: Iterable[Any]) -> int:
        """Store the repeated measurements behind benchmark ``benchmark_id``; returns how many.

        Each run is a mapping or an object (a pydantic model, a dataclass) with
        ``tokens_per_second``, ``ttft_p50_ms``, ``requests``, ``duration_seconds``,
        ``outlier`` and optionally ``run_index`` (default: its position). The runs
        stored before for that benchmark are replaced. An unknown benchmark is a
        ``KeyError``.
        """
        rows = []
        for position, run in enumerate(runs):
            row = _fields_of(run, [c for c in BENCHMARK_RUN_COLUMNS if c != "benchmark_id"])
            row["outlier"] = int(bool(row["outlier"]))
            if row["run_index"] is None:
                row["run_index"] = position
            rows.append({"benchmark_id": benchmark_id, **row})

        def store() -> None:
            self._benchmark_or_raise(benchmark_id)
            self.db.execute("DELETE FROM benchmark_runs WHERE benchmark_id = ?", [benchmark_id])
            if rows:
                self.db.table("benchmark_runs").insert_all(rows)

        self._write(store)
        return len(rows)

    def benchmark_runs(self, benchmark_id: str) -> list[dict[str, Any]]:
        """The repeated runs of one benchmark in run order, ``outlier`` as a bool."""
        rows = self._retry(
            lambda: list(
                self.db.table("benchmark_runs").rows_where(
                    "benchmark_id = ?", [benchmark_id], order_by="run_index"
                )
            )
        )
        return [{**row, "outlier": bool(row["outlier"])} for row in rows]

    # ------------------------------------------------------------ GPU telemetry

    def add_gpu_samples(self, row_id: str, benchmark_id: str | None, samples: Iterable[Any]) -> int:
        """Append GPU telemetry samples of cell ``row_id`` (and its benchmark, if known).

        ``samples`` are :class:`~pytest_gpubench.telemetry.GpuSample` objects or
        mappings with the same fields. Returns how many were stored; an unknown
        ``row_id`` is a ``KeyError``.
        """
        rows = []
        for sample in samples:
            names = [c for c in GPU_SAMPLE_COLUMNS if c not in ("benchmark_id", "manifest_id")]
            rows.append({"benchmark_id": benchmark_id, "manifest_id": row_id,
                         **_fields_of(sample, names)})

        def store() -> None:
            self._cell_or_raise(row_id)
            if rows:
                self.db.table("gpu_samples").insert_all(rows)

        self._write(store)
        return len(rows)

    def gpu_samples(
        self, benchmark_id: str | None = None, *, row_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Telemetry samples of one benchmark (or one cell), in time order, then by GPU."""
        if (benchmark_id is None) == (row_id is None):
            raise ValueError("give either benchmark_id or row_id")
        where, value = ("benchmark_id = ?", benchmark_id) if row_id is None else ("manifest_id = ?", row_id)
        return self._retry(
            lambda: list(
                self.db.table("gpu_samples").rows_where(where, [value], order_by="t, gpu, rowid")
            )
        )

    def set_details(self, benchmark_id: str, details: Mapping[str, Any]) -> None:
        """Store the figures beyond the BenchmarkResult shape, as JSON, on a benchmark row."""
        row = {"details_json": json.dumps(_plain(dict(details)), default=str)}
        self._update_row("benchmarks", benchmark_id, row)

    def _update_row(self, table: str, key: str, row: dict[str, Any]) -> None:
        """Update one row by primary key in its own transaction; KeyError if it is not there."""
        _refuse_secrets(row)

        def update() -> None:
            try:
                self.db.table(table).update(key, row)
            except NotFoundError:
                raise KeyError(f"no {table} row {key!r}") from None

        self._write(update)

    # ------------------------------------------------------------------ uploads

    def mark_upload(
        self,
        benchmark_id: str,
        *,
        status: str,
        remote_id: str | None = None,
        error: str | None = None,
    ) -> None:
        """Record the upload state of one result: ``pending``, ``uploaded`` or ``failed``.

        ``uploaded`` stamps ``uploaded_at`` and keeps ``remote_id`` (the server's id);
        ``failed`` keeps ``error``; ``pending`` (asked for, not tried yet) clears both.
        An unknown benchmark is a ``KeyError``; another status a ``ValueError``.
        """
        if status not in UPLOAD_STATUSES:
            raise ValueError(f"upload status must be one of {', '.join(UPLOAD_STATUSES)}, got {status!r}")
        row: dict[str, Any] = {"upload_status": status, "upload_error": None}
        if status == "uploaded":
            row.update(remote_id=remote_id, uploaded_at=utc_now())
        elif status == "failed":
            text = (error or "unknown error").strip()
            # An error text is never allowed to smuggle key material into the file.
            if any(marker in text for marker in _SECRET_MARKERS):
                text = "upload failed (message withheld: it quoted key material)"
            row["upload_error"] = text[:2000]

        def update() -> None:
            try:
                self.db.table("benchmarks").update(benchmark_id, row)
            except NotFoundError:
                raise KeyError(f"no benchmark {benchmark_id!r}") from None

        self._write(update)

    def request_uploads(self, run_id: str | None = None) -> int:
        """Mark the results (of one run, or all) never asked to be uploaded as ``pending``.

        Results already pending, uploaded or failed keep their state. Returns how
        many were marked.
        """
        where = "upload_status IS NULL"
        params: list[Any] = []
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)

        def update() -> int:
            cursor = self.db.execute(
                f"UPDATE benchmarks SET upload_status = 'pending' WHERE {where}", params
            )
            return cursor.rowcount

        return self._write(update)

    def pending_uploads(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Results whose upload was asked for and has not succeeded (``pending`` or ``failed``).

        Oldest first, of one run or all; ``result_json`` is what to POST.
        """
        where = "upload_status IN ('pending', 'failed')"
        params: list[Any] = []
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)
        return self._retry(
            lambda: list(
                self.db.table("benchmarks").rows_where(where, params, order_by="created_at, rowid")
            )
        )

    # ----------------------------------------------------------------- baseline

    def run_ids(self) -> list[str]:
        """Every run the manifest knows (from ``runs`` or its cells), most recent first."""
        sql = """
            SELECT run_id FROM (
                SELECT run_id, started_at AS at FROM runs
                UNION ALL
                SELECT run_id, MIN(created_at) AS at FROM benchmark_manifest
                WHERE run_id NOT IN (SELECT run_id FROM runs) GROUP BY run_id
            ) ORDER BY at DESC
        """
        return self._retry(lambda: [row[0] for row in self.db.execute(sql).fetchall()])

    def baseline(
        self, record_key: str, run_id: str | None = "last", exclude_run: str | None = None
    ) -> dict[str, Any] | None:
        """The result to compare cell ``record_key`` with, or ``None`` when there is none.

        ``run_id`` names the baseline run; ``"last"`` (or ``None``) means the most
        recent run, other than ``exclude_run`` (the current one), in which that cell
        ended ``success`` or ``partial`` with figures. The answer is that cell's
        manifest row, with its benchmarks row (or ``None`` for a manifest from
        before benchmarks were stored) under ``"benchmark"``.
        """
        statuses = ", ".join("?" * len(_BASELINE_STATUSES))
        where = [
            "m.cell_id = ?",
            f"m.status IN ({statuses})",
            "(m.benchmark_id IS NOT NULL OR m.tokens_per_second IS NOT NULL)",
        ]
        params: list[Any] = [record_key, *_BASELINE_STATUSES]
        if run_id not in (None, "last"):
            where.append("m.run_id = ?")
            params.append(run_id)
        if exclude_run is not None:
            where.append("m.run_id != ?")
            params.append(exclude_run)
        sql = f"""
            SELECT m.id FROM benchmark_manifest m LEFT JOIN runs r ON r.run_id = m.run_id
            WHERE {' AND '.join(where)}
            ORDER BY COALESCE(r.started_at, m.created_at) DESC,
                     COALESCE(m.completed_at, m.created_at) DESC, m.rowid DESC
            LIMIT 1
        """

        def query() -> dict[str, Any] | None:
            found = self.db.execute(sql, params).fetchone()
            if found is None:
                return None
            row = self.db.table("benchmark_manifest").get(found[0])
            benchmark = None
            if row["benchmark_id"]:
                rows = list(self.db.table("benchmarks").rows_where("id = ?", [row["benchmark_id"]]))
                benchmark = rows[0] if rows else None
            return {**row, "benchmark": benchmark}

        return self._retry(query)


def _fields_of(item: Any, names: Iterable[str]) -> dict[str, Any]:
    """Fields ``names`` of a mapping or an object with attributes; absent ones are ``None``."""
    if isinstance(item, Mapping):
        return {name: item.get(name) for name in names}
    return {name: getattr(item, name, None) for name in names}
