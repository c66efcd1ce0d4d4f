"""The manifest's tables: their columns, and creating or upgrading them.

``benchmark_manifest`` keeps seed 001's columns in their order (its
``tokens_per_second`` is named ``decode_tokens_per_second`` since version 1); the
other tables hold
results (``benchmarks``, the flattened ``PerformanceResults`` plus the full JSON),
their ``requests``, ``gpu_samples`` and repeated ``benchmark_runs``, and each cell's
provisioning ``attempts`` (one row per offer tried). A file made by
an older version is migrated when it is opened for writing (:mod:`.schema`): its
schema version is in ``PRAGMA user_version``. A reader (``mode=ro``) migrates nothing:
:func:`check_current` refuses what it cannot read as it is.
"""

from __future__ import annotations

import sqlite3
import typing
from typing import Any

import sqlite_utils
from pydantic import BaseModel

from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest
from ..measure.results import PerformanceResults
from ..remote.readings import RequestRecord
from .records import SYSTEM_COLUMNS

CELL_STATUSES = ("pending", "running", "success", "partial", "failed", "skipped")
FINAL_STATUSES = ("success", "partial", "failed", "skipped")

RUN_COLUMNS: dict[str, type] = {
    "run_id": str,
    "started_at": str,
    "finished_at": str,
    "argv": str,  # JSON list
    "matrix_files": str,  # JSON list
    "host": str,
    "status": str,
    # Who owns the run, so cleanup never releases the sessions of a run still going
    # on: the controller's pid, its start token (processes.start_token), the API.
    "pid": int,
    "pid_start": str,
    "api": str,
    # The clouds the run rented through: JSON {cloud name: {setting: value}}, the settings that
    # are not secret (GPU Shopper's API, redacted); empty in a row from before it was recorded,
    # which reads as GPU Shopper at ``api`` (records.RunRecord.clouds).
    "clouds": str,
    "sandbox": int,  # 1: the run's own sandbox, whose sessions end when it exits
    "resumed_at": str,  # the last time another process took the run over (resume)
}

MANIFEST_COLUMNS: dict[str, type] = {
    # seed 001, in its order
    "id": str,
    "run_id": str,
    "created_at": str,
    "gpu_type": str,
    "provider": str,
    "model": str,
    "session_id": str,
    "instance_ip": str,
    "ssh_port": int,
    "status": str,
    "started_at": str,
    "completed_at": str,
    "benchmark_id": str,
    # seed 001's tokens_per_second, renamed by schema version 1 (see migrate)
    "decode_tokens_per_second": float,
    "total_requests": int,
    "error_count": int,
    "failure_reason": str,
    "failure_stage": str,
    "error_message": str,
    "notes": str,
    # this project's additions
    "cell_id": str,
    "matrix_file": str,
    "offer_id": str,
    "price_per_hour": float,
    "cost_usd": float,  # price x session lifetime
    "api_cost_usd": float,  # what GET /costs said (billed by the clock hour)
    "session_status": str,  # last status the API reported
    "session_started_at": str,  # when record_session ran: the start of cost_usd
    "consumer_id": str,
    "worker": str,
    "lease_expires_at": float,  # the worker's claim, renewed by heartbeat (epoch seconds)
    "ttft_p50_ms": float,
    "cost_per_million_tokens": float,
    "progress_file": str,
    # SHA256 fingerprint of the instance's SSH host key, pinned at the first connection
    "host_key_fingerprint": str,
    "attempts": int,  # offers tried (failover); the rows are in the attempts table
    # Who released the session when the cell itself could not (cleanup.py), and when
    "released_by": str,
    "session_released_at": str,
    # Session reuse: the group whose session the cell ran on, its turn on it (1: it
    # rented the session) and the cell that rented it (whose attempts carry the bill).
    "reuse_group": str,
    "session_turn": int,
    "session_owner": str,
    # gpubench import: the file (and place in it) and format the row's result came from
    "imported_from": str,
    # JSON {stage: seconds}: where the cell's time went, stage by stage (cleanup included)
    "stage_seconds": str,
    # output throughput: total output tokens / measured duration (schema version 1)
    "output_tokens_per_second": float,
}
_MANIFEST_NOT_NULL = {"id", "run_id", "created_at", "gpu_type", "provider", "model", "status"}
# Set once by add_cell; everything else may change.
FIXED_COLUMNS = {"id", "run_id", "created_at"}


def _column_type(annotation: Any) -> type:
    """The SQLite column type of a model field: ``X | None`` is ``X``, bools are ints."""
    kinds = [k for k in typing.get_args(annotation) if k is not type(None)] or [annotation]
    kind = kinds[0]
    if kind is bool:
        return int
    return kind if kind in (int, float, str) else str


def _model_columns(model: type[BaseModel]) -> dict[str, type]:
    return {name: _column_type(field.annotation) for name, field in model.model_fields.items()}


UPLOAD_STATUSES = ("pending", "uploaded", "failed")
UPLOAD_COLUMNS: dict[str, type] = {
    "upload_status": str,  # pending, uploaded, failed; NULL when no upload was asked for
    "upload_error": str,
    "remote_id": str,  # the id the GPU Shopper server gave the result
    "uploaded_at": str,
}

BENCHMARK_COLUMNS: dict[str, type] = {
    "id": str,
    "manifest_id": str,
    "run_id": str,
    "created_at": str,
    "gpu_name": str,
    "gpu_type": str,
    "provider": str,
    "location": str,
    "model": str,
    "price_per_hour": float,
    "decode_tokens_per_second": float,  # = avg_tokens_per_second, the per-request mean decode rate
    "output_tokens_per_second": float,  # total_tokens / duration_seconds
    **_model_columns(PerformanceResults),
    "cost_per_million_tokens": float,
    "result_json": str,
    # What the Go struct has no field for: detailed metrics, validity, cold
    # start, repeated-run statistics, load-generator health, comparison.
    "details_json": str,
    **UPLOAD_COLUMNS,
    # Hash of what changes the figures (workload, runtime version, model digest):
    # --gpubench-compare compares only results that share it (fingerprint.py).
    "workload_fingerprint": str,
}

REQUEST_COLUMNS: dict[str, type] = {
    "benchmark_id": str,
    "manifest_id": str,
    **_model_columns(RequestRecord),
}

GPU_SAMPLE_COLUMNS: dict[str, type] = {
    "benchmark_id": str,
    "manifest_id": str,
    "t": float,  # unix seconds
    "gpu": int,
    "utilization_pct": float,
    "memory_used_mib": int,
    "temperature_c": float,
    "power_draw_w": float,
}

BENCHMARK_RUN_COLUMNS: dict[str, type] = {
    "benchmark_id": str,
    "run_index": int,
    "decode_tokens_per_second": float,
    "output_tokens_per_second": float,
    "ttft_p50_ms": float,
    "requests": int,
    "duration_seconds": float,
    "outlier": int,  # 0/1: left out of the cell's figures
}


ATTEMPT_STATUSES = ("provisioning", "ready", "failed")
ATTEMPT_COLUMNS: dict[str, type] = {
    "manifest_id": str,
    "attempt": int,  # 1, 2, ...: the consumer_id's -aN suffix
    "run_id": str,
    "status": str,  # provisioning, ready (handed to the cell), failed
    "offer_id": str,
    "provider": str,
    "gpu_type": str,
    "location": str,
    "machine_id": str,
    "price_per_hour": float,
    "consumer_id": str,
    "session_id": str,
    "stage": str,  # where a failed attempt failed
    "error": str,
    "started_at": str,  # the budget reservation, before the create
    "session_started_at": str,  # the create answered: billing runs from here
    "ended_at": str,  # the session was released (or never existed)
    "expected_seconds": float,  # session lifetime the budget reserves
    "cost_usd": float,  # price x (ended_at - session_started_at)
    "api_cost_usd": float,
    "session_status": str,  # last status the API reported
    "worker": str,
}

#: ``gpu_leases`` (store/manifest.py): one row per leased GPU of a shared machine (hosts, local).
GPU_LEASES_TABLE = "gpu_leases"
GPU_LEASE_COLUMNS: dict[str, type] = {
    "lease_id": str,
    "machine": str,
    "gpu_index": int,
    "holder": str,
    "run_id": str,
    "acquired_at": float,  # seconds since the epoch
    "expires_at": float,  # renewed by the holder's heartbeat
    "released_at": float,
}


def create_gpu_leases_table(db: sqlite_utils.Database) -> None:
    """The GPU leases table and its index, when missing."""
    db[GPU_LEASES_TABLE].create(GPU_LEASE_COLUMNS, pk=("lease_id", "gpu_index"),
                                not_null={"lease_id", "machine", "gpu_index", "holder", "acquired_at",
                                          "expires_at"}, if_not_exists=True)
    db.table(GPU_LEASES_TABLE).create_index(["machine"], index_name=f"idx_{GPU_LEASES_TABLE}_machine",
                                            if_not_exists=True)


# The figures of microbenchmark cells (store/manifest.py), one row per figure.
MICROBENCH_COLUMNS: dict[str, type] = {
    "manifest_id": str,
    "run_id": str,
    "created_at": str,
    "gpu_type": str,
    "provider": str,
    "label": str,  # memory_bandwidth, matmul_fp16, ...
    "kind": str,
    "precision": str,
    "unit": str,
    "value": float,  # the mean of the timed runs
    "std": float,
    "cv": float,
    "n": int,
    "ci_low": float,
    "ci_high": float,
    "values_json": str,
    "skipped": str,
    "device": str,
    "capability": str,
    "torch_version": str,
}


def create_microbench_table(db: sqlite_utils.Database) -> None:
    """Create the table (and its index) when missing; an older manifest simply gains it."""
    db["microbench_figures"].create(
        MICROBENCH_COLUMNS, pk=("manifest_id", "label"), not_null={"manifest_id", "label", "kind"},
        foreign_keys=[("manifest_id", "benchmark_manifest", "id")], if_not_exists=True)
    db.table("microbench_figures").create_index(["run_id"], index_name="idx_microbench_figures_run_id",
                                                if_not_exists=True)


def create_schema(db: sqlite_utils.Database, path: object = "") -> None:
    """Create the tables and indexes that are missing, and bring an older file up to
    :data:`~.manifest_migrate.SCHEMA_VERSION`: columns renamed, added, filled in."""
    version = rename_columns(db, path)
    db["runs"].create(RUN_COLUMNS, pk="run_id", not_null={"run_id"}, if_not_exists=True)
    db["benchmark_manifest"].create(
        MANIFEST_COLUMNS, pk="id", not_null=_MANIFEST_NOT_NULL, if_not_exists=True
    )
    db["benchmarks"].create(
        BENCHMARK_COLUMNS,
        pk="id",
        not_null={"id", "manifest_id"},
        foreign_keys=[("manifest_id", "benchmark_manifest", "id")],
        if_not_exists=True,
    )
    db["requests"].create(
        REQUEST_COLUMNS,
        not_null={"benchmark_id"},
        foreign_keys=[("benchmark_id", "benchmarks", "id")],
        if_not_exists=True,
    )
    db["gpu_samples"].create(
        GPU_SAMPLE_COLUMNS,
        not_null={"manifest_id", "t", "gpu"},
        # No key on benchmark_id: samples may be stored before their result is.
        foreign_keys=[("manifest_id", "benchmark_manifest", "id")],
        if_not_exists=True,
    )
    db["benchmark_runs"].create(
        BENCHMARK_RUN_COLUMNS,
        pk=("benchmark_id", "run_index"),
        not_null={"benchmark_id", "run_index"},
        foreign_keys=[("benchmark_id", "benchmarks", "id")],
        if_not_exists=True,
    )
    db["attempts"].create(
        ATTEMPT_COLUMNS,
        pk=("manifest_id", "attempt"),
        not_null={"manifest_id", "attempt", "run_id", "status", "started_at"},
        foreign_keys=[("manifest_id", "benchmark_manifest", "id")],
        if_not_exists=True,
    )
    create_systems_table(db)
    # A file made by an older version gains the columns added since.
    for name, columns in (
        ("runs", RUN_COLUMNS),
        ("benchmark_manifest", MANIFEST_COLUMNS),
        ("benchmarks", BENCHMARK_COLUMNS),
        ("requests", REQUEST_COLUMNS),
        ("gpu_samples", GPU_SAMPLE_COLUMNS),
        ("benchmark_runs", BENCHMARK_RUN_COLUMNS),
        ("attempts", ATTEMPT_COLUMNS),
    ):
        table = db.table(name)
        present = set(table.columns_dict)
        for column, kind in columns.items():
            if column not in present:
                table.add_column(column, kind)
    for name, column in (
        ("benchmark_manifest", "run_id"),
        ("benchmark_manifest", "status"),
        ("benchmark_manifest", "session_id"),
        ("benchmarks", "run_id"),
        ("benchmark_manifest", "cell_id"),
        ("benchmarks", "manifest_id"),
        ("benchmarks", "upload_status"),
        ("requests", "benchmark_id"),
        ("gpu_samples", "benchmark_id"),
        ("gpu_samples", "manifest_id"),
        ("attempts", "run_id"),
        ("attempts", "session_id"),
    ):
        db.table(name).create_index(
            [column], index_name=f"idx_{name}_{column}", if_not_exists=True
        )
    create_microbench_table(db)
    create_gpu_leases_table(db)
    fill_in(db, version)
    set_version(db)


# ------------------------------------------------------------- what a reader may read as it is

#: A file with neither of these tables is no manifest (seed 001's files have the first only).
_MANIFEST_TABLES = ("benchmark_manifest", "runs")


def _tables(db: sqlite_utils.Database) -> dict[str, set[str]]:
    return {name: set(db.table(name).columns_dict) for name in db.table_names()}


def missing_schema(db: sqlite_utils.Database) -> list[str]:
    """What opening the file for writing would change (empty: nothing): an older schema version,
    and each table or column :func:`create_schema` would add. Compared with a fresh schema
    made in memory, so it follows every table the schema gains. Reads only."""
    fresh = sqlite_utils.Database(memory=True)
    create_schema(fresh)
    wanted, present = _tables(fresh), _tables(db)
    fresh.close()
    found = []
    version = schema_version(db)
    if version < SCHEMA_VERSION:
        found.append(f"schema version {version}, where this pytest-gpubench writes {SCHEMA_VERSION}")
    for table, columns in wanted.items():
        if table not in present:
            found.append(f"no {table} table")
        elif columns - present[table]:
            found.append(f"{table} lacks {', '.join(sorted(columns - present[table]))}")
    return found


def check_current(db: sqlite_utils.Database, path: object = "") -> None:
    """Refuse, without changing the file, what a reader cannot read as it is: a SQLite file that is not
    a manifest (:class:`NotAManifest`), one written by a newer version (:class:`ManifestTooNew`) or an
    older one (:class:`MigrationNeeded`: ``gpubench migrate`` brings it up to date)."""
    try:
        tables = set(db.table_names())
        if not tables & set(_MANIFEST_TABLES):
            raise NotAManifest(f"{path} is not a pytest-gpubench manifest (it has no benchmark_manifest or "
                               "runs table); nothing was read or changed")
        if schema_version(db) > SCHEMA_VERSION:
            rename_columns(db, path)  # raises ManifestTooNew, changing nothing
        missing = missing_schema(db)
    except sqlite3.DatabaseError as exc:  # "file is not a database", a corrupt page
        raise NotAManifest(f"{path} is not a pytest-gpubench manifest ({exc}); nothing was read or changed") \
            from None
    if missing:
        more = len(missing) - 1
        also = f", and {more} more change{'s' * (more > 1)}" if more else ""
        raise MigrationNeeded(f"the manifest {path} was written by an older pytest-gpubench ({missing[0]}{also}); "
                              "it was left as it is",
                              hint=f"run `gpubench migrate --store {path}` to bring it up to date")


# --------------------------------------------------------------------------------------------------
# The manifest's schema version and the migrations between versions.
#
# The version lives in the database itself, in SQLite's ``PRAGMA user_version``
# (0 in a file no migration has touched). :func:`create_schema
# <pytest_gpubench.store.schema.create_schema>` runs, in the one write
# transaction that opens a manifest, :func:`rename_columns` before it creates
# missing tables and columns and :func:`fill_in` after, then stamps
# :data:`SCHEMA_VERSION`. A file from a newer version is refused with a clear
# message rather than misread.
#
# Versions:
#
# 0. As written before issue 9: ``tokens_per_second`` in ``benchmark_manifest``,
#    ``benchmarks`` and ``benchmark_runs`` held the per-request mean decode rate
#    (GPU Shopper's ``avg_tokens_per_second``), a name the report used for output
#    throughput. In a seed-001 file (a ``benchmark_manifest`` without this
#    project's ``cell_id`` column) the seed's script wrote output throughput there.
# 1. Each figure named for what it is: ``decode_tokens_per_second`` (per-request
#    mean decode rate) and ``output_tokens_per_second`` (total output tokens /
#    measured duration), the latter filled in from each stored result's
#    ``total_tokens`` and ``duration_seconds``. Old repeated-run rows have no token
#    total, so their ``output_tokens_per_second`` stays empty.


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


def create_systems_table(db: sqlite_utils.Database) -> None:
    """Create the table when missing (a file from before it gains it when opened)."""
    db["systems"].create(SYSTEM_COLUMNS, pk=("run_id", "session_id"),
                         not_null={"run_id", "session_id", "manifest_id", "system_json"}, if_not_exists=True)
