"""The PostgreSQL store: the :class:`~.base.Store` protocol on one database many machines share.

The tables and columns are the SQLite manifest's (:mod:`.postgres_schema`), timestamps
the same ISO text, so records come from rows with the same code (:mod:`.row_records`)
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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from ..cloud.gpu_lease import GpuLease
from ..cloud.processes import ProcessIdentity
from ..errors import Stage, StoreUnreachable, UsageProblem
from ..measure.microbench import MicrobenchRun
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from ..remote.sysinfo import SystemInfo
from .attempts import AttemptsMixin, ended
from .base import Admission
from .claim_rule import claimable, decide_claim
from .gpu_leases import _lease, lease_rows
from .manifest import (_GONE_SESSION_STATUSES, Manifest, cell_row, end_released_attempt, finished_row,
                       held_or_unguarded, merge_sessions, more_clouds, priced, released_fields, restarted_row, run_row,
                       taken_over)
from .microbench_table import _row as microbench_row
from .postgres_schema import TABLE_BY_NAME, migrate, quote
from .redaction import redact
from .records import (AttemptRecord, Baseline, CellRecord, Claim, MicrobenchRecord, OwnedSession, ResultRecord,
                      RunRecord, SystemRecord)
from .result_tables import baseline_where, benchmark_rows, details_row, repeat_rows, sample_rows, upload_row
from .row_records import attempt_record, cell_record, microbench_record, present, result_record, run_record
from .schema import UPLOAD_COLUMNS
from .sqlite import refuse_secrets, utc_now
from .systems import system_record, system_row

__all__ = ["PostgresStore", "StoreUnreachable"]

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


class PostgresStore:
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

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _rows(self, table: str, run_id: str | None, order: str = "created_at, rowid") -> list[dict[str, Any]]:
        where, params = ("WHERE run_id = %s", [run_id]) if run_id is not None else ("", [])
        return self._select(f"SELECT * FROM {quote(table)} {where} ORDER BY {order}", params)

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
        """Update the row whose columns equal ``key``; how many rows changed."""
        if not row:
            return 1
        kinds = TABLE_BY_NAME[table].columns
        sets = ", ".join(f"{quote(name)} = %s" for name in row)
        where = " AND ".join(f"{quote(name)} = %s" for name in key)
        cursor.execute(f"UPDATE {quote(table)} SET {sets} WHERE {where}",
                       [*(_plain(value, kinds[name]) for name, value in row.items()), *key.values()])
        return cursor.rowcount

    @staticmethod
    def _locked_cell(cursor: Any, row_id: str) -> dict[str, Any]:
        cursor.execute("SELECT * FROM benchmark_manifest WHERE id = %s FOR UPDATE", [row_id])
        found = cursor.fetchone()
        if found is None:
            raise KeyError(f"no manifest row {row_id!r}")
        return _without_rowid(found)

    def _update_cell(self, cursor: Any, row_id: str, row: dict[str, Any], if_held_by: str | None = None,
                     current: Mapping[str, Any] | None = None) -> bool:
        """Inside a transaction: apply ``row`` (the row locked, so the check and the write are one
        step) unless ``if_held_by`` no longer holds the cell; ``running`` stamps ``started_at`` once."""
        current = self._locked_cell(cursor, row_id) if current is None else current
        if not held_or_unguarded(current, if_held_by):
            return False
        if row.get("status") == "running" and not current["started_at"]:
            row.setdefault("started_at", utc_now())
        self._update(cursor, "benchmark_manifest", {"id": row_id}, row)
        return True

    @staticmethod
    def _server_now(cursor: Any) -> float:
        """The database server's clock (seconds since the epoch): one clock for every controller's
        leases, however far the machines' own clocks drift apart."""
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
        return float(cursor.fetchone()["now"])

    def _update_row(self, table: str, key: Mapping[str, Any], row: Mapping[str, Any], what: str) -> None:
        refuse_secrets(row)
        with self._transaction() as cursor:
            if not self._update(cursor, table, key, row):
                raise KeyError(f"no {what}")

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

    def finish_run(self, run_id: str, status: str) -> None:
        self._update_row("runs", {"run_id": run_id}, {"finished_at": utc_now(), "status": status},
                         f"runs row {run_id!r}")

    def run(self, run_id: str) -> RunRecord | None:
        rows = self._select("SELECT * FROM runs WHERE run_id = %s", [run_id])
        return run_record(rows[0]) if rows else None

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

    def renew_cell_lease(self, row_id: str, worker: str, lease_seconds: float, *,
                         now: float | None = None) -> bool:
        with self._transaction() as cursor:
            at = self._server_now(cursor) if now is None else now
            cursor.execute("UPDATE benchmark_manifest SET lease_expires_at = %s "
                           "WHERE id = %s AND status = 'running' AND worker = %s",
                           [at + lease_seconds, row_id, worker])
            if cursor.rowcount:
                return True
            cursor.execute("SELECT 1 FROM benchmark_manifest WHERE id = %s", [row_id])
            if cursor.fetchone() is None:
                raise KeyError(f"no manifest row {row_id!r}")
            return False

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        row = Manifest._check_cell_fields(fields)
        with self._transaction() as cursor:
            return self._update_cell(cursor, row_id, row, if_held_by)

    def finish_cell(self, row_id: str, *, status: str, failure_stage: Stage | str | None = None,
                    failure_reason: str | None = None, error_message: str | None = None,
                    if_held_by: str | None = None, **fields: Any) -> bool:
        row = finished_row(status=status, failure_stage=failure_stage, failure_reason=failure_reason,
                           error_message=error_message, **fields)
        with self._transaction() as cursor:
            current = self._locked_cell(cursor, row_id)
            return self._update_cell(cursor, row_id, priced(row, current), if_held_by, current)

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        with self._transaction() as cursor:
            row = restarted_row(self._locked_cell(cursor, row_id), ended_before)
            if row is None:
                return False
            self._update(cursor, "benchmark_manifest", {"id": row_id}, row)
            return True

    def cell(self, row_id: str) -> CellRecord | None:
        rows = self._select("SELECT * FROM benchmark_manifest WHERE id = %s", [row_id])
        return cell_record(rows[0]) if rows else None

    def cells(self, run_id: str | None = None) -> list[CellRecord]:
        return [cell_record(row) for row in self._rows("benchmark_manifest", run_id)]

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        row = AttemptsMixin._check_attempt_fields({"status": "provisioning", **fields})
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

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        row = AttemptsMixin._check_attempt_fields(fields)
        if "session_id" in row and "session_started_at" not in row:
            row["session_started_at"] = utc_now()
        self._update_row("attempts", {"manifest_id": row_id, "attempt": attempt}, row,
                         f"attempts row {(row_id, attempt)!r}")

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        row = AttemptsMixin._check_attempt_fields(fields)
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

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[AttemptRecord]:
        where, params = "", []
        if row_id is not None:
            where, params = "WHERE manifest_id = %s", [row_id]
        elif run_id is not None:
            where, params = "WHERE run_id = %s", [run_id]
        rows = self._select(f"SELECT * FROM attempts {where} ORDER BY started_at, manifest_id, attempt", params)
        return [attempt_record(row) for row in rows]

    def record_session(self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
                       price_per_hour: float, if_held_by: str | None = None, **fields: Any) -> bool:
        row = Manifest._check_cell_fields({
            "session_id": session_id, "consumer_id": consumer_id, "offer_id": offer_id,
            "price_per_hour": price_per_hour, "session_started_at": utc_now(), **fields})
        with self._transaction() as cursor:
            return self._update_cell(cursor, row_id, row, if_held_by)

    def unreleased_sessions(self, run_id: str | None = None) -> list[OwnedSession]:
        gone = ", ".join(["%s"] * len(_GONE_SESSION_STATUSES))

        def still_open(table: str) -> str:
            return f"({table}.session_status IS NULL OR {table}.session_status NOT IN ({gone}))"

        run_filter = " AND m.run_id = %s" if run_id is not None else ""
        params: list[Any] = [*_GONE_SESSION_STATUSES, *([run_id] if run_id is not None else [])]
        rows = self._select(f"""
            SELECT m.session_id, m.consumer_id, m.run_id, m.id AS row_id, m.cell_id, m.status AS cell_status,
                   m.worker, m.progress_file, m.session_status, NULL::BIGINT AS attempt, m.created_at AS at
            FROM benchmark_manifest m
            WHERE m.session_id IS NOT NULL AND {still_open("m")} {run_filter}
            UNION ALL
            SELECT a.session_id, a.consumer_id, a.run_id, m.id, m.cell_id, m.status, m.worker,
                   m.progress_file, a.session_status, a.attempt, a.started_at
            FROM attempts a JOIN benchmark_manifest m ON m.id = a.manifest_id
            WHERE a.session_id IS NOT NULL AND a.ended_at IS NULL AND {still_open("a")} {run_filter}""",
            params + params)
        return [OwnedSession.model_validate(found) for found in merge_sessions(rows)]

    def record_release(self, row_id: str, session_id: str, *, session_status: str, released_by: str,
                       attempt: int | None = None) -> None:
        fields = released_fields(session_status, released_by)
        with self._transaction() as cursor:
            current = self._locked_cell(cursor, row_id)
            if current["session_id"] in (None, session_id):
                self._update(cursor, "benchmark_manifest", {"id": row_id}, {**fields, "session_id": session_id})
        end_released_attempt(self, row_id, attempt, session_status)

    def end_shared_session(self, session_id: str, *, session_status: str, released_by: str) -> int:
        fields = released_fields(session_status, released_by)
        gone = ", ".join(["%s"] * len(_GONE_SESSION_STATUSES))
        with self._transaction() as cursor:
            cursor.execute(
                f"UPDATE benchmark_manifest SET session_status = %s, released_by = %s, session_released_at = %s "
                f"WHERE session_id = %s AND (session_status IS NULL OR session_status NOT IN ({gone}))",
                [fields["session_status"], fields["released_by"], fields["session_released_at"], session_id,
                 *_GONE_SESSION_STATUSES])
            return cursor.rowcount

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

    def set_result_details(self, result_id: str, details: Mapping[str, Any]) -> None:
        self._update_row("benchmarks", {"id": result_id}, details_row(details),
                         f"benchmark {result_id!r}")

    def _result_or_raise(self, cursor: Any, result_id: str) -> None:
        cursor.execute("SELECT 1 FROM benchmarks WHERE id = %s", [result_id])
        if cursor.fetchone() is None:
            raise KeyError(f"no benchmark {result_id!r}")

    def add_repeats(self, result_id: str, runs: Iterable[Any]) -> int:
        rows = repeat_rows(result_id, runs)
        with self._transaction() as cursor:
            self._result_or_raise(cursor, result_id)
            cursor.execute("DELETE FROM benchmark_runs WHERE benchmark_id = %s", [result_id])
            self._insert(cursor, "benchmark_runs", rows)
        return len(rows)

    def add_gpu_samples(self, row_id: str, result_id: str | None, samples: Iterable[Any]) -> int:
        rows = sample_rows(row_id, result_id, samples)
        with self._transaction() as cursor:
            cursor.execute("SELECT 1 FROM benchmark_manifest WHERE id = %s", [row_id])
            if cursor.fetchone() is None:
                raise KeyError(f"no manifest row {row_id!r}")
            self._insert(cursor, "gpu_samples", rows)
        return len(rows)

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        created = utc_now()
        with self._transaction() as cursor:
            cell = self._locked_cell(cursor, row_id)
            rows = [microbench_row(cell, created, run, figure) for figure in run.figures]
            cursor.execute("DELETE FROM microbench_figures WHERE manifest_id = %s", [row_id])
            self._insert(cursor, "microbench_figures", rows)
        return len(rows)

    def microbench(self, run_id: str | None = None) -> list[MicrobenchRecord]:
        return [microbench_record(row) for row in self._rows("microbench_figures", run_id)]

    def result(self, result_id: str) -> ResultRecord | None:
        rows = self._select("SELECT * FROM benchmarks WHERE id = %s", [result_id])
        return result_record(rows[0]) if rows else None

    def results(self, run_id: str | None = None) -> list[ResultRecord]:
        return [result_record(row) for row in self._rows("benchmarks", run_id)]

    def known_result(self, identity: str) -> ResultRecord | None:
        rows = self._select("SELECT * FROM benchmarks WHERE id = %s OR remote_id = %s ORDER BY id <> %s LIMIT 1",
                            [identity, identity, identity])
        return result_record(rows[0]) if rows else None

    def requests(self, result_id: str) -> list[RequestRecord]:
        rows = self._select('SELECT * FROM requests WHERE benchmark_id = %s ORDER BY "index", rowid', [result_id])
        return [RequestRecord.model_validate(present(row)) for row in rows]

    def request_uploads(self, run_id: str | None = None) -> int:
        where, params = ("AND run_id = %s", [run_id]) if run_id is not None else ("", [])
        with self._transaction() as cursor:
            cursor.execute(f"UPDATE benchmarks SET upload_status = 'pending' WHERE upload_status IS NULL {where}",
                           params)
            return cursor.rowcount

    def pending_uploads(self, run_id: str | None = None) -> list[ResultRecord]:
        where, params = ("AND run_id = %s", [run_id]) if run_id is not None else ("", [])
        rows = self._select(f"SELECT * FROM benchmarks WHERE upload_status IN ('pending', 'failed') {where} "
                            "ORDER BY created_at, rowid", params)
        return [result_record(row) for row in rows]

    def mark_upload(self, result_id: str, *, status: str, remote_id: str | None = None,
                    error: str | None = None) -> None:
        row = upload_row(status=status, remote_id=remote_id, error=error)
        with self._transaction() as cursor:
            if not self._update(cursor, "benchmarks", {"id": result_id}, row):
                raise KeyError(f"no benchmark {result_id!r}")

    # ------------------------------------------------------------------ systems

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        recorded = utc_now()
        with self._transaction() as cursor:
            row = system_row(self._locked_cell(cursor, row_id), session_id, system, recorded, machine)
            cursor.execute("DELETE FROM systems WHERE run_id = %s AND session_id = %s", [row["run_id"], session_id])
            self._insert(cursor, "systems", [row])

    def systems(self, run_id: str | None = None) -> list[SystemRecord]:
        return [system_record(row) for row in self._rows("systems", run_id, "recorded_at, rowid")]

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

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        where, params = ("WHERE machine = %s", [machine]) if machine is not None else ("", [])
        rows = self._select(f"SELECT * FROM gpu_leases {where} ORDER BY acquired_at, lease_id, gpu_index", params)
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["lease_id"], []).append(row)
        leases = [_lease(group) for group in grouped.values()]
        return [lease for lease in leases if active_at is None or lease.active(active_at)]


def _without_rowid(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as SQLite's would read: without the ``rowid`` column that stands for SQLite's implicit one."""
    return {key: value for key, value in row.items() if key != "rowid"}
