"""The manifest's result tables: benchmarks and their requests, repeated runs, GPU
samples, details, upload bookkeeping and the baseline a comparison reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlite_utils.db import NotFoundError

from ..figures import output_tokens_per_second
from .schema import BENCHMARK_RUN_COLUMNS, GPU_SAMPLE_COLUMNS, UPLOAD_COLUMNS, UPLOAD_STATUSES
from .sqlite import SECRET_MARKERS, ManifestStore, plain, refuse_secrets, utc_now
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord

_BASELINE_STATUSES = ("success", "partial")


class ResultsMixin(ManifestStore):
    """Results of cells; the cell rows themselves are :class:`~.manifest.Manifest`'s."""

    # ---------------------------------------------------------------- benchmarks

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
