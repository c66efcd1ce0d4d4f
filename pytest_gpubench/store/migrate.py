"""The manifest's schema version and the migrations between versions.

The version lives in the database itself, in SQLite's ``PRAGMA user_version``
(0 in a file no migration has touched). :func:`create_schema
<pytest_gpubench.store.schema.create_schema>` runs, in the one write
transaction that opens a manifest, :func:`rename_columns` before it creates
missing tables and columns and :func:`fill_in` after, then stamps
:data:`SCHEMA_VERSION`. A file from a newer version is refused with a clear
message rather than misread.

Versions:

0. As written before issue 9: ``tokens_per_second`` in ``benchmark_manifest``,
   ``benchmarks`` and ``benchmark_runs`` held the per-request mean decode rate
   (GPU Shopper's ``avg_tokens_per_second``), a name the report used for output
   throughput. In a seed-001 file (a ``benchmark_manifest`` without this
   project's ``cell_id`` column) the seed's script wrote output throughput there.
1. Each figure named for what it is: ``decode_tokens_per_second`` (per-request
   mean decode rate) and ``output_tokens_per_second`` (total output tokens /
   measured duration), the latter filled in from each stored result's
   ``total_tokens`` and ``duration_seconds``. Old repeated-run rows have no token
   total, so their ``output_tokens_per_second`` stays empty.
"""

from __future__ import annotations

import sqlite_utils

from ..errors import ManifestTooNew

__all__ = ["SCHEMA_VERSION", "fill_in", "rename_columns", "schema_version", "set_version"]

SCHEMA_VERSION = 1


def schema_version(db: sqlite_utils.Database) -> int:
    """The schema version stored in the file (0 when never stamped)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def set_version(db: sqlite_utils.Database) -> None:
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _columns(db: sqlite_utils.Database, table: str) -> set[str]:
    return set(db.table(table).columns_dict) if db.table(table).exists() else set()


def _rename(db: sqlite_utils.Database, table: str, old: str, new: str) -> None:
    columns = _columns(db, table)
    if old in columns and new not in columns:
        db.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{old}" TO "{new}"')


def rename_columns(db: sqlite_utils.Database, path: object = "") -> int:
    """Rename the columns of an older file in place; returns the version it had.

    A version newer than :data:`SCHEMA_VERSION` raises :class:`ManifestTooNew`.
    """
    version = schema_version(db)
    if version > SCHEMA_VERSION:
        raise ManifestTooNew(
            f"the manifest {path} has schema version {version}, newer than this pytest-gpubench "
            f"understands ({SCHEMA_VERSION})",
            hint="upgrade pytest-gpubench, or use another manifest file")
    if version < 1:
        manifest = _columns(db, "benchmark_manifest")
        # A seed-001 file's tokens_per_second was the seed script's output throughput.
        seed_only = bool(manifest) and "cell_id" not in manifest
        _rename(db, "benchmark_manifest", "tokens_per_second",
                "output_tokens_per_second" if seed_only else "decode_tokens_per_second")
        _rename(db, "benchmarks", "tokens_per_second", "decode_tokens_per_second")
        _rename(db, "benchmark_runs", "tokens_per_second", "decode_tokens_per_second")
    return version


def fill_in(db: sqlite_utils.Database, version: int) -> None:
    """Fill the columns version ``version`` did not have from what it stored (tables exist now)."""
    if version < 1:
        db.execute(
            "UPDATE benchmarks SET output_tokens_per_second = CAST(total_tokens AS REAL) / duration_seconds "
            "WHERE output_tokens_per_second IS NULL AND total_tokens > 0 AND duration_seconds > 0")
        db.execute(
            "UPDATE benchmark_manifest SET output_tokens_per_second = ("
            "  SELECT b.output_tokens_per_second FROM benchmarks b WHERE b.id = benchmark_manifest.benchmark_id) "
            "WHERE output_tokens_per_second IS NULL AND benchmark_id IS NOT NULL")
