"""Store to store: every table (or one run's rows) copied as it is, SQLite <-> PostgreSQL.

``gpubench export --to LOCATION`` comes here. Both stores keep the same tables and
columns (:mod:`.postgres_schema` makes PostgreSQL's from :mod:`.schema`), so a row is
copied column for column, in the order it was written. Copying is idempotent: a row
with a primary key replaces the target's row of that key, and the rows of the tables
without one (``requests``, ``gpu_samples``) replace the target's rows of the same cells,
so copying twice leaves what copying once did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Store
from .postgres_schema import TABLES, Table, quote

__all__ = ["copy_store"]

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
