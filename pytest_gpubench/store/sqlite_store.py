"""The SQLite store: the :class:`~.base.Store` protocol over the manifest file.

The manifest (:class:`~.manifest.Manifest`, sqlite-utils) keeps its tables and its
file exactly as before (Datasette and ``gpubench browse`` read them); this class is
its typed face: it turns rows into :mod:`.records` and back. Wrap an open manifest
(``SqliteStore(manifest)``, sharing its connection) or open a file
(``SqliteStore.open(path)``, closed with the store).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..cloud.gpu_leasing import GpuLease
from ..cloud.processes import ProcessIdentity
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from .base import Admission, CellChange, Store, T
from .manifest import Manifest
from .records import Baseline, attempt_record, cell_record, result_record
from .sqlite import refuse_secrets

__all__ = ["SqliteStore"]


def _where(equal: Mapping[str, Any]) -> tuple[str | None, list[Any]]:
    """A WHERE clause (None: every row) and its parameters: each column equal, None as NULL."""
    clauses = [f'"{name}" IS NULL' if value is None else f'"{name}" = ?' for name, value in equal.items()]
    return " AND ".join(clauses) or None, [value for value in equal.values() if value is not None]


class SqliteStore(Store):
    """The manifest at one SQLite file, as a :class:`~.base.Store`."""

    def __init__(self, manifest: Manifest, *, owns: bool = False) -> None:
        self.manifest = manifest
        self._owns = owns

    @classmethod
    def open(cls, path: str | Path, **options: Any) -> SqliteStore:
        """Open (creating as needed) the manifest at ``path``; ``options`` are :class:`Manifest`'s."""
        return cls(Manifest(path, **options), owns=True)

    @property
    def location(self) -> str:
        return str(self.manifest.path)

    def close(self) -> None:
        if self._owns:
            self.manifest.close()

    # ----------------------------------------------------------- table rows

    def rows(self, table: str, **equal: Any) -> list[dict[str, Any]]:
        where, params = _where(equal)
        return self.manifest._retry(lambda: list(self.manifest.db.table(table).rows_where(
            where, params, order_by="rowid")))

    def update_rows(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        refuse_secrets(values)
        where, params = _where(key)
        names = list(values)

        def update() -> int:
            if not names:
                return self.manifest.db.execute(f'SELECT COUNT(*) FROM "{table}" WHERE {where}', params).fetchone()[0]
            sets = ", ".join(f'"{name}" = ?' for name in names)
            return self.manifest.db.execute(f'UPDATE "{table}" SET {sets} WHERE {where}',
                                            [*(values[name] for name in names), *params]).rowcount

        return self.manifest._write(update)

    def replace_rows(self, table: str, rows: Sequence[Mapping[str, Any]], *,
                     replacing: Mapping[str, Any] | None = None) -> None:
        def replace() -> None:
            if replacing is not None:
                where, params = _where(replacing)
                self.manifest.db.execute(f'DELETE FROM "{table}" WHERE {where}', params)
            if rows:
                # alter: a manifest from before a column (systems' ``machine``) gains it
                self.manifest.db.table(table).insert_all(rows, alter=True)

        self.manifest._write(replace)

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.manifest.start_run(run_id, argv, matrix_files, owner=owner, api=api, sandbox=sandbox, clouds=clouds)

    def run_ids(self) -> list[str]:
        return self.manifest.run_ids()

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        return self.manifest.add_cell(run_id, cell_id, gpu_type=gpu_type, provider=provider, model=model,
                                      matrix_file=matrix_file)

    def change_cell(self, row_id: str, change: CellChange[T], *, now: float | None = None) -> T:
        manifest = self.manifest
        at = time.time() if now is None else now

        def write() -> T:
            answer, update = change(manifest._cell_or_raise(row_id), at)
            if update:
                manifest.db.table("benchmark_manifest").update(row_id, update)
            return answer

        return manifest._write(write)

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        def admit_rows(rows: list[dict[str, Any]]) -> str | None:
            return admit([attempt_record(row) for row in rows]) if admit is not None else None

        return self.manifest.start_attempt(row_id, attempt, admit=admit_rows if admit is not None else None,
                                           counted_as=counted_as, **fields)

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        self.manifest.end_attempt(row_id, attempt, **fields)

    # -------------------------------------------------- results and requests

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        return self.manifest.add_benchmark(row_id, result, requests, unpriced=unpriced)

    # ---------------------------------------------------------------- baselines

    def baseline(self, record_key: str, run_id: str | None = "last",
                 exclude_run: str | None = None) -> Baseline | None:
        found = self.manifest.baseline(record_key, run_id, exclude_run=exclude_run)
        if found is None:
            return None
        benchmark = found.pop("benchmark")
        return Baseline(cell=cell_record(found), result=result_record(benchmark) if benchmark is not None else None)

    # ---------------------------------------------------------------- GPU leases

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        return self.manifest.claim_gpus(machine, gpus, count, holder=holder, ttl=ttl, run_id=run_id, now=now)

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        return self.manifest.renew_gpu_lease(lease_id, ttl, now=now)

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        self.manifest.release_gpu_lease(lease_id, now=now)
