"""The git store: seed 002's results repository as the shared record, behind the ``Store`` protocol.

For teams without a database: ``--gpubench-store git+file:///srv/results.git`` (or
``git+ssh://``, ``git+https://``). Everything is kept in a local SQLite manifest
(a :class:`~.sqlite_store.SqliteStore` this store holds and hands the rest to); what several machines
must agree on lives in the repository (:mod:`.git_repo`): the TODO line of a cell
not yet done, the claim file of a running one, the result file of a finished one.

Each store has a private clone (:mod:`.git_repo`). A change to the shared part is one
*transaction*: fetch and reset the clone to the remote's latest commit, re-apply the
changes not yet pushed, decide (a claim: is there a result? a live claim of another?),
write, commit, push. A push that loses the race starts the transaction again from the
new remote commit, so every decision is taken on the state it is pushed over: of
several clones claiming one cell exactly one push lands, and the others find its
claim file on their next round (what a rebase conflict on the claim file would tell
them, without a conflict to clean up).

Only claims, lease renewals and the reads (:meth:`GitStore.cell`, :meth:`GitStore.cells`)
reach the remote; added cells and results wait in ``_pending`` and go with the next
transaction, so adding a matrix of cells is one push. A result whose push keeps failing
stays in the local manifest and pending: the next transaction (or :meth:`close`) pushes
it, and a warning says so.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import random
import shutil
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..cloud.gpu_leasing import GpuLease
from ..cloud.processes import ProcessIdentity
from ..errors import Stage, StoreProblem
from ..measure.results import BenchmarkResult
from ..errors import redact
from ..remote.readings import RequestRecord
from .base import REOPENED, Admission, CellChange, Store, abandoned
from .git_repo import (
    ClaimFile,
    Clone,
    Layout,
    Remote,
    RepoCell,
    ResultFile,
    ensure_bare_repository,
    git_url,
    local_path,
    run_dir,
    run_git,
)
from .manifest import FINAL_STATUSES, Manifest, ended_since
from .records import Baseline, CellRecord, Claim, file_name
from .sqlite import utc_now
from .sqlite_store import SqliteStore

__all__ = ["GitStore", "GitStoreWarning", "default_cache_dir"]

T = TypeVar("T")

#: A cell's identity, written into its claim and result files.
_IDENTITY = ("row_id", "run_id", "cell_id", "gpu_type", "provider", "model", "matrix_file")
#: What a result file says of a finished cell beyond its identity.
_OUTCOME = ("status", "worker", "started_at", "completed_at", "failure_stage", "failure_reason", "error_message",
            "benchmark_id", "decode_tokens_per_second", "output_tokens_per_second", "total_requests",
            "error_count", "ttft_p50_ms", "cost_per_million_tokens", "cost_usd")
#: Fields the repository decides; the local manifest's are replaced by what it says.
_SHARED = ("status", "worker", "started_at", "lease_expires_at", "completed_at", "failure_stage", "failure_reason",
           "error_message")


class GitStoreWarning(UserWarning):
    """The results repository could not be reached for a while: what is not pushed yet."""


def default_cache_dir() -> Path:
    """Where clones and the local manifest go: ``$XDG_CACHE_HOME/gpubench/git`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpubench" / "git"


class GitStore(Store):
    """A results repository as the shared record, with a local SQLite manifest for the rest."""

    def __init__(self, manifest: Manifest, clone: Clone, location: str, *, push_tries: int = 8,
                 claim_tries: int = 60, refresh_seconds: float = 0.0, unpushed: Path | None = None,
                 host: str | None = None) -> None:
        #: The local manifest as a store: what the repository does not decide is kept there.
        self.local = SqliteStore(manifest, owns=True)
        self.manifest = manifest
        self.clone = clone
        #: This machine's name in claim files: a worker is ``gw0`` on one host, another ``gw0`` elsewhere.
        self.host = host or socket.gethostname()
        #: Where :meth:`close` leaves the changes it could not push, for the next store on this machine.
        self.unpushed = unpushed if unpushed is not None else clone.directory.parent.with_suffix(".unpushed.json")
        self.layout = Layout(clone.directory)
        self._location = redact(location)
        self._push_tries = push_tries
        self._claim_tries = claim_tries
        self._refresh_seconds = refresh_seconds
        self._synced_at = 0.0
        self._lock = threading.RLock()
        #: row id -> what to re-apply on top of the remote: "todo", "publish" or "restart".
        self._pending: dict[str, str] = {}
        self._closed = False
        # A store its opener never closes (a run's, kept for the process) still pushes what is
        # pending and removes its clone when the process ends.
        atexit.register(self.close)

    @classmethod
    def open(cls, location: str | Path, *, manifest: str | Path | None = None, cache_dir: str | Path | None = None,
             branch: str | None = None, push_tries: int = 8, claim_tries: int = 60, refresh_seconds: float = 0.0,
             host: str | None = None, **options: Any) -> GitStore:
        """Clone ``git+URL`` (a ``file://`` repository is created if missing) into a private folder
        under ``cache_dir`` (default :func:`default_cache_dir`) and open the local manifest: ``manifest``,
        else ``<cache_dir>/<url hash>/manifest.db``, one per URL per machine, shared by its processes.
        ``host`` names this machine in claim files (default: the host name). ``options`` tune the
        SQLite file (``busy_timeout``, ``retry_seconds``)."""
        url = git_url(str(location))
        path = local_path(url)
        if path is not None:
            ensure_bare_repository(path)
        home = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        home = home / hashlib.sha256(redact(url).encode()).hexdigest()[:16]
        clones = home / "clones"
        clones.mkdir(parents=True, exist_ok=True)
        _remove_dead_clones(clones)
        directory = Path(tempfile.mkdtemp(prefix=f"{socket.gethostname()}-{os.getpid()}-", dir=clones))
        try:
            clone = Clone(url, directory / "repo", branch)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        local = Manifest(Path(manifest) if manifest is not None else home / "manifest.db", **options)
        store = cls(local, clone, str(location), push_tries=push_tries, claim_tries=claim_tries,
                    refresh_seconds=refresh_seconds, unpushed=directory.with_suffix(".unpushed.json"), host=host)
        store._adopt_unpushed(clones)
        return store

    @staticmethod
    def exists(location: str | Path) -> bool:
        """Whether the repository is there (a ``file://`` one) or answers (any other); never creates one.
        A remote that does not answer is a :class:`~..errors.StoreProblem` (password hidden)."""
        url = git_url(str(location))
        path = local_path(url)
        if path is not None:
            return (path / "HEAD").is_file() or (path / ".git").exists()
        remote = Remote.of(url)
        run_git("ls-remote", "-q", "--heads", "--", remote.url, remote=remote)
        return True

    @property
    def location(self) -> str:
        return self._location

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self.close)
            if self._pending:
                self._flush("gpubench: results before closing", warn=False)
            if self._pending:
                self.unpushed.write_text(json.dumps({"manifest": str(self.manifest.path), "pending": self._pending}))
                warnings.warn(GitStoreWarning(
                    f"git store {self._location}: {len(self._pending)} cell(s) not pushed; they stay in the local "
                    f"manifest {self.manifest.path} and the next git store of this machine on the same manifest "
                    f"pushes them ({self.unpushed})"), stacklevel=2)
            shutil.rmtree(self.clone.directory.parent, ignore_errors=True)
        self.local.close()

    def _adopt_unpushed(self, clones: Path) -> None:
        """Take over what stores closed earlier on this machine could not push (on the same manifest)."""
        for path in sorted(clones.glob("*.unpushed.json")):
            try:
                left = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if left.get("manifest") == str(self.manifest.path):
                self._pending.update(left.get("pending", {}))
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ transactions

    def _transact(self, decide: Callable[[], T], message: str, tries: int) -> tuple[T, bool]:
        """Run ``decide`` on the remote's latest state with the pending changes re-applied; commit
        and push what it and they wrote. Returns its answer and whether it reached the remote
        (False after ``tries`` lost or failed pushes: the work tree then holds the unpushed commit)."""
        with self._lock:
            for attempt in range(tries):
                if attempt:
                    # Spread the racers out: the winner's push is in; the others retry apart.
                    time.sleep(random.uniform(0, 0.02 * min(attempt, 8)))
                self.clone.sync()
                self.layout.changed = False
                try:
                    self._replay()
                    answer = decide()
                    if self.layout.changed:
                        self.clone.commit(message)
                except BaseException:
                    self.clone.discard()
                    raise
                if not self.layout.changed or self.clone.push():
                    self._pending.clear()
                    self._synced_at = time.monotonic()
                    return answer, True
            return answer, False

    def _flush(self, message: str, *, warn: bool = True) -> bool:
        """Push the pending changes (bounded tries); False, with a warning, when they stay pending."""
        _, pushed = self._transact(lambda: None, message, self._push_tries)
        if warn:
            self._pushed_or_warned(True, pushed, stacklevel=4)
        return pushed

    def _refresh(self) -> None:
        """The clone at the remote's latest state (and pending changes pushed) before a read."""
        with self._lock:
            if self._pending:
                self._flush("gpubench: add cells and results")
            elif time.monotonic() - self._synced_at >= self._refresh_seconds:
                self.clone.sync()
                self._synced_at = time.monotonic()

    def _replay(self) -> None:
        """Write the pending changes into the freshly synced work tree, from the local manifest."""
        for row_id, action in self._pending.items():
            local = self.local.cell(row_id)
            if local is None:
                continue
            run, key = _names(local.row_id, local.run_id)
            if action == "restart":
                # A claim made since is the new run of the cell: never removed by a restart.
                if self.layout.claim(run, key) is None:
                    self.layout.remove_result(run, key)
                    self.layout.add_todo(run, key)
            elif action == "publish" and local.status in FINAL_STATUSES:
                self._publish(local, run, key)
            elif self.layout.result(run, key) is None:
                self.layout.add_todo(run, key)

    def _publish(self, local: CellRecord, run: str, key: str) -> None:
        """The cell is done: its result file (unless another worker's result is there), no TODO line, no claim.

        Not when another holder has it (a live claim of another machine, or of another process of
        this one): an end of a cell this holder no longer held (its cleanup closing what looked
        like running) stays in its own manifest.
        """
        held = self.layout.claim(run, key)
        if held is not None and not self._held_by(held, local.worker) and not _expired(held, time.time()):
            return
        existing = self.layout.result(run, key)
        if existing is None or (existing.cell.get("worker") in (None, local.worker) and self._here(existing.host)):
            stored = self.result(local.benchmark_id) if local.benchmark_id else None
            cell = local.model_dump(include=set(_IDENTITY) | set(_OUTCOME))
            self.layout.write_result(run, key, ResultFile(cell=cell, result=stored.result if stored else None,
                                                          host=self.host))
        self.layout.remove_todo(run, key)
        self.layout.remove_claim(run, key)

    def _here(self, host: str) -> bool:
        """A claim or result of this machine's worker (a file without a host: by the worker's name alone)."""
        return host in ("", self.host)

    def _held_by(self, held: ClaimFile, worker: str | None) -> bool:
        """Whether the claim ``held`` is ``worker``'s, a worker of this machine."""
        return held.holder == worker and self._here(held.host)

    def _holds(self, run: str, key: str, worker: str) -> bool:
        """On the clone as it is (inside a transaction, or just refreshed): the cell runs under
        ``worker`` of this machine (its claim file, no result), whatever its lease says."""
        held = self.layout.claim(run, key)
        return held is not None and self._held_by(held, worker) and self.layout.result(run, key) is None

    def _guarded_local(self, row_id: str, if_held_by: str | None, write: Callable[[], bool]) -> bool:
        """A write only the local manifest keeps (``write``), made only while the repository says the
        cell runs under ``if_held_by`` (None: always): the holder a machine that took over replaced
        writes nothing more, and learns it."""
        if if_held_by is None:
            return write()
        run, key = _names(row_id, self._known(row_id).run_id)
        with self._lock:
            self._refresh()
            return self._holds(run, key, if_held_by) and write()

    def _pushed_or_warned(self, answer: bool, pushed: bool, stacklevel: int = 3) -> bool:
        """``answer``, after a warning when it was decided but could not be pushed (it stays pending)."""
        if answer and not pushed:
            warnings.warn(GitStoreWarning(
                f"git store {self._location}: could not push after {self._push_tries} tries "
                f"({self.clone.last_push_error or 'the remote kept moving'}); {len(self._pending)} cell(s) stay in "
                f"the local manifest and go with the next push"), stacklevel=stacklevel)
        return answer

    def _holder(self, worker: str | None, host: str) -> str | None:
        """A worker as this machine names workers: ``gw0``, or ``gw0@other-host``."""
        return worker if worker is None or self._here(host) else f"{worker}@{host}"

    def _known(self, row_id: str) -> CellRecord:
        local = self.local.cell(row_id)
        if local is None:
            raise KeyError(row_id)
        return local

    # ------------------------------------------- the local manifest's, as they are

    def rows(self, table: str, **equal: Any) -> list[dict[str, Any]]:
        return self.local.rows(table, **equal)

    def update_rows(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        return self.local.update_rows(table, key, values)

    def replace_rows(self, table: str, rows: Sequence[Mapping[str, Any]], *,
                     replacing: Mapping[str, Any] | None = None) -> None:
        self.local.replace_rows(table, rows, replacing=replacing)

    def start_run(self, run_id: str, argv: list[str], matrix_files: list[str], *,
                  owner: ProcessIdentity | None = None, api: str | None = None,
                  sandbox: bool | None = None, clouds: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.local.start_run(run_id, argv, matrix_files, owner=owner, api=api, sandbox=sandbox, clouds=clouds)

    def change_cell(self, row_id: str, change: CellChange[T], *, now: float | None = None) -> T:
        return self.local.change_cell(row_id, change, now=now)

    def start_attempt(self, row_id: str, attempt: int, *, admit: Admission | None = None,
                      counted_as: int | None = None, **fields: Any) -> str | None:
        return self.local.start_attempt(row_id, attempt, admit=admit, counted_as=counted_as, **fields)

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        self.local.end_attempt(row_id, attempt, **fields)

    def baseline(self, record_key: str, run_id: str | None = "last",
                 exclude_run: str | None = None) -> Baseline | None:
        return self.local.baseline(record_key, run_id, exclude_run)

    def claim_gpus(self, machine: str, gpus: Sequence[int], count: int, *, holder: str, ttl: float,
                   run_id: str | None = None, now: float | None = None) -> GpuLease | None:
        return self.local.claim_gpus(machine, gpus, count, holder=holder, ttl=ttl, run_id=run_id, now=now)

    def renew_gpu_lease(self, lease_id: str, ttl: float, *, now: float | None = None) -> bool:
        return self.local.renew_gpu_lease(lease_id, ttl, now=now)

    def release_gpu_lease(self, lease_id: str, *, now: float | None = None) -> None:
        self.local.release_gpu_lease(lease_id, now=now)

    # ---------------------------------------------------------------------- runs

    def run_ids(self) -> list[str]:
        """This machine's runs, most recent first, then the runs only the repository has (by name)."""
        with self._lock:
            self._refresh()
            local = self.local.run_ids()
            known = {run_dir(found) for found in local}
            return local + [run for run in self.layout.runs() if run not in known]

    # --------------------------------------------------------------------- cells

    def add_cell(self, run_id: str, cell_id: str, *, gpu_type: str, provider: str, model: str,
                 matrix_file: str) -> str:
        row_id = self.local.add_cell(run_id, cell_id, gpu_type=gpu_type, provider=provider, model=model,
                                  matrix_file=matrix_file)
        with self._lock:
            self._pending.setdefault(row_id, "todo")
        return row_id

    def claim_cell(self, row_id: str, worker: str, *, lease_seconds: float | None = None,
                   now: float | None = None) -> Claim:
        local = self._known(row_id)
        run, key = _names(row_id, local.run_id)
        at = time.time() if now is None else now
        lease = at + lease_seconds if lease_seconds is not None else None

        def claim() -> Claim:
            done = self.layout.result(run, key)
            if done is not None:
                holder = self._holder(done.cell.get("worker"), done.host)
                if not abandoned(done.status, done.cell.get("failure_reason")):
                    return Claim(row_id=row_id, holder=holder, won=False, status=done.status,
                                 since=done.cell.get("started_at"))
                # Its holder died (cleanup's mark): taken over, as an expired claim is; it runs again.
                self.layout.remove_result(run, key)
                taken_from: str | None = holder
                since = utc_now()
            else:
                held = self.layout.claim(run, key)
                mine = held is not None and held.holder == worker and self._here(held.host)
                expired = held is not None and not mine and _expired(held, at)
                if held is not None and not mine and not expired:
                    return Claim(row_id=row_id, holder=self._holder(held.holder, held.host), won=False,
                                 since=held.since, lease_expires_at=held.lease_expires_at)
                taken_from = self._holder(held.holder, held.host) if expired else None
                since = held.since if mine else utc_now()
            self.layout.write_claim(run, key, ClaimFile(holder=worker, host=self.host, since=since,
                                                        lease_expires_at=lease,
                                                        cell=local.model_dump(include=set(_IDENTITY))))
            return Claim(row_id=row_id, holder=worker, won=True, since=since, lease_expires_at=lease,
                         taken_over_from=taken_from)

        answer, pushed = self._transact(claim, f"gpubench: claim {row_id} for {worker}", self._claim_tries)
        if not pushed:
            raise StoreProblem(f"git store {self._location}: could not push the claim of {row_id} after "
                             f"{self._claim_tries} tries ({self.clone.last_push_error or 'the remote kept moving'})")
        if answer.won:
            # An abandoned cell taken over runs again: its recorded end goes (the repository's went above).
            reopened = dict.fromkeys(REOPENED) if answer.taken_over_from is not None else {}
            self.manifest.update_cell(row_id, status="running", worker=worker, started_at=answer.since,
                                      lease_expires_at=lease, **reopened)
        return answer

    def renew_cell_lease(self, row_id: str, worker: str, lease_seconds: float, *,
                         now: float | None = None) -> bool:
        local = self._known(row_id)
        run, key = _names(row_id, local.run_id)
        lease = (time.time() if now is None else now) + lease_seconds

        def renew() -> bool:
            held = self.layout.claim(run, key)
            if self.layout.result(run, key) is not None or held is None or held.holder != worker \
                    or not self._here(held.host):
                return False
            self.layout.write_claim(run, key, held.model_copy(update={"lease_expires_at": lease}))
            return True

        renewed, pushed = self._transact(renew, f"gpubench: renew {row_id} for {worker}", self._push_tries)
        if not pushed:
            # Not False: the claim may well be this worker's still; the remote did not hear of the renewal.
            raise StoreProblem(f"git store {self._location}: could not push the lease of {row_id} after "
                             f"{self._push_tries} tries ({self.clone.last_push_error or 'the remote kept moving'})")
        if renewed:
            self.local.renew_cell_lease(row_id, worker, lease_seconds, now=now)
        return renewed

    def update_cell(self, row_id: str, *, if_held_by: str | None = None, **fields: Any) -> bool:
        return self._guarded_local(row_id, if_held_by,
                                   lambda: self.local.update_cell(row_id, if_held_by=if_held_by, **fields))

    def record_session(self, row_id: str, *, session_id: str, consumer_id: str, offer_id: str,
                       price_per_hour: float, if_held_by: str | None = None, **fields: Any) -> bool:
        return self._guarded_local(row_id, if_held_by, lambda: self.local.record_session(
            row_id, session_id=session_id, consumer_id=consumer_id, offer_id=offer_id,
            price_per_hour=price_per_hour, if_held_by=if_held_by, **fields))

    def finish_cell(self, row_id: str, *, status: str, failure_stage: Stage | str | None = None,
                    failure_reason: str | None = None, error_message: str | None = None,
                    if_held_by: str | None = None, **fields: Any) -> bool:
        def write() -> bool:
            return self.local.finish_cell(
                row_id, status=status, failure_stage=failure_stage, failure_reason=failure_reason,
                error_message=error_message, if_held_by=if_held_by, **fields)

        if if_held_by is None:
            write()
            with self._lock:
                self._pending.pop(row_id, None)
                self._pending[row_id] = "publish"
                self._flush(f"gpubench: {status} {row_id}")
            return True
        run, key = _names(row_id, self._known(row_id).run_id)
        written = False

        def finish() -> bool:
            # Compare-and-set against the repository: the claim file must still be the holder's.
            nonlocal written
            if not written:
                if not self._holds(run, key, if_held_by) or not write():
                    return False
                written = True
                self._pending.pop(row_id, None)
                self._pending[row_id] = "publish"
            # A later round (the push lost a race) has re-published it in the replay already.
            self._publish(self._known(row_id), run, key)
            return True

        answer, pushed = self._transact(finish, f"gpubench: {status} {row_id}", self._push_tries)
        return self._pushed_or_warned(answer, pushed)

    def restart_cell(self, row_id: str, *, ended_before: str | None = None) -> bool:
        run, key = _names(row_id, self._known(row_id).run_id)
        restarted_here = False

        def restart() -> bool:
            # The repository decides: a claim file is a running cell (never restarted), a result
            # newer than ended_before is a rerun another controller did already.
            nonlocal restarted_here
            if self.layout.claim(run, key) is not None:
                return False
            done = self.layout.result(run, key)
            if done is not None and ended_since({"completed_at": done.cell.get("completed_at")}, ended_before):
                return False
            if not restarted_here:
                here = self.local.restart_cell(row_id, ended_before=ended_before)
                if not here and done is None:
                    return False
                restarted_here = True
            self.layout.remove_result(run, key)
            self.layout.add_todo(run, key)
            self._pending.pop(row_id, None)
            self._pending[row_id] = "restart"
            return True

        answer, pushed = self._transact(restart, f"gpubench: run {row_id} again", self._push_tries)
        return self._pushed_or_warned(answer, pushed)

    def add_result(self, row_id: str, result: BenchmarkResult, requests: Iterable[RequestRecord] = (),
                   *, unpriced: bool = False) -> str:
        result_id = self.local.add_result(row_id, result, requests, unpriced=unpriced)
        with self._lock:
            # A finished cell's file gets the new result with the next push; an unfinished one's at its finish.
            if self._pending.get(row_id) != "restart":
                self._pending.pop(row_id, None)
                self._pending[row_id] = "publish"
        return result_id

    def cell(self, row_id: str) -> CellRecord | None:
        with self._lock:  # another thread's transaction must not reset the work tree under the read
            self._refresh()
            local = self.local.cell(row_id)
            run_id = local.run_id if local is not None else row_id.partition("/")[0]
            run, key = _names(row_id, run_id)
            return _overlay(local, self.layout.cell(run, key), run_id, self._holder)

    def cells(self, run_id: str | None = None) -> list[CellRecord]:
        with self._lock:
            self._refresh()
            return self._cells(run_id)

    def _cells(self, run_id: str | None) -> list[CellRecord]:
        local = self.local.cells(run_id)
        runs = [run_dir(run_id)] if run_id is not None else self.layout.runs()
        known_runs = {run_dir(found): found for found in self.local.run_ids()}
        repo = {(found.run, found.key): found for run in runs for found in self.layout.cells(run)}
        answer = []
        for cell in local:
            names = _names(cell.row_id, cell.run_id)
            answer.append(_overlay(cell, repo.pop(names, None), cell.run_id, self._holder))
        for (run, _), found in repo.items():
            answer.append(_overlay(None, found, run_id or known_runs.get(run, run), self._holder))
        return [cell for cell in answer if cell is not None]


def _remove_dead_clones(clones: Path) -> None:
    """Delete the clones that processes of this host left when they were killed (nothing in them
    is lost: what they had not pushed is in the local manifest, their claims expire)."""
    host = socket.gethostname()
    for clone in clones.iterdir():
        owner, _, pid = clone.name.rpartition("-")[0].rpartition("-")
        if owner != host or not pid.isdigit() or not clone.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(clone, ignore_errors=True)
        except PermissionError:
            pass  # another user's process: alive


def _names(row_id: str, run_id: str) -> tuple[str, str]:
    """The run's and the cell's names in the repository."""
    return run_dir(run_id), file_name(row_id.removeprefix(f"{run_id}/"))


def _expired(held: ClaimFile, at: float) -> bool:
    return held.lease_expires_at is not None and held.lease_expires_at <= at


def _overlay(local: CellRecord | None, repo: RepoCell | None, run_id: str,
             holder: Callable[[str | None, str], str | None]) -> CellRecord | None:
    """The cell as the repository says it is now (done, claimed), over what the local manifest knows."""
    if repo is None or (repo.result is None and repo.claim is None):
        if local is not None or repo is None or not repo.todo:
            return local
        return CellRecord(row_id=f"{run_id}/{repo.key}", run_id=run_id, cell_id=repo.key, gpu_type="",
                          provider="", model="", status="pending")
    base = local.model_dump() if local is not None else {
        "row_id": f"{run_id}/{repo.key}", "run_id": run_id, "cell_id": repo.key, "gpu_type": "", "provider": "",
        "model": ""}
    if repo.result is not None:
        said = {name: repo.result.cell.get(name) for name in _SHARED}
        said.update(status=repo.result.status, worker=holder(said["worker"], repo.result.host))
        identity = repo.result.cell
    else:
        said = dict.fromkeys(_SHARED)
        said.update(status="running", worker=holder(repo.claim.holder, repo.claim.host), started_at=repo.claim.since,
                    lease_expires_at=repo.claim.lease_expires_at)
        identity = repo.claim.cell
    if local is None:
        base.update({name: identity[name] for name in _IDENTITY if identity.get(name) is not None})
    if repo.result is not None and (local is None or local.worker != said["worker"]):
        # Finished elsewhere: its figures are the repository's too.
        base.update({name: value for name, value in repo.result.cell.items() if name in _OUTCOME})
    return CellRecord.model_validate({**base, **said})
