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

from ..cloud.gpu_lease import GpuLease
from ..cloud.processes import ProcessIdentity
from ..errors import Stage
from ..measure.microbench import MicrobenchRun
from ..measure.results import BenchmarkResult
from ..remote.readings import RequestRecord
from .base import Admission
from .manifest import Manifest
from ..remote.sysinfo import SystemInfo
from .records import (
    AttemptRecord,
    Baseline,
    CellRecord,
    Claim,
    MicrobenchRecord,
    OwnedSession,
    ResultRecord,
    RunRecord,
    SystemRecord,
)
from .claim_rule import decide_claim
from .row_records import attempt_record, cell_record, microbench_record, present, result_record, run_record
from .systems import system_record

__all__ = ["SqliteStore"]


class SqliteStore:
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

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------- runs

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.manifest.start_run(run_id, argv, matrix_files, owner=owner, api=api, sandbox=sandbox, clouds=clouds)

    def finish_run(self, run_id: str, status: str) -> None:
        self.manifest.finish_run(run_id, status)

    def run(self, run_id: str) -> RunRecord | None:
        row = self.manifest.run(run_id)
        return run_record(row) if row is not None else None

    def run_ids(self) -> list[str]:
        return self.manifest.run_ids()

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        return self.manifest.add_cell(run_id, cell_id, gpu_type=gpu_type, provider=provider, model=model,
                                      matrix_file=matrix_file)

    def claim_cell(self, row_id: str, worker: str, *, lease_seconds: float | None = None,
                   now: float | None = None) -> Claim:
        manifest = self.manifest
        at = time.time() if now is None else now
        lease = at + lease_seconds if lease_seconds is not None else None

        def claim() -> Claim:
            answer, update = decide_claim(row_id, manifest._cell_or_raise(row_id), worker, at, lease)
            if update is not None:
                manifest.db.table("benchmark_manifest").update(row_id, update)
            return answer

        return manifest._write(claim)

    def renew_cell_lease(self, row_id: str, worker: str, lease_seconds: float, *,
                         now: float | None = None) -> bool:
        manifest = self.manifest
        at = time.time() if now is None else now

        def renew() -> bool:
            current = manifest._cell_or_raise(row_id)
            if current["status"] != "running" or current["worker"] != worker:
                return False
            manifest.db.table("benchmark_manifest").update(row_id, {"lease_expires_at": at + lease_seconds})
            return True

        return manifest._write(renew)

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        return self.manifest.update_cell(row_id, if_held_by=if_held_by, **fields)

    def finish_cell(self, row_id: str, *, status: str, failure_stage: Stage | str | None = None,
                    failure_reason: str | None = None, error_message: str | None = None,
                    if_held_by: str | None = None, **fields: Any) -> bool:
        return self.manifest.finish_cell(row_id, status=status, failure_stage=failure_stage,
                                         failure_reason=failure_reason, error_message=error_message,
                                         if_held_by=if_held_by, **fields)

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        return self.manifest.restart_cell(row_id, ended_before=ended_before)

    def cell(self, row_id: str) -> CellRecord | None:
        row = self.manifest.cell(row_id)
        return cell_record(row) if row is not None else None

    def cells(self, run_id: str | None = None) -> list[CellRecord]:
        return [cell_record(row) for row in self.manifest.cells(run_id)]

    # ---------------------------------------------------- attempts and sessions

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        def admit_rows(rows: list[dict[str, Any]]) -> str | None:
            return admit([attempt_record(row) for row in rows]) if admit is not None else None

        return self.manifest.start_attempt(row_id, attempt, admit=admit_rows if admit is not None else None,
                                           counted_as=counted_as, **fields)

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        self.manifest.update_attempt(row_id, attempt, **fields)

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        self.manifest.end_attempt(row_id, attempt, **fields)

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[AttemptRecord]:
        return [attempt_record(row) for row in self.manifest.attempts(run_id, row_id=row_id)]

    def record_session(self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
                       price_per_hour: float, if_held_by: str | None = None, **fields: Any) -> bool:
        return self.manifest.record_session(row_id, session_id=session_id, consumer_id=consumer_id,
                                            offer_id=offer_id, price_per_hour=price_per_hour,
                                            if_held_by=if_held_by, **fields)

    def unreleased_sessions(self, run_id: str | None = None) -> list[OwnedSession]:
        return [OwnedSession.model_validate(found) for found in self.manifest.unreleased_sessions(run_id)]

    def record_release(self, row_id: str, session_id: str, *, session_status: str, released_by: str,
                       attempt: int | None = None) -> None:
        self.manifest.record_release(row_id, session_id, session_status=session_status,
                                     released_by=released_by, attempt=attempt)

    def end_shared_session(self, session_id: str, *, session_status: str, released_by: str) -> int:
        return self.manifest.end_shared_session(session_id, session_status=session_status, released_by=released_by)

    # -------------------------------------------------- results and requests

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        return self.manifest.add_benchmark(row_id, result, requests, unpriced=unpriced)

    def set_result_details(self, result_id: str, details: Mapping[str, Any]) -> None:
        self.manifest.set_details(result_id, details)

    def add_repeats(self, result_id: str, runs: Iterable[Any]) -> int:
        return self.manifest.add_benchmark_runs(result_id, runs)

    def add_gpu_samples(self, row_id: str, result_id: str | None, samples: Iterable[Any]) -> int:
        return self.manifest.add_gpu_samples(row_id, result_id, samples)

    def add_microbench(self, row_id: str, run: MicrobenchRun) -> int:
        return self.manifest.add_microbench(row_id, run)

    def microbench(self, run_id: str | None = None) -> list[MicrobenchRecord]:
        return [microbench_record(row) for row in self.manifest.microbench_rows(run_id)]

    def result(self, result_id: str) -> ResultRecord | None:
        row = self.manifest.benchmark(result_id)
        return result_record(row) if row is not None else None

    def results(self, run_id: str | None = None) -> list[ResultRecord]:
        return [result_record(row) for row in self.manifest.benchmarks(run_id)]

    def known_result(self, identity: str) -> ResultRecord | None:
        row = self.manifest.known_result(identity)
        return result_record(row) if row is not None else None

    def requests(self, result_id: str) -> list[RequestRecord]:
        return [RequestRecord.model_validate(present(row)) for row in self.manifest.requests(result_id)]

    def request_uploads(self, run_id: str | None = None) -> int:
        return self.manifest.request_uploads(run_id)

    def pending_uploads(self, run_id: str | None = None) -> list[ResultRecord]:
        return [result_record(row) for row in self.manifest.pending_uploads(run_id)]

    def mark_upload(self, result_id: str, *, status: str, remote_id: str | None = None,
                    error: str | None = None) -> None:
        self.manifest.mark_upload(result_id, status=status, remote_id=remote_id, error=error)

    # ------------------------------------------------------------------ systems

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        self.manifest.record_system(row_id, session_id, system, machine)

    def systems(self, run_id: str | None = None) -> list[SystemRecord]:
        return [system_record(row) for row in self.manifest.system_rows(run_id)]

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

    def gpu_leases(self, machine: str | None = None, *, active_at: float | None = None) -> list[GpuLease]:
        return self.manifest.gpu_leases(machine, active_at=active_at)
