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
* ``benchmark_runs`` and ``gpu_samples``: a result's repeated runs and GPU telemetry.
* ``gpu_leases``: one row per leased GPU; a claim reads the busy ones and inserts its rows in
  one ``BEGIN IMMEDIATE`` transaction, so two processes never both get one GPU.
* ``microbench_figures`` and ``systems``: a microbenchmark cell's figures, and what system
  detection found, once per session of a run.

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
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlite_utils.db import NotFoundError

from ..cloud.gpu_leasing import GpuLease
from ..cloud.processes import ProcessIdentity
from ..errors import Stage, current_stage_name, redact
from ..figures import output_tokens_per_second
from ..measure.microbench import MicrobenchRun
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from ..remote.sysinfo import SystemInfo
from .records import row_id as row_id_of
from .records import system_row
from .schema import (
    ATTEMPT_COLUMNS,
    ATTEMPT_STATUSES,
    BENCHMARK_RUN_COLUMNS,
    CELL_STATUSES,
    FINAL_STATUSES,
    FIXED_COLUMNS,
    GPU_LEASES_TABLE,
    GPU_SAMPLE_COLUMNS,
    MANIFEST_COLUMNS,
    UPLOAD_COLUMNS,
    UPLOAD_STATUSES,
)
from .sqlite import SECRET_MARKERS, ManifestStore, plain, refuse_secrets, utc_now

__all__ = ["CELL_STATUSES", "FINAL_STATUSES", "Manifest", "UPLOAD_STATUSES"]


_BASELINE_STATUSES = ("success", "partial")


def _fields_of(item: Any, names: Iterable[str]) -> dict[str, Any]:
    """Fields ``names`` of a mapping or an object with attributes; absent ones are ``None``."""
    if isinstance(item, Mapping):
        return {name: item.get(name) for name in names}
    return {name: getattr(item, name, None) for name in names}


# ------------------------------------------------- rows, the same for every store
# What the result tables get, decided without a database, so the PostgreSQL store
# (postgres_store.py) writes exactly the same rows.


@dataclass
class ResultRows:
    """A result's ``benchmarks`` row and ``requests`` rows, before the cell is read."""

    benchmark: dict[str, Any]
    requests: list[dict[str, Any]]
    #: The figures the cell's row gets (:meth:`summary`).
    headline: dict[str, Any]
    price_per_hour: float | None
    #: The result's own provider and model, which win over the cell's when set.
    provider: str | None
    model: str | None

    def for_cell(self, cell: Mapping[str, Any]) -> dict[str, Any]:
        """The benchmarks row completed from the cell's row (run, GPU type, provider, model, time)."""
        self.benchmark.update(
            run_id=cell["run_id"], created_at=utc_now(), gpu_type=cell["gpu_type"],
            provider=self.provider or cell["provider"], model=self.model or cell["model"])
        return self.benchmark

    def summary(self, cell: Mapping[str, Any]) -> dict[str, Any]:
        """What the cell's row gets: the result's id and headline figures (and its price, when it had none)."""
        summary = dict(self.headline)
        if cell["price_per_hour"] is None and self.price_per_hour:
            summary["price_per_hour"] = self.price_per_hour
        return summary


def benchmark_rows(row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> ResultRows:
    """The rows that store ``result`` (id: ``result.id`` or a new UUID) for cell ``row_id``.

    ``unpriced``: its price is not known (an imported file states none), so its cost
    per token is unknown (NULL), not the 0 a price of 0 would give.
    """
    benchmark_id = result.id or str(uuid.uuid4())
    result = result.model_copy(update={"id": benchmark_id})
    figures = result.results
    cost = result.cost_analysis()
    if unpriced:
        cost = cost.model_copy(update={"cost_per_million_tokens": None})
    benchmark_row = {
        "id": benchmark_id,
        "manifest_id": row_id,
        "gpu_name": result.hardware.gpu_name,
        "location": result.location,
        "price_per_hour": result.price_per_hour,
        "decode_tokens_per_second": figures.avg_tokens_per_second or None,
        "output_tokens_per_second": output_tokens_per_second(figures.model_dump()),
        **figures.model_dump(),
        "cost_per_million_tokens": cost.cost_per_million_tokens,
        "result_json": result.model_dump_json(),
    }
    request_rows = [{"benchmark_id": benchmark_id, "manifest_id": row_id, **record.model_dump()}
                    for record in requests]
    refuse_secrets(benchmark_row)
    for request_row in request_rows:
        refuse_secrets(request_row)
    headline = {
        "benchmark_id": benchmark_id,
        "decode_tokens_per_second": benchmark_row["decode_tokens_per_second"],
        "output_tokens_per_second": benchmark_row["output_tokens_per_second"],
        "total_requests": figures.total_requests,
        "error_count": figures.total_errors,
        "ttft_p50_ms": figures.p50_ttft_ms,
        "cost_per_million_tokens": cost.cost_per_million_tokens,
    }
    return ResultRows(benchmark_row, request_rows, headline, result.price_per_hour, result.provider,
                      result.model.name)


def repeat_rows(benchmark_id: str, runs: Iterable[Any]) -> list[dict[str, Any]]:
    """The ``benchmark_runs`` rows of ``runs`` (mappings or objects; ``run_index`` defaults to the position)."""
    rows = []
    for position, run in enumerate(runs):
        row = _fields_of(run, [c for c in BENCHMARK_RUN_COLUMNS if c != "benchmark_id"])
        row["outlier"] = int(bool(row["outlier"]))
        if row["run_index"] is None:
            row["run_index"] = position
        rows.append({"benchmark_id": benchmark_id, **row})
    return rows


def sample_rows(row_id: str, benchmark_id: str | None, samples: Iterable[Any]) -> list[dict[str, Any]]:
    """The ``gpu_samples`` rows of ``samples`` (GpuSample objects or mappings) of cell ``row_id``."""
    names = [c for c in GPU_SAMPLE_COLUMNS if c not in ("benchmark_id", "manifest_id")]
    return [{"benchmark_id": benchmark_id, "manifest_id": row_id, **_fields_of(sample, names)}
            for sample in samples]


def details_row(details: Mapping[str, Any]) -> dict[str, Any]:
    """The columns that keep a result's ``details`` (JSON, and its workload fingerprint beside it)."""
    row = {"details_json": json.dumps(plain(dict(details)), default=str)}
    fingerprint = details.get("fingerprint")
    if isinstance(fingerprint, Mapping) and fingerprint.get("hash"):
        row["workload_fingerprint"] = str(fingerprint["hash"])  # queryable beside the JSON
    return row


def upload_row(*, status: str, remote_id: str | None = None, error: str | None = None) -> dict[str, Any]:
    """The upload columns of a result in state ``status``; another status is a ``ValueError``."""
    if status not in UPLOAD_STATUSES:
        raise ValueError(f"upload status must be one of {', '.join(UPLOAD_STATUSES)}, got {status!r}")
    row: dict[str, Any] = {"upload_status": status, "upload_error": None}
    if status == "uploaded":
        row.update(remote_id=remote_id, uploaded_at=utc_now())
    elif status == "failed":
        text = (error or "unknown error").strip()
        # An error text is never allowed to smuggle key material into the file.
        if any(marker in text for marker in SECRET_MARKERS):
            text = "upload failed (message withheld: it quoted key material)"
        row["upload_error"] = text[:2000]
    return row


def baseline_where(record_key: str, run_id: str | None, exclude_run: str | None) -> tuple[list[str], list[Any]]:
    """The conditions (``?`` placeholders, on ``benchmark_manifest m``) a baseline of ``record_key`` meets."""
    statuses = ", ".join("?" * len(_BASELINE_STATUSES))
    where = [
        "m.cell_id = ?",
        f"m.status IN ({statuses})",
        "(m.benchmark_id IS NOT NULL OR m.decode_tokens_per_second IS NOT NULL"
        " OR m.output_tokens_per_second IS NOT NULL)",
    ]
    params: list[Any] = [record_key, *_BASELINE_STATUSES]
    if run_id not in (None, "last"):
        where.append("m.run_id = ?")
        params.append(run_id)
    if exclude_run is not None:
        where.append("m.run_id != ?")
        params.append(exclude_run)
    return where, params


def check_attempt_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt's columns to write, checked: an unknown or fixed column, or an unknown status, is a
    ``ValueError``; nothing that looks like a secret."""
    fixed = {"manifest_id", "attempt", "run_id", "started_at", "ended_at"}
    unknown = [k for k in fields if k not in ATTEMPT_COLUMNS or k in fixed]
    if unknown:
        raise ValueError(f"not updatable attempts columns: {', '.join(sorted(unknown))}")
    row = {key: plain(value) for key, value in fields.items()}
    if "status" in row and row["status"] not in ATTEMPT_STATUSES:
        raise ValueError(f"attempt status must be one of {', '.join(ATTEMPT_STATUSES)}, got {row['status']!r}")
    if row.get("stage") is not None:
        row["stage"] = Stage(current_stage_name(row["stage"])).value  # an older name: today's
    if row.get("machine_id") is not None:
        row["machine_id"] = str(row["machine_id"])
    refuse_secrets(row)
    return row


def ended(row: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` of the attempt ``current`` ending now: ``ended_at``, and unless given ``cost_usd``:
    ``price_per_hour`` x the time since ``session_started_at`` (0 when no session was created)."""
    now = datetime.now(timezone.utc)
    values = {**row, "ended_at": now.isoformat(timespec="milliseconds")}
    if "cost_usd" not in values:
        started, price = current["session_started_at"], current["price_per_hour"]
        hours = (now - datetime.fromisoformat(started)).total_seconds() / 3600 if started else 0.0
        values["cost_usd"] = (price or 0.0) * max(hours, 0.0)
    return values


TABLE = GPU_LEASES_TABLE


def lease_rows(machine: str, gpus: Sequence[int], count: int, busy: set[int], *, holder: str, ttl: float,
               run_id: str | None, moment: float) -> list[dict[str, Any]] | None:
    """The rows of a new lease on the ``count`` lowest of ``gpus`` not ``busy``; None when fewer are free."""
    free = [index for index in sorted(set(gpus)) if index not in busy]
    if len(free) < count:
        return None
    lease_id = uuid.uuid4().hex[:16]
    return [{"lease_id": lease_id, "machine": machine, "gpu_index": index, "holder": holder,
             "run_id": run_id, "acquired_at": moment, "expires_at": moment + ttl} for index in free[:count]]


def _lease(rows: list[dict[str, Any]]) -> GpuLease:
    first = rows[0]
    return GpuLease(lease_id=first["lease_id"], machine=first["machine"],
                    gpu_indices=tuple(sorted(row["gpu_index"] for row in rows)), holder=first["holder"],
                    run_id=first.get("run_id"), acquired_at=first["acquired_at"], expires_at=first["expires_at"],
                    released_at=first.get("released_at"))


def _row(cell: dict[str, Any], created: str, run: MicrobenchRun, figure: Any) -> dict[str, Any]:
    stats = figure.stats
    return {
        "manifest_id": cell["id"], "run_id": cell["run_id"], "created_at": created, "gpu_type": cell["gpu_type"],
        "provider": cell["provider"], "label": figure.label, "kind": figure.kind, "precision": figure.precision,
        "unit": figure.unit, "value": figure.value, "std": stats.std if stats else None,
        "cv": stats.cv if stats else None, "n": stats.n if stats else 0,
        "ci_low": stats.ci_low if stats else None, "ci_high": stats.ci_high if stats else None,
        "values_json": json.dumps(list(stats.values)) if stats else "[]", "skipped": figure.skipped,
        "device": run.device, "capability": run.capability, "torch_version": run.torch_version,
    }


# "not_found": the API has no such session (any more); recorded by cleanup.
GONE_SESSION_STATUSES = _GONE_SESSION_STATUSES = ("stopped", "failed", "not_found")


class Manifest(ManifestStore):
    """The SQLite manifest at ``path``; one instance per process, shareable by threads.

    Opening creates the file, its parent directories and the schema as needed.
    ``busy_timeout`` is how long SQLite waits for another writer before reporting
    "database is locked"; ``retry_seconds`` how long a write keeps retrying after that.
    Row ids are ``f"{run_id}/{cell_id}"``; an unknown row id is a ``KeyError``.
    One class for every table (results, attempts, GPU leases, microbenchmark figures,
    systems, runs and cells); the SQLite plumbing is :class:`~.sqlite.ManifestStore`'s, the
    rows each table is written with are the plain functions of this module.
    """

    # ------------------------------------------------------------ results

    def add_benchmark(
        self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
        *, unpriced: bool = False,
    ) -> str:
        """Store ``result`` and its ``requests`` for cell ``row_id``; returns the benchmark id.

        The id is ``result.id`` when set, else a new UUID (written into
        ``result_json`` too). The manifest row gets the id and the headline figures in
        the same transaction. Storing a result with the same id again replaces it.
        ``unpriced``: its price is not known (an imported file states none), so its
        cost per token is unknown (NULL), not the 0 a price of 0 would give.
        """
        rows = benchmark_rows(row_id, result, requests, unpriced=unpriced)
        benchmark_id = rows.benchmark["id"]

        def store() -> None:
            cell = self._cell_or_raise(row_id)
            benchmark_row = rows.for_cell(cell)
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
            if rows.requests:
                self.db.table("requests").insert_all(rows.requests)
            self.db.table("benchmark_manifest").update(row_id, rows.summary(cell))

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

    def known_result(self, identity: str) -> dict[str, Any] | None:
        """The benchmarks row stored as ``identity`` or uploaded as it (``remote_id``), or ``None``.

        What ``gpubench import`` checks so a result already here, measured or
        imported, is never stored twice.
        """
        sql = "SELECT id FROM benchmarks WHERE id = ? OR remote_id = ? ORDER BY id != ? LIMIT 1"
        found = self._retry(lambda: self.db.execute(sql, [identity, identity, identity]).fetchone())
        return self.benchmark(found[0]) if found else None

    def _benchmark_or_raise(self, benchmark_id: str) -> None:
        found = self.db.execute("SELECT 1 FROM benchmarks WHERE id = ?", [benchmark_id]).fetchone()
        if found is None:
            raise KeyError(f"no benchmark {benchmark_id!r}")

    # ----------------------------------------------------------- repeated runs

    def add_benchmark_runs(self, benchmark_id: str, runs: Iterable[Any]) -> int:
        """Store the repeated measurements behind benchmark ``benchmark_id``; returns how many.

        Each run is a mapping or an object (a pydantic model, a dataclass) with
        ``decode_tokens_per_second``, ``output_tokens_per_second``, ``ttft_p50_ms``,
        ``requests``, ``duration_seconds``, ``outlier`` and optionally ``run_index``
        (default: its position). The runs
        stored before for that benchmark are replaced. An unknown benchmark is a
        ``KeyError``.
        """
        rows = repeat_rows(benchmark_id, runs)

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

        ``samples`` are :class:`~pytest_gpubench.remote.telemetry.GpuSample` objects or
        mappings with the same fields. Returns how many were stored; an unknown
        ``row_id`` is a ``KeyError``.
        """
        rows = sample_rows(row_id, benchmark_id, samples)

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
        row = details_row(details)
        self._update_row("benchmarks", benchmark_id, row)

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
        row = upload_row(status=status, remote_id=remote_id, error=error)

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
                SELECT run_id, started_at AS at, rowid AS seq FROM runs
                UNION ALL
                SELECT run_id, MIN(created_at) AS at, MIN(rowid) AS seq FROM benchmark_manifest
                WHERE run_id NOT IN (SELECT run_id FROM runs) GROUP BY run_id
            ) ORDER BY at DESC, seq DESC
        """  # runs started in the same millisecond: the later row first
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
        where, params = baseline_where(record_key, run_id, exclude_run)
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

    # ------------------------------------------------------------ attempts

    def start_attempt(
        self,
        row_id: str,
        attempt: int,
        *,
        admit: Callable[[list[dict[str, Any]]], str | None] | None = None,
        counted_as: int | None = None,
        **fields: Any,
    ) -> str | None:
        """Record that cell ``row_id`` starts provisioning attempt ``attempt`` (1, 2, ...).

        ``admit``, when given, is called inside the same write transaction with every
        attempt row of the cell's run (all workers'), and returns ``None`` to go ahead
        or a reason to refuse; a refused attempt writes nothing and the reason is
        returned. The write lock is held from that read to the insert, so two
        processes cannot both take the last dollar of a budget. The cell's
        ``attempts`` column becomes ``counted_as`` (default ``attempt``: a cell run
        again with ``--gpubench-resume`` numbers on after its earlier rows, but
        counts this run's). ``fields`` are attempts columns (``offer_id``,
        ``price_per_hour``, ``expected_seconds``, ...).
        """
        row = self._check_attempt_fields({"status": "provisioning", **fields})

        def start() -> str | None:
            cell = self._cell_or_raise(row_id)
            if admit is not None:
                reason = admit(list(self.db.table("attempts").rows_where("run_id = ?", [cell["run_id"]])))
                if reason:
                    return reason
            self.db.table("attempts").insert(
                {**row, "manifest_id": row_id, "attempt": attempt, "run_id": cell["run_id"],
                 "started_at": utc_now()},
                replace=True,
            )
            self.db.table("benchmark_manifest").update(row_id, {"attempts": counted_as or attempt})
            return None

        return self._write(start)

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """Set attempts columns of one attempt; ``session_id`` also stamps ``session_started_at``."""
        row = self._check_attempt_fields(fields)
        if "session_id" in row and "session_started_at" not in row:
            row["session_started_at"] = utc_now()
        self._update_row("attempts", (row_id, attempt), row)

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """The attempt's session is released (or never existed): stamp ``ended_at`` and its cost.

        Unless given, ``cost_usd`` is ``price_per_hour`` x the time since
        ``session_started_at`` (0 when no session was created). Ending twice keeps
        the first end.
        """
        row = self._check_attempt_fields(fields)

        def end() -> None:
            found = list(self.db.table("attempts").rows_where(
                "manifest_id = ? AND attempt = ?", [row_id, attempt]))
            if not found:
                raise KeyError(f"no attempt {attempt} of {row_id!r}")
            current = found[0]
            if current["ended_at"]:
                return
            values = ended(row, current)
            self.db.table("attempts").update((row_id, attempt), values)

        self._write(end)

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[dict[str, Any]]:
        """Attempt rows of one cell (``row_id``), one run, or all, in order."""
        where, params = None, None
        if row_id is not None:
            where, params = "manifest_id = ?", [row_id]
        elif run_id is not None:
            where, params = "run_id = ?", [run_id]
        return self._retry(lambda: list(
            self.db.table("attempts").rows_where(where, params, order_by="started_at, manifest_id, attempt")))

    @staticmethod
    def _check_attempt_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        return check_attempt_fields(fields)

    # ------------------------------------------------------------ GPU leases

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        if count < 1:
            raise ValueError(f"a lease needs at least one GPU, not {count}")

        def claim() -> GpuLease | None:
            moment = time.time() if now is None else now
            busy = {row[0] for row in self.db.execute(
                f"SELECT gpu_index FROM {TABLE} WHERE machine = ? AND released_at IS NULL AND expires_at > ?",
                [machine, moment]).fetchall()}
            rows = lease_rows(machine, gpus, count, busy, holder=holder, ttl=ttl, run_id=run_id, moment=moment)
            if rows is None:
                return None
            self.db.table(TABLE).insert_all(rows)
            return _lease(rows)

        return self._write(claim)

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        def renew() -> bool:
            moment = time.time() if now is None else now
            cursor = self.db.execute(
                f"UPDATE {TABLE} SET expires_at = ? WHERE lease_id = ? AND released_at IS NULL AND expires_at > ?",
                [moment + ttl, lease_id, moment])
            return cursor.rowcount > 0

        return self._write(renew)

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        def release() -> None:
            moment = time.time() if now is None else now
            # An expired lease keeps its expiry as its end: it stopped holding then, not now.
            self.db.execute(f"UPDATE {TABLE} SET released_at = MIN(?, expires_at) "
                            "WHERE lease_id = ? AND released_at IS NULL", [moment, lease_id])

        self._write(release)

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        where, params = ("machine = ?", [machine]) if machine is not None else (None, None)
        rows = self._retry(lambda: list(self.db.table(TABLE).rows_where(
            where, params, order_by="acquired_at, lease_id, gpu_index")))
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["lease_id"], []).append(row)
        leases = [_lease(group) for group in grouped.values()]
        return [lease for lease in leases if active_at is None or lease.active(active_at)]

    # ------------------------------------------------------------ microbench

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        """Store ``run``'s figures for cell ``row_id``, replacing any stored before; how many."""
        created = utc_now()

        def store() -> int:
            cell = self._cell_or_raise(row_id)
            rows = [_row(cell, created, run, figure) for figure in run.figures]
            table = self.db.table("microbench_figures")
            table.delete_where("manifest_id = ?", [row_id])
            if rows:
                table.insert_all(rows)
            return len(rows)

        return self._write(store)

    def microbench_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The figures of one run (or all), in the order they were stored."""
        return self._rows("microbench_figures", run_id)

    # ------------------------------------------------------------ systems

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        """Store ``system``, detected by cell ``row_id`` on ``session_id`` on ``machine`` (replacing the
        session's row)."""
        recorded = utc_now()

        def write() -> None:
            row = system_row(self._cell_or_raise(row_id), session_id, system, recorded, machine)
            self.db.table("systems").insert(row, replace=True, alter=True)  # alter: a file from before `machine`

        self._write(write)

    def system_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The systems of one run (or all), in the order they were recorded."""
        where, params = ("run_id = ?", [run_id]) if run_id is not None else (None, None)
        return self._retry(lambda: list(self.db.table("systems").rows_where(
            where, params, order_by="recorded_at, rowid")))


    @staticmethod
    def _check_cell_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        return check_cell_fields(fields)

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


def check_cell_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's columns to write, checked: an unknown or fixed column, or an unknown status, is a
    ``ValueError``; a failure stage is its value; nothing that looks like a secret."""
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
        "id": row_id_of(run_id, cell_id),
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
