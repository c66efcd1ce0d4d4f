"""The manifest's SQLite plumbing: one connection per process, short write
transactions, retries while another writer holds the lock.

Several pytest-xdist workers write to the same file at once. That works because the
database is in WAL mode (readers never wait), every write is one short
``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so two writers
cannot deadlock upgrading a read lock), SQLite's busy timeout lets writers queue,
and a write that still meets "database is locked" is retried with backoff.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from sqlite_utils.db import NotFoundError

from ..errors import NotAManifest
from .schema import check_current, create_schema

T = TypeVar("T")
S = TypeVar("S", bound="ManifestStore")
SECRET_MARKERS = ("PRIVATE KEY", "-----BEGIN")


def utc_now() -> str:
    """The current time as the manifest stores it: ISO-8601, UTC, milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def refuse_secrets(row: Mapping[str, Any]) -> None:
    for key, value in row.items():
        if isinstance(value, str) and any(marker in value for marker in SECRET_MARKERS):
            raise ValueError(f"refusing to store key material in the manifest (column {key})")


def plain(value: Any) -> Any:
    """Enums as their value, paths as text: what SQLite can store."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


class ManifestStore:
    """The SQLite file at ``path`` and the transactions every manifest table uses.

    Opening creates the file, its parent directories and the schema as needed.
    ``busy_timeout`` is how long SQLite waits for another writer before reporting
    "database is locked"; ``retry_seconds`` how long a write keeps retrying after that.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 30.0,
        retry_seconds: float = 120.0,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._retry_seconds = retry_seconds
        self._lock = threading.RLock()
        if read_only:
            self._open_read_only(busy_timeout)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), timeout=busy_timeout, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self.db.execute("PRAGMA foreign_keys = ON")
        # Changing the journal mode needs the file to itself for a moment.
        self._retry(self.db.enable_wal)
        # In WAL mode NORMAL is still crash-safe for the database; it only skips
        # an fsync per commit.
        self.db.execute("PRAGMA synchronous = NORMAL")
        self._write(lambda: create_schema(self.db, self.path))

    def _open_read_only(self, busy_timeout: float) -> None:
        """A ``mode=ro`` connection to a file that must be a current manifest (readers: report, export,
        status, browse, plan): nothing is created, migrated or stamped, the file is left byte for byte
        as it was; what it cannot read is refused (``schema.check_current``)."""
        if not self.path.is_file():
            raise NotAManifest(f"no manifest at {self.path}" + (" (a folder)" if self.path.is_dir() else ""))
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout,
                               check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            check_current(self.db, self.path)
        except BaseException:
            conn.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.db.close()

    def __enter__(self: S) -> S:
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

    def _rows(self, table: str, run_id: str | None) -> list[dict[str, Any]]:
        where, params = ("run_id = ?", [run_id]) if run_id is not None else (None, None)
        return self._retry(
            lambda: list(
                self.db.table(table).rows_where(where, params, order_by="created_at, rowid")
            )
        )

    def _update_row(self, table: str, key: str, row: dict[str, Any]) -> None:
        """Update one row by primary key in its own transaction; KeyError if it is not there."""
        refuse_secrets(row)

        def update() -> None:
            try:
                self.db.table(table).update(key, row)
            except NotFoundError:
                raise KeyError(f"no {table} row {key!r}") from None

        self._write(update)
