"""Results out of the manifest: files (JSON, CSV) and uploads to GPU Shopper.

* :func:`export_results` writes the stored results of a run (or all runs) as a JSON
  list of BenchmarkResult objects, exactly as stored (``result_json``), or as CSV with
  one flattened row per result for spreadsheets and pandas: every registered figure
  (``output_tokens_per_second``, ``decode_tokens_per_second``, ``ttft_p99_ms``,
  ``goodput_share``, ... as docs/metrics.md names them), then the result's own fields
  (``hardware.gpu_name``, ``results.p95_latency_ms``, ...).
* :func:`upload_pending` POSTs every result whose upload was asked for and has not
  succeeded yet to ``/api/v1/benchmarks``, and records each outcome in the manifest
  (``uploaded`` with the server's id, or ``failed`` with the error), so a failed
  upload is retried by the next call and nothing is lost.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator, Mapping
from typing import IO, Any, NamedTuple

from pydantic import BaseModel

from ..cloud.shopper_client import ShopperClient
from ..errors import ApiError, GpubenchError
from ..figures import FIGURES, FigureSource, figure_values
from ..measure.results import BenchmarkResult
from .base import Store
from .postgres_store import TABLES, Table, quote
from .records import ResultRecord

__all__ = ["EXPORT_FORMATS", "UploadReport", "copy_store", "csv_columns", "export_results", "upload_pending"]

log = logging.getLogger("pytest_gpubench.store.export")

EXPORT_FORMATS = ("json", "csv")
_NESTED = ("hardware", "model", "test_config", "results", "gpu_stats")


def csv_columns() -> list[str]:
    """The CSV header: identity, the registered figures (:mod:`.figures`, one column each,
    named as everywhere else), the BenchmarkResult's nested groups flattened with dots,
    then provider, location and price."""
    columns = ["id", "run_id", "timestamp"]
    columns += [name for name in FIGURES if name not in columns]
    for group in _NESTED:
        model: type[BaseModel] = BenchmarkResult.model_fields[group].annotation  # type: ignore[assignment]
        columns += [f"{group}.{name}" for name in model.model_fields]
    return columns + ["provider", "location", "price_per_hour"]


def _csv_value(value: Any) -> Any:
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def _flatten(stored: ResultRecord, result: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {
        "id": result.get("id") or stored.id,
        "run_id": stored.run_id,
        "timestamp": result.get("timestamp"),
    }
    for group in _NESTED:
        values = result.get(group) or {}
        for key, value in values.items():
            flat[f"{group}.{key}"] = value
    for key in ("provider", "location", "price_per_hour"):
        flat[key] = result.get(key)
    for name, value in figure_values(FigureSource(result, stored.details, stored.run_id or "")).items():
        flat.setdefault(name, value)
    # The stored figure: NULL for an imported result whose price is unknown.
    flat["cost_per_million_tokens"] = stored.cost_per_million_tokens
    return flat


def _stored_results(store: Store, run_id: str | None) -> Iterator[tuple[ResultRecord, dict[str, Any]]]:
    for stored in store.results(run_id):
        if stored.result is None:
            log.warning("benchmark %s has no readable result_json; left out", stored.id)
            continue
        yield stored, stored.result


def export_results(store: Store, run_id: str | None = None, fmt: str = "json", out: IO[str] | None = None) -> int:
    """Write the results of run ``run_id`` (all runs when ``None``) to ``out``; returns how many.

    ``fmt="json"``: a JSON list of the stored BenchmarkResult objects, oldest first.
    ``fmt="csv"``: a header (:func:`csv_columns`, plus any field a newer version
    stored) and one row per result; lists are joined with ``;``, unknown values are
    empty. Another format is a ``ValueError``.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (allowed: {', '.join(EXPORT_FORMATS)})")
    if out is None:
        import sys

        out = sys.stdout
    stored = list(_stored_results(store, run_id))
    if fmt == "json":
        json.dump([result for _, result in stored], out, indent=2)
        out.write("\n")
        return len(stored)
    rows = [_flatten(record, result) for record, result in stored]
    columns = csv_columns()
    columns += sorted({key for flat in rows for key in flat} - set(columns))
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for flat in rows:
        writer.writerow({key: _csv_value(flat.get(key)) for key in columns})
    return len(rows)


class UploadReport(NamedTuple):
    """What :func:`upload_pending` did: benchmark ids uploaded, and failed ones with their errors."""

    uploaded: list[str]
    failed: dict[str, str]


def _remote_id(answer: Any) -> str | None:
    benchmark = answer.get("benchmark") if isinstance(answer, dict) else None
    remote = benchmark.get("id") if isinstance(benchmark, dict) else None
    return str(remote) if remote not in (None, "") else None


async def upload_result(store: Store, client: ShopperClient, benchmark_id: str) -> str | None:
    """POST one stored result right after its cell (``--gpubench-upload``); the error, or None.

    The result is marked ``pending`` first, so a failure leaves it for
    ``gpubench upload`` to retry; nothing is lost.
    """
    store.mark_upload(benchmark_id, status="pending")
    stored = store.result(benchmark_id)
    try:
        answer = await client.post_benchmark(stored.result if stored is not None else None)
    except Exception as exc:  # noqa: BLE001 - an upload failure must not fail the measurement
        error = str(exc) or type(exc).__name__
        store.mark_upload(benchmark_id, status="failed", error=error)
        return error
    store.mark_upload(benchmark_id, status="uploaded", remote_id=_remote_id(answer))
    return None


async def upload_pending(store: Store, client: ShopperClient, run_id: str | None = None) -> UploadReport:
    """POST each pending (or earlier failed) result of ``run_id`` (or all runs); never raises for one.

    Each is marked ``uploaded`` with the id from the answer ``{"benchmark": {"id"}}``,
    or ``failed`` with the error. When the server gives no usable answer at all (a
    connection error, a timeout, an answer that is not JSON) rather than an error
    status, the remaining results are marked failed with the same error instead of
    each waiting for its own timeout. Returns ``(uploaded, failed)``.
    """
    report = UploadReport([], {})
    pending = store.pending_uploads(run_id)
    unreachable: str | None = None
    for stored in pending:
        benchmark_id = stored.id
        if unreachable is not None:
            error = unreachable
        else:
            try:
                body = stored.result
                if body is None:
                    raise ValueError("the stored result is not a JSON object")
                answer = await client.post_benchmark(body)
            except ApiError as exc:  # the server refused this one result
                error = str(exc)
            except GpubenchError as exc:  # no usable answer: the server is unreachable
                error = unreachable = str(exc)
            except Exception as exc:  # noqa: BLE001 - one bad result must not stop the others
                error = f"{type(exc).__name__}: {exc}"
            else:
                store.mark_upload(benchmark_id, status="uploaded", remote_id=_remote_id(answer))
                report.uploaded.append(benchmark_id)
                continue
        store.mark_upload(benchmark_id, status="failed", error=error)
        report.failed[benchmark_id] = error
    return report


# --------------------------------------------------------------------------------------------------
# Store to store: every table (or one run's rows) copied as it is, SQLite <-> PostgreSQL.
#
# ``gpubench export --to LOCATION`` comes here. Both stores keep the same tables and
# columns (:mod:`.postgres_store` makes PostgreSQL's from :mod:`.schema`), so a row is
# copied column for column, in the order it was written. Copying is idempotent: a row
# with a primary key replaces the target's row of that key, and the rows of the tables
# without one (``requests``, ``gpu_samples``) replace the target's rows of the same cells,
# so copying twice leaves what copying once did.


#: Which rows of a table belong to run ``?``: the tables without a run_id reach it through their parent.
_OF_RUN = {
    "requests": "manifest_id IN (SELECT id FROM benchmark_manifest WHERE run_id = ?)",
    "gpu_samples": "manifest_id IN (SELECT id FROM benchmark_manifest WHERE run_id = ?)",
    "benchmark_runs": "benchmark_id IN (SELECT id FROM benchmarks WHERE run_id = ?)",
}


def _of_run(table: Table) -> str:
    return _OF_RUN.get(table.name, "run_id = ?")


def copy_store(source: Store, target: Store, run_id: str | None = None) -> dict[str, int]:
    """Copy every run of ``source`` (or run ``run_id``) into ``target``; rows copied per table.

    Leases of no run (``gpu_leases`` without ``run_id``) travel with a full copy only.
    """
    # Oldest first, so the target's rows are written in the source's order (the tie-break of "in the order added").
    runs = [run_id] if run_id is not None else list(reversed(source.run_ids()))
    copied = {table.name: 0 for table in TABLES}
    reader, writer = _tables(source), _tables(target)
    for run in runs:
        for table in TABLES:
            rows = reader.read(table, _of_run(table), [run])
            writer.write(table, rows, _of_run(table), [run])
            copied[table.name] += len(rows)
    if run_id is None:
        for table in TABLES:
            if "run_id" in table.columns and table.key:
                rows = reader.read(table, "run_id IS NULL", [])
                writer.write(table, rows, "run_id IS NULL", [])
                copied[table.name] += len(rows)
    return copied


class _Tables:
    """Reading and writing whole rows of a store's tables (what the Store protocol does not do)."""

    def read(self, table: Table, where: str, params: list[Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def write(self, table: Table, rows: list[dict[str, Any]], where: str, params: list[Any]) -> None:
        """Put ``rows`` in ``table``: keyed rows replace theirs; keyless tables lose their rows ``where`` first."""
        raise NotImplementedError


class _SqliteTables(_Tables):
    def __init__(self, store: Any) -> None:
        self.manifest = store.manifest

    def read(self, table: Table, where: str, params: list[Any]) -> list[dict[str, Any]]:
        db = self.manifest.db
        present = [name for name in table.columns if name in db.table(table.name).columns_dict]
        columns = ", ".join(quote(name) for name in present)
        sql = f"SELECT {columns} FROM {quote(table.name)} WHERE {where} ORDER BY rowid"
        return self.manifest._retry(lambda: [dict(zip(present, row, strict=True))
                                             for row in db.execute(sql, params).fetchall()])

    def write(self, table: Table, rows: list[dict[str, Any]], where: str, params: list[Any]) -> None:
        db = self.manifest.db

        def write() -> None:
            if not table.key:
                db.execute(f"DELETE FROM {quote(table.name)} WHERE {where}", params)
            if rows:
                db.table(table.name).insert_all(rows, replace=bool(table.key), alter=True)

        self.manifest._write(write)


class _PostgresTables(_Tables):
    def __init__(self, store: Any) -> None:
        self.store = store

    def read(self, table: Table, where: str, params: list[Any]) -> list[dict[str, Any]]:
        columns = ", ".join(quote(name) for name in table.columns)
        return self.store._select(f"SELECT {columns} FROM {quote(table.name)} WHERE {_pg(where)} ORDER BY rowid",
                                  params)

    def write(self, table: Table, rows: list[dict[str, Any]], where: str, params: list[Any]) -> None:
        conflict = ""
        if table.key:
            keys = ", ".join(quote(name) for name in table.key)
            others = [name for name in table.columns if name not in table.key]
            conflict = f"ON CONFLICT ({keys}) DO UPDATE SET " + ", ".join(
                f"{quote(name)} = EXCLUDED.{quote(name)}" for name in others)
        with self.store._transaction() as cursor:
            if not table.key:
                cursor.execute(f"DELETE FROM {quote(table.name)} WHERE {_pg(where)}", params)
            self.store._insert(cursor, table.name, [_complete(row, table.columns) for row in rows], conflict)


def _pg(where: str) -> str:
    """A condition written with SQLite's ``?`` placeholders, in psycopg's."""
    return where.replace("?", "%s")


def _complete(row: Mapping[str, Any], columns: Mapping[str, type]) -> dict[str, Any]:
    """Every column of the table, None where an older SQLite file had no such column."""
    return {name: row.get(name) for name in columns}


def _tables(store: Store) -> _Tables:
    from .sqlite_store import SqliteStore

    local = getattr(store, "local", store)  # a git store's rows are its local manifest's
    if isinstance(local, SqliteStore):
        return _SqliteTables(local)
    from .postgres_store import PostgresStore

    if isinstance(store, PostgresStore):
        return _PostgresTables(store)
    raise TypeError(f"cannot copy rows of a {type(store).__name__} store (SQLite and PostgreSQL only)")
