"""The PostgreSQL store's tables, made from the SQLite manifest's columns, and its migrations.

Every table has the columns of :mod:`.schema` (``str`` -> ``TEXT``, ``int`` -> ``BIGINT``,
``float`` -> ``DOUBLE PRECISION``), the same primary keys and NOT NULLs, so a row reads
into a record with the same code (:mod:`.row_records`) and ``gpubench export`` copies
column for column. One column more, ``rowid`` (``BIGSERIAL``), stands for SQLite's
implicit one: the order rows were written in, which "in the order added" means.

Migrations are versioned in ``gpubench_schema_migrations(version, applied_at,
description)``; :func:`migrate` applies the missing ones in one transaction under a
transaction-scoped advisory lock, so N controllers connecting at once migrate once and
the others find it done. A database a newer pytest-gpubench migrated is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, NamedTuple

from ..errors import ManifestTooNew
from .schema import (
    ATTEMPT_COLUMNS,
    BENCHMARK_COLUMNS,
    BENCHMARK_RUN_COLUMNS,
    GPU_LEASE_COLUMNS,
    GPU_LEASES_TABLE,
    GPU_SAMPLE_COLUMNS,
    MANIFEST_COLUMNS,
    MICROBENCH_COLUMNS,
    REQUEST_COLUMNS,
    RUN_COLUMNS,
)
from .systems import SYSTEM_COLUMNS

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "TABLES", "Migration", "Table", "migrate", "quote", "schema_version"]

MIGRATIONS_TABLE = "gpubench_schema_migrations"
#: The advisory lock migrations are applied under (any constant; "gpubench" in ASCII).
_MIGRATION_LOCK = 0x6770_7562_656E_6368

_SQL_TYPES = {str: "TEXT", int: "BIGINT", float: "DOUBLE PRECISION"}


class Table(NamedTuple):
    """One table: its columns (name -> Python type), primary key, NOT NULL columns, indexed columns."""

    name: str
    columns: Mapping[str, type]
    key: tuple[str, ...]
    not_null: frozenset[str]
    indexed: tuple[str, ...] = ()


#: The tables, parents before children (the order ``gpubench export`` copies in).
TABLES: tuple[Table, ...] = (
    Table("runs", RUN_COLUMNS, ("run_id",), frozenset({"run_id"})),
    Table("benchmark_manifest", MANIFEST_COLUMNS, ("id",),
          frozenset({"id", "run_id", "created_at", "gpu_type", "provider", "model", "status"}),
          ("run_id", "status", "session_id", "cell_id")),
    Table("benchmarks", BENCHMARK_COLUMNS, ("id",), frozenset({"id", "manifest_id"}),
          ("run_id", "manifest_id", "upload_status")),
    Table("requests", REQUEST_COLUMNS, (), frozenset({"benchmark_id"}), ("benchmark_id",)),
    Table("gpu_samples", GPU_SAMPLE_COLUMNS, (), frozenset({"manifest_id", "t", "gpu"}),
          ("benchmark_id", "manifest_id")),
    Table("benchmark_runs", BENCHMARK_RUN_COLUMNS, ("benchmark_id", "run_index"),
          frozenset({"benchmark_id", "run_index"})),
    Table("attempts", ATTEMPT_COLUMNS, ("manifest_id", "attempt"),
          frozenset({"manifest_id", "attempt", "run_id", "status", "started_at"}), ("run_id", "session_id")),
    Table("systems", SYSTEM_COLUMNS, ("run_id", "session_id"),
          frozenset({"run_id", "session_id", "manifest_id", "system_json"})),
    Table("microbench_figures", MICROBENCH_COLUMNS, ("manifest_id", "label"),
          frozenset({"manifest_id", "label", "kind"}), ("run_id",)),
    Table(GPU_LEASES_TABLE, GPU_LEASE_COLUMNS, ("lease_id", "gpu_index"),
          frozenset({"lease_id", "machine", "gpu_index", "holder", "acquired_at", "expires_at"}), ("machine",)),
)
TABLE_BY_NAME = {table.name: table for table in TABLES}


def quote(name: str) -> str:
    """``name`` as a PostgreSQL identifier (``requests`` has a column named ``index``)."""
    return '"' + name.replace('"', '""') + '"'


def create_table_sql(table: Table) -> list[str]:
    """The statements that create ``table`` and its indexes."""
    columns = [f"{quote(name)} {_SQL_TYPES[kind]}" + (" NOT NULL" if name in table.not_null else "")
               for name, kind in table.columns.items()]
    columns.append("rowid BIGSERIAL")  # SQLite's implicit rowid: the order rows were written in
    if table.key:
        columns.append(f"PRIMARY KEY ({', '.join(quote(name) for name in table.key)})")
    statements = [f"CREATE TABLE IF NOT EXISTS {quote(table.name)} ({', '.join(columns)})"]
    statements += [f"CREATE INDEX IF NOT EXISTS {quote(f'idx_{table.name}_{column}')} "
                   f"ON {quote(table.name)} ({quote(column)})" for column in table.indexed]
    return statements


def _version_1(cursor: Any) -> None:
    for table in TABLES:
        for statement in create_table_sql(table):
            cursor.execute(statement)


def _version_2(cursor: Any) -> None:
    cursor.execute(f"ALTER TABLE runs ADD COLUMN IF NOT EXISTS {quote('clouds')} TEXT")


class Migration(NamedTuple):
    """One step of the schema: its version, what it does, and the function that does it (given a cursor)."""

    version: int
    description: str
    apply: Callable[[Any], None]


#: Every migration, in order; the last one's version is :data:`SCHEMA_VERSION`.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the SQLite manifest's schema version 1: runs, cells, attempts, results, requests, "
                 "repeats, GPU samples, systems, microbenchmark figures, GPU leases", _version_1),
    Migration(2, "runs.clouds: the clouds a run rented through and their settings (not secret)", _version_2),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def schema_version(cursor: Any) -> int:
    """The newest version applied (0: none; the migrations table must exist)."""
    cursor.execute(f"SELECT COALESCE(MAX(version), 0) FROM {MIGRATIONS_TABLE}")
    return int(_first(cursor.fetchone()))


def migrate(connection: Any, location: str, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Apply the migrations ``connection``'s database lacks, once, whoever else connects; the version.

    One transaction, under a transaction-scoped advisory lock: a second controller
    connecting meanwhile waits for the lock, then finds every migration applied. A
    database migrated beyond the newest of ``migrations`` raises :class:`ManifestTooNew`.
    """
    newest = migrations[-1].version
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version BIGINT PRIMARY KEY, "
                       "applied_at TEXT NOT NULL, description TEXT NOT NULL)")
        current = schema_version(cursor)
        if current > newest:
            raise ManifestTooNew(
                f"the store {location} has schema version {current}, newer than this pytest-gpubench "
                f"understands ({newest})",
                hint="upgrade pytest-gpubench, or use another database")
        for migration in migrations:
            if migration.version > current:
                migration.apply(cursor)
                cursor.execute(f"INSERT INTO {MIGRATIONS_TABLE} (version, applied_at, description) "
                               "VALUES (%s, %s, %s)",
                               [migration.version, datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                                migration.description])
        return max(current, newest)


def _first(row: Any) -> Any:
    """The first value of a row, whichever row factory made it."""
    return next(iter(row.values())) if isinstance(row, Mapping) else row[0]
