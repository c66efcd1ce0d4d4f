"""The PostgreSQL store: the :class:`~.base.Store` protocol on one database many machines share.

The tables and columns are the SQLite manifest's (:mod:`.postgres_store`), timestamps
the same ISO text, so records come from rows with the same code (:mod:`.records`)
and ``gpubench export`` copies column for column. Every write is one short transaction
from a small ``psycopg_pool`` pool (threads of a process share the store). What must be
atomic across machines is:

* a cell's claim: ``SELECT ... FOR UPDATE SKIP LOCKED``: a row another transaction has
  locked is being claimed right now; the claimant does not take it (it waits only
  for that short transaction to end, to name the holder);
* the spend cap's admission: a transaction-scoped advisory lock per run, held from
  reading the run's attempts to inserting the new one;
* GPU leases: a transaction-scoped advisory lock per machine;
* every read-modify-write of a row (finishing a cell, ending an attempt): the row
  locked ``FOR UPDATE``.

The driver is the ``[postgresql]`` extra (``psycopg[binary]``, ``psycopg-pool``); the
password comes from the URL, ``PGPASSWORD`` or ``~/.pgpass`` (libpq reads them) and is
never printed: :attr:`location` is the URL with it hidden.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from ..cloud.gpu_leasing import GpuLease
from ..cloud.processes import ProcessIdentity
from ..errors import ManifestTooNew, StoreUnreachable, UsageProblem
from ..measure.results import BenchmarkResult
from ..errors import redact
from ..remote.readings import RequestRecord
from .base import Admission, CellChange, Store, T, claimable, decide_claim
from .manifest import (
    _lease,
    baseline_where,
    benchmark_rows,
    cell_row,
    check_attempt_fields,
    ended,
    more_clouds,
    lease_rows,
    run_row,
    taken_over,
)
from .records import SYSTEM_COLUMNS, Baseline, Claim, attempt_record, cell_record
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
    UPLOAD_COLUMNS,
)
from .sqlite import refuse_secrets, utc_now

__all__ = ["MIGRATIONS", "Migration", "PostgresStore", "SCHEMA_VERSION", "StoreUnreachable", "TABLES", "Table",
           "migrate", "quote", "schema_version"]

_INSTALL = "pip install 'pytest-gpubench[postgresql]'"
#: How long a claimant waits for another's claim transaction (milliseconds long) to name its holder.
_HOLDER_WAIT = "10s"


def _driver() -> Any:
    try:
        import psycopg
        import psycopg_pool
    except ImportError:
        raise UsageProblem(f"a postgresql:// store needs the PostgreSQL driver: {_INSTALL}") from None
    return psycopg, psycopg_pool


def _connect(url: str) -> Any:
    """One connection to ``url``, or :class:`StoreUnreachable` saying what to check (password hidden)."""
    psycopg, _ = _driver()
    from psycopg.rows import dict_row

    try:
        return psycopg.connect(url, row_factory=dict_row, connect_timeout=15)
    except psycopg.OperationalError as exc:
        detail = " ".join(str(exc).split())
        password = _password(url)
        if password:
            detail = detail.replace(password, "***")
        raise StoreUnreachable(
            f"cannot reach the store {redact(url)}: {detail}",
            hint="check that the server runs and accepts connections from here (host, port, "
                 "pg_hba.conf), the user and database exist, and the password (in the URL, "
                 "PGPASSWORD or ~/.pgpass) is right") from None


def _password(url: str) -> str | None:
    from urllib.parse import unquote, urlsplit

    try:
        found = urlsplit(url).password
    except ValueError:
        return None
    return unquote(found) if found else None


def _busy(row_id: str, at: float) -> Claim:
    """The claim when another transaction kept the cell locked past the wait: not won, holder
    unknown, and a lease that has just run out, so the caller puts the cell aside and comes back
    to it (no lease would read as "held until finished": the cell would never be looked at again)."""
    return Claim(row_id=row_id, holder=None, won=False, status="running", lease_expires_at=at)


def _plain(value: Any, kind: type) -> Any:
    """``value`` as the column's type (SQLite stores what it is given; PostgreSQL wants the type)."""
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if kind is str:
        return value if isinstance(value, str) else str(value)
    if kind is int:
        return int(value)
    return float(value)


class PostgresStore(Store):
    """The store in the PostgreSQL database at ``url`` (see the module's docstring)."""

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        _, psycopg_pool = _driver()
        from psycopg.rows import dict_row

        self._url = url
        with _connect(url) as first:
            migrate(first, redact(url))
        self._pool = psycopg_pool.ConnectionPool(
            url, min_size=1, max_size=max(pool_size, 2), kwargs={"row_factory": dict_row}, open=True,
            name=f"gpubench {redact(url)}")

    @classmethod
    def open(cls, url: str, *, pool_size: int = 4, **ignored: Any) -> PostgresStore:
        """Open the store at ``url``, migrating its schema; SQLite's options (``busy_timeout``,
        ``retry_seconds``) mean nothing here and are ignored."""
        return cls(url, pool_size=pool_size)

    @staticmethod
    def exists(url: str) -> bool:
        """True when the database answers and holds the schema; False when it answers without it.

        A server that cannot be reached raises :class:`StoreUnreachable`; nothing is created.
        """
        with _connect(url) as connection:
            found = connection.execute("SELECT to_regclass('gpubench_schema_migrations') AS found").fetchone()
        return found["found"] is not None

    @property
    def location(self) -> str:
        return redact(self._url)

    def close(self) -> None:
        self._pool.close()

    # ----------------------------------------------------------- table rows

    def rows(self, table: str, **equal: Any) -> list[dict[str, Any]]:
        where, params = _where(table, equal)
        return self._select(f"SELECT * FROM {quote(table)} WHERE {where} ORDER BY rowid", params)

    def update_rows(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        refuse_secrets(values)
        with self._transaction() as cursor:
            return self._update(cursor, table, key, values)

    def replace_rows(self, table: str, rows: Sequence[Mapping[str, Any]], *,
                     replacing: Mapping[str, Any] | None = None) -> None:
        with self._transaction() as cursor:
            if replacing is not None:
                where, params = _where(table, replacing)
                cursor.execute(f"DELETE FROM {quote(table)} WHERE {where}", params)
            self._insert(cursor, table, rows)

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A cursor in one transaction: committed when the block ends, rolled back on an error."""
        with self._pool.connection() as connection, connection.transaction(), connection.cursor() as cursor:
            yield cursor

    def _select(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._transaction() as cursor:
            cursor.execute(sql, params)
            return [_without_rowid(row) for row in cursor.fetchall()]

    @staticmethod
    def _insert(cursor: Any, table: str, rows: Sequence[Mapping[str, Any]], conflict: str = "") -> None:
        if not rows:
            return
        kinds = TABLE_BY_NAME[table].columns
        names = list(rows[0])
        sql = (f"INSERT INTO {quote(table)} ({', '.join(quote(n) for n in names)}) "
               f"VALUES ({', '.join(['%s'] * len(names))}) {conflict}")
        cursor.executemany(sql, [[_plain(row[name], kinds[name]) for name in names] for row in rows])

    @staticmethod
    def _update(cursor: Any, table: str, key: Mapping[str, Any], row: Mapping[str, Any]) -> int:
        """Update the rows whose columns equal ``key``; how many matched."""
        where, params = _where(table, key)
        if not row:
            cursor.execute(f"SELECT COUNT(*) AS found FROM {quote(table)} WHERE {where}", params)
            return int(cursor.fetchone()["found"])
        kinds = TABLE_BY_NAME[table].columns
        sets = ", ".join(f"{quote(name)} = %s" for name in row)
        cursor.execute(f"UPDATE {quote(table)} SET {sets} WHERE {where}",
                       [*(_plain(value, kinds[name]) for name, value in row.items()), *params])
        return cursor.rowcount

    @staticmethod
    def _locked_cell(cursor: Any, row_id: str) -> dict[str, Any]:
        cursor.execute("SELECT * FROM benchmark_manifest WHERE id = %s FOR UPDATE", [row_id])
        found = cursor.fetchone()
        if found is None:
            raise KeyError(f"no manifest row {row_id!r}")
        return _without_rowid(found)

    @staticmethod
    def _server_now(cursor: Any) -> float:
        """The database server's clock (seconds since the epoch): one clock for every controller's
        leases, however far the machines' own clocks drift apart."""
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
        return float(cursor.fetchone()["now"])

    @staticmethod
    def _advisory_lock(cursor: Any, name: str) -> None:
        """A lock named ``name`` until the transaction ends (across every process on the server)."""
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        row = run_row(run_id, argv, matrix_files, owner=owner, api=api, sandbox=sandbox, clouds=clouds)
        with self._transaction() as cursor:
            self._insert(cursor, "runs", [row], "ON CONFLICT (run_id) DO NOTHING")
            if cursor.rowcount or (owner is None and not clouds):
                return
            cursor.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", [run_id])
            current = cursor.fetchone()
            update = (taken_over(current, row, owner) if owner is not None else {}) | more_clouds(current, clouds)
            if update:
                self._update(cursor, "runs", {"run_id": run_id}, update)

    def run_ids(self) -> list[str]:
        rows = self._select("""
            SELECT run_id FROM (
                SELECT run_id, started_at AS at, rowid AS seq FROM runs
                UNION ALL
                SELECT run_id, MIN(created_at) AS at, MIN(rowid) AS seq FROM benchmark_manifest
                WHERE run_id NOT IN (SELECT run_id FROM runs) GROUP BY run_id
            ) AS known ORDER BY at DESC, seq DESC""")
        return [row["run_id"] for row in rows]

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        row = cell_row(run_id, cell_id, gpu_type=gpu_type, provider=provider, model=model,
                                matrix_file=matrix_file)
        with self._transaction() as cursor:
            self._insert(cursor, "benchmark_manifest", [row], "ON CONFLICT (id) DO NOTHING")
        return row["id"]

    def change_cell(self, row_id: str, change: CellChange[T], *, now: float | None = None) -> T:
        with self._transaction() as cursor:
            at = self._server_now(cursor) if now is None else now
            answer, update = change(self._locked_cell(cursor, row_id), at)
            if update:
                self._update(cursor, "benchmark_manifest", {"id": row_id}, update)
            return answer

    def claim_cell(self, row_id: str, worker: str, *, lease_seconds: float | None = None,
                   now: float | None = None) -> Claim:
        at = now if now is not None else time.time()
        for _ in range(3):
            with self._transaction() as cursor:
                if now is None:
                    at = self._server_now(cursor)
                lease = at + lease_seconds if lease_seconds is not None else None
                cursor.execute("SELECT * FROM benchmark_manifest WHERE id = %s FOR UPDATE SKIP LOCKED", [row_id])
                current = cursor.fetchone()
                if current is not None:
                    answer, update = decide_claim(row_id, current, worker, at, lease)
                    if update is not None:
                        self._update(cursor, "benchmark_manifest", {"id": row_id}, update)
                    return answer
                # Locked: another transaction has the row (a claim, most likely). Not
                # taken; wait only for that short transaction to end, to say who holds it.
                seen = self._held(cursor, row_id)
            if seen is None:
                return _busy(row_id, at)
            if not claimable(seen, worker, at):
                return decide_claim(row_id, seen, worker, at, lease)[0]
            # The lock was not a claim (the row is still claimable): claim it now.
        return _busy(row_id, at)

    def _held(self, cursor: Any, row_id: str) -> dict[str, Any] | None:
        """The cell another transaction has locked, once it is done with it (None: still locked)."""
        psycopg, _ = _driver()
        cursor.execute(f"SET LOCAL lock_timeout = '{_HOLDER_WAIT}'")
        try:
            cursor.execute("SELECT * FROM benchmark_manifest WHERE id = %s FOR SHARE", [row_id])
        except psycopg.errors.LockNotAvailable:
            return None
        found = cursor.fetchone()
        if found is None:
            raise KeyError(f"no manifest row {row_id!r}")
        return found

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        row = check_attempt_fields({"status": "provisioning", **fields})
        with self._transaction() as cursor:
            cursor.execute("SELECT run_id FROM benchmark_manifest WHERE id = %s", [row_id])
            cell = cursor.fetchone()
            if cell is None:
                raise KeyError(f"no manifest row {row_id!r}")
            run_id = cell["run_id"]
            if admit is not None:
                # Every admission of the run queues here: two processes cannot both
                # read the same attempts and take the last dollar of a budget.
                self._advisory_lock(cursor, f"gpubench admission {run_id}")
                cursor.execute("SELECT * FROM attempts WHERE run_id = %s ORDER BY rowid", [run_id])
                reason = admit([attempt_record(_without_rowid(found)) for found in cursor.fetchall()])
                if reason:
                    return reason
            cursor.execute("DELETE FROM attempts WHERE manifest_id = %s AND attempt = %s", [row_id, attempt])
            self._insert(cursor, "attempts", [{**row, "manifest_id": row_id, "attempt": attempt, "run_id": run_id,
                                               "started_at": utc_now()}])
            self._update(cursor, "benchmark_manifest", {"id": row_id}, {"attempts": counted_as or attempt})
        return None

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        row = check_attempt_fields(fields)
        with self._transaction() as cursor:
            cursor.execute("SELECT * FROM attempts WHERE manifest_id = %s AND attempt = %s FOR UPDATE",
                           [row_id, attempt])
            current = cursor.fetchone()
            if current is None:
                raise KeyError(f"no attempt {attempt} of {row_id!r}")
            if current["ended_at"]:
                return
            values = ended(row, current)
            self._update(cursor, "attempts", {"manifest_id": row_id, "attempt": attempt}, values)

    # -------------------------------------------------- results and requests

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        rows = benchmark_rows(row_id, result, requests, unpriced=unpriced)
        benchmark_id = rows.benchmark["id"]
        with self._transaction() as cursor:
            cell = self._locked_cell(cursor, row_id)
            benchmark = rows.for_cell(cell)
            cursor.execute("DELETE FROM requests WHERE benchmark_id = %s", [benchmark_id])
            # Storing a result again replaces it, but keeps its upload bookkeeping: an upload
            # asked for stays asked for, one done is not repeated.
            replaced = [name for name in TABLE_BY_NAME["benchmarks"].columns
                        if name not in UPLOAD_COLUMNS and name != "id"]
            full = {name: benchmark.get(name) for name in TABLE_BY_NAME["benchmarks"].columns
                    if name not in UPLOAD_COLUMNS}
            self._insert(cursor, "benchmarks", [full], "ON CONFLICT (id) DO UPDATE SET " + ", ".join(
                f"{quote(name)} = EXCLUDED.{quote(name)}" for name in replaced))
            self._insert(cursor, "requests", rows.requests)
            self._update(cursor, "benchmark_manifest", {"id": row_id}, rows.summary(cell))
        return benchmark_id

    # ------------------------------------------------------------------ systems

    # ---------------------------------------------------------------- baselines

    def baseline(self, record_key: str, run_id: str | None = "last",
                 exclude_run: str | None = None) -> Baseline | None:
        where, params = baseline_where(record_key, run_id, exclude_run)
        rows = self._select(f"""
            SELECT m.* FROM benchmark_manifest m LEFT JOIN runs r ON r.run_id = m.run_id
            WHERE {' AND '.join(where).replace("?", "%s")}
            ORDER BY COALESCE(r.started_at, m.created_at) DESC,
                     COALESCE(m.completed_at, m.created_at) DESC, m.rowid DESC
            LIMIT 1""", params)
        if not rows:
            return None
        cell = rows[0]
        benchmark = self.result(cell["benchmark_id"]) if cell["benchmark_id"] else None
        return Baseline(cell=cell_record(cell), result=benchmark)

    # ---------------------------------------------------------------- GPU leases

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        if count < 1:
            raise ValueError(f"a lease needs at least one GPU, not {count}")
        with self._transaction() as cursor:
            # One claimant per machine at a time, across every process on the server.
            self._advisory_lock(cursor, f"gpubench gpus {machine}")
            moment = time.time() if now is None else now
            cursor.execute("SELECT gpu_index FROM gpu_leases WHERE machine = %s AND released_at IS NULL "
                           "AND expires_at > %s", [machine, moment])
            busy = {row["gpu_index"] for row in cursor.fetchall()}
            rows = lease_rows(machine, gpus, count, busy, holder=holder, ttl=ttl, run_id=run_id, moment=moment)
            if rows is None:
                return None
            self._insert(cursor, "gpu_leases", rows)
        return _lease(rows)

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        moment = time.time() if now is None else now
        with self._transaction() as cursor:
            cursor.execute("UPDATE gpu_leases SET expires_at = %s WHERE lease_id = %s AND released_at IS NULL "
                           "AND expires_at > %s", [moment + ttl, lease_id, moment])
            return cursor.rowcount > 0

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        moment = time.time() if now is None else now
        with self._transaction() as cursor:
            # An expired lease keeps its expiry as its end: it stopped holding then, not now.
            cursor.execute("UPDATE gpu_leases SET released_at = LEAST(%s, expires_at) "
                           "WHERE lease_id = %s AND released_at IS NULL", [moment, lease_id])

def _where(table: str, equal: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """A WHERE clause (``TRUE``: every row) and its parameters: each column equal, None as NULL."""
    kinds = TABLE_BY_NAME[table].columns
    clauses = [f"{quote(name)} IS NULL" if value is None else f"{quote(name)} = %s" for name, value in equal.items()]
    return " AND ".join(clauses) or "TRUE", [_plain(value, kinds[name]) for name, value in equal.items()
                                             if value is not None]


def _without_rowid(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as SQLite's would read: without the ``rowid`` column that stands for SQLite's implicit one."""
    return {key: value for key, value in row.items() if key != "rowid"}


# --------------------------------------------------------------------------------------------------
# The PostgreSQL store's tables, made from the SQLite manifest's columns, and its migrations.
#
# Every table has the columns of :mod:`.schema` (``str`` -> ``TEXT``, ``int`` -> ``BIGINT``,
# ``float`` -> ``DOUBLE PRECISION``), the same primary keys and NOT NULLs, so a row reads
# into a record with the same code (:mod:`.records`) and ``gpubench export`` copies
# column for column. One column more, ``rowid`` (``BIGSERIAL``), stands for SQLite's
# implicit one: the order rows were written in, which "in the order added" means.
#
# Migrations are versioned in ``gpubench_schema_migrations(version, applied_at,
# description)``; :func:`migrate` applies the missing ones in one transaction under a
# transaction-scoped advisory lock, so N controllers connecting at once migrate once and
# the others find it done. A database a newer pytest-gpubench migrated is refused.


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
