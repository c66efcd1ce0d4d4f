"""Release GPU sessions that a run could not release itself, and record it.

A cell releases its own session in teardown (``fixtures.gpu_session``), also after
a failure, a pytest-timeout of the ``signal`` method, Ctrl-C or SIGTERM. What a
process cannot release because it died (SIGKILL, an xdist worker crash,
pytest-timeout's ``thread`` method, a power cut) is released here:

* by the xdist controller, for a worker that crashed and at the end of its run;
* at the start of the next run that uses the same manifest;
* by ``gpubench cleanup``.

Sessions are listed and released through the run's
:class:`~pytest_gpubench.cloud.provider.Provider`; what the run recorded is read and
written through the :class:`~pytest_gpubench.store.base.Store` protocol and its typed
records (:class:`~pytest_gpubench.store.records.RunInfo`: whether a run may still be
going on), whichever store is behind it.

**Ownership.** Only sessions this manifest owns are touched: a session id recorded
in it, or a session whose ``consumer_id`` was made by
:func:`~pytest_gpubench.cloud.provider.consumer_id` for one of its runs
(``gpubench-<run id>-...``). Anything else on the API is someone else's.

**Liveness.** A run still going on in another process keeps its sessions: a run
without ``finished_at`` whose owning process (pid, host and start time in the
``runs`` table) is alive is left alone, and so is one on another host, where
that cannot be checked.

**Claims.** Controllers sharing a run hold its cells with leases (``plugin/claims.py``);
the run's recorded owner is only one of them. A session is left alone while the
controller its cell names (the cell's recorded holder, ``host:pid:nonce[/gwN]``) holds a
live lease on any cell of the run, or runs on this host: that covers a session kept for
the next cell of a reuse group, and one only the API knows. A cell is marked failed
only while it still runs under the holder cleanup found it with (``if_held_by``): one a
live controller took over meanwhile is its. A cell whose holder cleanup found gone
(``check_liveness``: the start of a run, ``gpubench cleanup``) is marked ``failed`` as
:data:`~pytest_gpubench.store.base.ABANDONED`: its run never failed it, and the next controller of its run that
reaches it takes it over and runs it (``store/base.py``), as it would a running
cell whose lease ran out.

**Release.** The provider's one release path (:meth:`.Provider.release`, the
same teardown uses): ``done``, then ``DELETE`` if the session is still active (or
``failed``, which may still hold an instance). The manifest records the final
status, who released it (``released_by``) and when; a cell its dead process left
``running`` is marked ``failed`` at the stage its progress file last reached.

**The store is data.** A shared store's rows are anyone's to write, so nothing in them is
followed: the token goes only to the API the caller configured (``api``; runs recorded against
another API are left alone with a line saying how to clean them), a session id that is not an id
(:mod:`pytest_gpubench.ids`) is never sent to an API, and progress lines are written (and read)
only in the cell's file under the configured progress folder (``progress_dir``), found from the
cell's ids, never at the path a row's ``progress_file`` names.

**The run's end.** Of the controllers sharing a run, the last records its end
(:func:`others_running`, :func:`shared_run_status`, at the end of this module).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..errors import ApiError, Stage, StageError
from ..ids import is_id, shown_id
from ..errors import redact
from ..cloud.hosts_provider import on_leased_machine
from ..cloud.processes import ProcessIdentity, held_by, holder_alive
from ..store.base import ABANDONED
from ..store.progress import ProgressWriter, existing_progress_file, read_progress
from ..store.records import RunInfo
from ..cloud.provider import CONSUMER_PREFIX, OwnedSession, Provider, Released, Session, consumer_id
from ..cloud.registry import LEASING_MACHINES, RENTING_NOTHING, is_known, same_cloud
from ..matrix.cells import DEFAULT_CLOUD

if TYPE_CHECKING:
    from ..store.base import Store

#: The stage a cell is in once its progress file shows this STATUS line.
_STAGE_AFTER = {
    "STARTING": Stage.INVENTORY,
    "INVENTORY_QUERY": Stage.PROVISION,
    "PROVISIONING": Stage.SSH_WAIT,
    "SSH_READY": Stage.SSH_CONNECT,
    "SYSTEM_INFO": Stage.RUNTIME_SETUP,
    "OLLAMA_INSTALLED": Stage.MODEL_PULL,
    "MODEL_READY": Stage.BENCHMARK,
    "RUN_COMPLETE": Stage.BENCHMARK,
    "BENCHMARK_COMPLETE": Stage.RESULTS,
    "RESULTS_COLLECTED": Stage.RESULTS,
    "CLEANUP": Stage.CLEANUP,
}


def same_api(a: str | None, b: str | None) -> bool:
    """Whether two API base URLs name the same server (a missing one matches any): the same scheme,
    host, port (a scheme's default one spelled or not) and path; credentials do not count (a stored
    URL has them redacted, ``user:***@``), nor a trailing ``/``."""
    if not a or not b:
        return True
    return _api_key(a) == _api_key(b)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _api_key(url: str) -> tuple[str, str, int | None, str] | str:
    """What tells an API apart: (scheme, host, port, path); the text itself when it is no URL."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip().rstrip("/").lower()
    scheme = parts.scheme.lower()
    if not scheme or not parts.hostname:
        return url.strip().rstrip("/").lower()
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS.get(scheme), parts.path.rstrip("/")


def shown_url(url: str | None) -> str:
    """A URL from a store, fit for one line: credentials redacted, control characters dropped."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", "", redact(url or ""))


def owning_run(consumer_id: str, run_ids: Iterable[str]) -> str | None:
    """The run of ``run_ids`` whose cells make consumer ids like ``consumer_id``, or None.

    Run ids may contain ``-`` and one may begin another (``nightly``,
    ``nightly-2``): the longest run id that fits wins.
    """
    if not consumer_id.startswith(CONSUMER_PREFIX):
        return None
    fitting = [r for r in run_ids if r and consumer_id.startswith(f"{CONSUMER_PREFIX}{r}-")]
    return max(fitting, key=len) if fitting else None


def stage_reached(progress_file: str | Path | None) -> Stage:
    """The stage a cell was in when its progress file stopped (inventory if unknown).

    ``progress_file`` is one :func:`~pytest_gpubench.store.progress.existing_progress_file` found,
    never a path from a store row; a symlink is not read.
    """
    stage = Stage.INVENTORY
    if not progress_file or not Path(progress_file).is_file():
        return stage
    try:
        lines = read_progress(progress_file, follow_symlinks=False)
    except OSError:
        return stage
    for line in lines:
        # A CLEANUP line with by= is this module's own, written after the cell stopped.
        if line.kind == "STATUS" and line.label in _STAGE_AFTER and "by" not in line.fields:
            stage = _STAGE_AFTER[line.label]
    return stage


class Leftover(OwnedSession):
    """A session this manifest owns that may still be running."""

    model_config = ConfigDict(frozen=False)

    found_by: str = "manifest"  # or "api": only the API knew it (by consumer_id)

    def describe(self) -> str:
        cell = f", cell {_printable(self.cell_id)}" if self.cell_id else ""
        return f"session {_printable(self.session_id)} (run {_printable(self.run_id)}{cell})"


def _printable(text: str) -> str:
    """Text from a store fit for one line: an id as it is, anything else quoted with escapes shown."""
    return text if is_id(text) else shown_id(text)


class ReleaseOutcome(str, Enum):
    """What releasing one leftover session came to (a cleanup action's outcome)."""

    RELEASED = "released"
    ALREADY_ENDED = "already ended"
    NOT_FOUND = "not found"
    WOULD_RELEASE = "would release"
    ENDED_WITH_SANDBOX = "ended with its sandbox"
    LEASE_ENDED = "GPU lease ended"
    LEFT_ALONE = "left alone"
    FAILED = "failed"


class Action(BaseModel):
    """What cleanup did (or would do) about one session."""

    leftover: Leftover
    outcome: ReleaseOutcome
    before: str | None = None
    after: str | None = None
    detail: str = ""

    def line(self) -> str:
        change = ""
        if self.before and self.after and self.before != self.after:
            change = f": {self.before} -> {self.after}"
        elif self.before:
            change = f": {self.before}"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.outcome.value} {self.leftover.describe()}{change}{detail}"


class CleanupReport(BaseModel):
    """Everything one cleanup pass found and did."""

    actions: list[Action] = []
    #: Cells marked failed because their process died before they finished.
    closed_cells: list[str] = []
    notes: list[str] = []
    dry_run: bool = False

    def count(self, *outcomes: ReleaseOutcome) -> int:
        return sum(1 for a in self.actions if a.outcome in outcomes)

    @property
    def failed(self) -> int:
        return self.count(ReleaseOutcome.FAILED)

    @property
    def changed(self) -> bool:
        """Whether anything was released, found ended or recorded."""
        return bool(self.closed_cells) or any(a.outcome is not ReleaseOutcome.LEFT_ALONE for a in self.actions)

    def lines(self) -> list[str]:
        out = [a.line() for a in self.actions]
        out += [f"marked failed: cell {row_id} (stopped before it finished)" for row_id in self.closed_cells]
        return out + self.notes

    def summary(self) -> str:
        if not self.actions and not self.closed_cells:
            return "nothing to clean up: no session of this manifest's runs is left running"
        parts = []
        for outcome in ReleaseOutcome:
            n = self.count(outcome)
            if n:
                parts.append(f"{n} {outcome.value}")
        if self.closed_cells:
            parts.append(f"{len(self.closed_cells)} cell(s) marked failed")
        return ", ".join(parts) + ("; dry run: nothing was changed" if self.dry_run else "")

    def merge(self, other: CleanupReport) -> None:
        """Add another pass's findings; a session appears once, as the pass that acted on it saw it."""
        acted = {a.leftover.session_id for a in self.actions + other.actions if a.outcome is not ReleaseOutcome.LEFT_ALONE}
        seen: set[tuple[str, ReleaseOutcome]] = set()
        merged = []
        for action in self.actions + other.actions:
            key = (action.leftover.session_id, action.outcome)
            if key in seen or (action.outcome is ReleaseOutcome.LEFT_ALONE and action.leftover.session_id in acted):
                continue
            seen.add(key)
            merged.append(action)
        self.actions = merged
        self.closed_cells += [c for c in other.closed_cells if c not in self.closed_cells]
        self.notes += other.notes


class Survey(BaseModel):
    """The manifest's side of a cleanup: what to release on one API and what not to touch."""

    to_release: list[Leftover] = []
    ended_with_sandbox: list[Leftover] = []
    #: Sessions on machines the run does not own (hosts, local): their GPU lease is ended, nothing rented.
    leased_machines: list[Leftover] = []
    left_alone: list[Action] = []
    #: Every run the manifest knows, for telling owned consumer ids.
    known_runs: dict[str, RunInfo] = {}
    #: The cloud the survey was made for (:class:`Through`).
    through: str = DEFAULT_CLOUD


class LiveHolders:
    """Which controllers hold a live claim in each run, read from the store once per run."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._live: dict[str, dict[str, str]] = {}

    def of(self, run_id: str) -> dict[str, str]:
        """``{controller: cell id}`` of the run's cells running under a live lease whose holder
        is not known dead (a controller is a holder without its ``/gwN``)."""
        if run_id not in self._live:
            now, live = time.time(), {}
            for cell in self.store.cells(run_id):
                if (cell.status == "running" and cell.worker and cell.lease_expires_at is not None
                        and cell.lease_expires_at > now and holder_alive(cell.worker) is not False):
                    live.setdefault(controller_of(cell.worker), cell.cell_id)
            self._live[run_id] = live
        return self._live[run_id]

    def why_kept(self, leftover: Leftover) -> str | None:
        """Why ``leftover`` must be left alone although its run's owner is gone: the controller
        its cell names still holds a live claim in the run, or runs on this host. None: nothing
        holds it."""
        holder = leftover.worker
        if not holder:
            return None
        held = self.of(leftover.run_id).get(controller_of(holder))
        if held is not None:
            return f"its cell's holder {holder} still holds a live claim in run {leftover.run_id} (cell {held})"
        if holder_alive(holder):
            return f"its cell's holder {holder} still runs on this host"
        return None


def controller_of(holder: str) -> str:
    """The controller a claim holder belongs to: ``host:pid:nonce`` of ``host:pid:nonce/gw1``."""
    return holder.split("/", 1)[0]


@dataclass(frozen=True)
class Through:
    """The cloud a cleanup pass releases through, as the user configured it: its ``cloud:`` name
    and what a run records of it (``registry.recorded_settings``). A run rented through another
    cloud is left alone by this pass (:meth:`CleanupReport.merge` drops that line when another
    pass, through that cloud, acted on its session)."""

    cloud: str = DEFAULT_CLOUD
    settings: Mapping[str, str] = field(default_factory=dict)


def renting_clouds(run: RunInfo) -> list[str]:
    """The clouds ``run`` rented sessions through: those it recorded, less the ones that rent
    nothing or lease machines (whose sessions no API holds); none recorded: GPU Shopper, what every
    run rented through before clouds were recorded."""
    renting = [cloud for cloud in run.clouds if cloud not in RENTING_NOTHING | LEASING_MACHINES]
    return renting or [DEFAULT_CLOUD]


def survey(
    store: Store, *, api: str | None, run_id: str | None = None, worker: str | None = None,
    check_liveness: bool = True, me: ProcessIdentity | None = None, live: LiveHolders | None = None,
    through: Through | None = None,
) -> Survey:
    """Sort the store's unreleased sessions: to release through ``api``, ended, left alone.

    ``run_id`` and ``worker`` narrow the scope (a run's own end, a crashed worker; ``worker`` is a claim
    holder, ``host:pid``, which also covers its xdist workers ``host:pid/gwN``);
    ``check_liveness=False`` is for the process that owns the run. ``through``: the cloud this pass
    releases through (default: GPU Shopper at ``api``).
    """
    through = through or Through()
    runs = _all_runs(store)
    result = Survey(known_runs=runs, through=through.cloud)
    live = live or LiveHolders(store)
    for found in store.unreleased_sessions(run_id):
        leftover = Leftover.model_validate(found, from_attributes=True)
        if worker is not None and not held_by(leftover.worker, worker):
            continue
        if not is_id(leftover.session_id):  # a row written by hand or by someone else: never sent to an API
            result.left_alone.append(Action(leftover=leftover, outcome=ReleaseOutcome.LEFT_ALONE,
                                            detail=f"its session id is not a valid id ({_INVALID_ID})"))
            continue
        run = runs.get(leftover.run_id) or RunInfo(run_id=leftover.run_id)
        if on_leased_machine(leftover.session_id):  # no API holds it: only a live run must be left alone
            running = run.still_running(me) if check_liveness else None
            if running:
                alone = Action(leftover=leftover, outcome=ReleaseOutcome.LEFT_ALONE, detail=running)
                result.left_alone.append(alone)
            else:
                result.leased_machines.append(leftover)
            continue
        reason = _releasable(run, api, check_liveness, me, through)
        if reason is None and check_liveness:
            reason = live.why_kept(leftover)
        if reason is None:
            result.to_release.append(leftover)
        elif reason == "sandbox":
            result.ended_with_sandbox.append(leftover)
        else:
            result.left_alone.append(Action(leftover=leftover, outcome=ReleaseOutcome.LEFT_ALONE, detail=reason))
    return result


def _releasable(run: RunInfo, api: str | None, check_liveness: bool, me: ProcessIdentity | None,
                through: Through) -> str | None:
    """None when ``run``'s sessions may be released through ``api`` (``through``'s cloud); else why
    not ("sandbox": they ended)."""
    if check_liveness:
        running = run.still_running(me)
        if running:
            return running
    renting = renting_clouds(run)
    name = _printable(run.run_id)
    if len(renting) > 1:  # a session does not record its cloud: never sent to the wrong one
        return (f"run {name} rented through several clouds ({', '.join(map(shown_url, renting))}): "
                "end its sessions on each cloud's console")
    if renting[0] != through.cloud:
        installed = "" if is_known(renting[0]) else " (not installed here)"
        return f"run {name} rented through the {shown_url(renting[0])} cloud{installed}: gpubench cleanup ends its sessions"
    if through.cloud != DEFAULT_CLOUD:
        recorded = run.clouds.get(through.cloud, {})
        if not same_cloud(recorded, through.settings):
            # Its settings are data: compared, never used; the provider is the user's configuration.
            shown = ", ".join(f"{key} {shown_url(value)}" for key, value in sorted(recorded.items()))
            return f"run {name} used the {through.cloud} cloud with {shown or 'other settings'}: configure it so"
        return None
    if not same_api(run.clouds.get(DEFAULT_CLOUD, {}).get("api") or run.api, api):
        if run.sandbox:
            return "sandbox"  # its own sandbox stopped every session when the run's process went away
        # The token goes to the configured API only: the user decides whether the run's is theirs.
        other = shown_url(run.api)
        return f"run {_printable(run.run_id)} used the API at {other}: gpubench cleanup --api {other}"
    return None


#: Why a session id from a store is not used.
_INVALID_ID = "not sent to any API: a store row written by hand or by someone else?"


def _all_runs(store: Store) -> dict[str, RunInfo]:
    """Every run the store knows, by id (one known only from its cells has no run record)."""
    return {run_id: RunInfo.of(run) if (run := store.run(run_id)) is not None else RunInfo(run_id=run_id)
            for run_id in store.run_ids()}


async def find_on_api(
    provider: Provider, store: Store, found: Survey, *, run_id: str | None = None,
    check_liveness: bool = True, me: ProcessIdentity | None = None, live: LiveHolders | None = None,
) -> tuple[list[Leftover], list[Action]]:
    """Active sessions the API lists under this store's consumer ids that the store lacks.

    A create that reached the server just before its process died leaves such a
    session. Returns what to release (matched to its cell's row where the consumer
    id names one), and what belongs to runs still going on (left alone).
    """
    known = {lo.session_id for lo in found.to_release} | {a.leftover.session_id for a in found.left_alone}
    known |= {lo.session_id for lo in found.ended_with_sandbox}
    leftovers, alone = [], []
    live = live or LiveHolders(store)
    for session in await provider.owned_sessions():
        if session.id in known:
            continue
        owner = owning_run(session.consumer_id, found.known_runs)
        if owner is None or (run_id is not None and owner != run_id):
            continue  # not ours (or not this pass's run): never touched
        if found.through not in renting_clouds(found.known_runs[owner]):
            continue  # its run rented through another cloud: not this provider's to end
        leftover = Leftover(session_id=session.id, run_id=owner, consumer_id=session.consumer_id, found_by="api",
                            **_cell_of_consumer(store, owner, session.consumer_id))
        running = None
        if check_liveness:
            running = found.known_runs[owner].still_running(me) or await asyncio.to_thread(live.why_kept, leftover)
        if running is None:
            leftovers.append(leftover)
        else:
            alone.append(Action(leftover=leftover, outcome=ReleaseOutcome.LEFT_ALONE, before=session.status, detail=running))
    return leftovers, alone


def _cell_of_consumer(store: Store, run_id: str, consumer: str) -> dict[str, Any]:
    """The cell (and attempt) that made ``consumer``, as Leftover fields."""
    for cell in store.cells(run_id):
        base = consumer_id(run_id, cell.cell_id, 1).removesuffix("-a1")
        match = re.fullmatch(re.escape(base) + r"-a(\d+)", consumer)
        if match:
            return {"row_id": cell.row_id, "cell_id": cell.cell_id, "cell_status": cell.status,
                    "worker": cell.worker, "progress_file": cell.progress_file, "attempt": int(match[1])}
    return {}


async def release(provider: Provider, leftover: Leftover, *, dry_run: bool = False) -> Action:
    """End one session through the provider's one release path (:meth:`Provider.release`);
    never raises. A session id that is not an id (:mod:`pytest_gpubench.ids`) is never sent."""
    if not is_id(leftover.session_id):
        return Action(leftover=leftover, outcome=ReleaseOutcome.LEFT_ALONE,
                      detail=f"its session id is not a valid id ({_INVALID_ID})")
    try:
        if dry_run:
            current = await _status(provider, leftover.session_id)
            before = current.status if current is not None else None
            if before is not None and before != "stopped":
                return Action(leftover=leftover, outcome=ReleaseOutcome.WOULD_RELEASE, before=before)
            released = Released(session_id=leftover.session_id, before=before, after=before)
        else:
            released = await provider.release(leftover.session_id)
    except (StageError, OSError) as exc:
        return Action(leftover=leftover, outcome=ReleaseOutcome.FAILED, detail=str(exc))
    return action_for(leftover, released)


def action_for(leftover: Leftover, released: Released) -> Action:
    """What a release found and left, as cleanup reports and records it."""
    before, after = released.before, released.after
    if not released.found:
        return Action(leftover=leftover, outcome=ReleaseOutcome.NOT_FOUND, detail="the API has no such session")
    if released.already_ended:
        return Action(leftover=leftover, outcome=ReleaseOutcome.ALREADY_ENDED, before=before, after=before)
    if released.still_holding:
        return Action(leftover=leftover, outcome=ReleaseOutcome.FAILED, before=before, after=after,
                      detail="still active after done and DELETE: check it on the provider's console")
    return Action(leftover=leftover, outcome=ReleaseOutcome.RELEASED, before=before, after=released.final_status)


async def _status(provider: Provider, session_id: str) -> Session | None:
    try:
        return await provider.get_session(session_id, Stage.CLEANUP)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def record(store: Store, action: Action, released_by: str, progress_dir: Path | None = None) -> None:
    """Write what happened to a session into its cell and its progress file (the cell's file
    under ``progress_dir``, the configured folder, if it is there; None: no progress line)."""
    leftover = action.leftover
    if action.outcome in (ReleaseOutcome.RELEASED, ReleaseOutcome.ALREADY_ENDED):
        status = action.after or "stopped"
    elif action.outcome is ReleaseOutcome.NOT_FOUND:
        status = "not_found"
    elif action.outcome in (ReleaseOutcome.ENDED_WITH_SANDBOX, ReleaseOutcome.LEASE_ENDED):
        status = "stopped"
    else:
        return
    if leftover.row_id is None:
        return
    try:
        store.record_release(leftover.row_id, leftover.session_id, session_status=status,
                                released_by=released_by, attempt=leftover.attempt)
    except KeyError:
        return
    _append(existing_progress_file(progress_dir, leftover.run_id, _record_key(leftover)),
             lambda writer: writer.status("CLEANUP", session_id=leftover.session_id, status=status, by=released_by))


def _record_key(leftover: Leftover) -> str | None:
    """The leftover's cell's record key: its cell id, else what its row id says after the run's."""
    if leftover.cell_id:
        return leftover.cell_id
    prefix = f"{leftover.run_id}/"
    return leftover.row_id.removeprefix(prefix) if leftover.row_id and leftover.row_id.startswith(prefix) else None


def _append(path: Path | None, write: Any) -> None:
    """One progress line into ``path`` (an :func:`existing_progress_file`), never through a symlink;
    a file that cannot be written is left as it is (cleanup records in the store in any case)."""
    if path is None:
        return
    writer = ProgressWriter(path, follow_symlinks=False)
    try:
        write(writer)
    except OSError:
        pass
    finally:
        writer.close()


def end_gpu_leases(store: Store, leftover: Leftover) -> int:
    """End the GPU leases the session's cell held (``hosts``/``local``); how many."""
    holder = f"{leftover.run_id}/{leftover.consumer_id}"
    held = [lease for lease in store.gpu_leases(active_at=time.time()) if lease.holder == holder]
    for lease in held:
        store.release_gpu_lease(lease.lease_id)
    return len(held)


def close_cells(store: Store, held: Mapping[str, str | None], reason: str, released_by: str,
                progress_dir: Path | None = None, *, abandoned: bool = False) -> list[str]:
    """Mark cells left ``running`` by a process that is gone as ``failed``; returns them.

    The stage comes from, and an ``ERROR:`` line goes to, the cell's progress file under
    ``progress_dir`` (see :func:`record`).

    ``held`` maps each row id to the holder cleanup found it under: a cell is closed only
    while it still runs under that holder (a compare-and-set), never one a live controller
    took over since (None: whoever holds it, for a row found with no holder).
    ``abandoned``: another process found the holder gone (not the holder's own controller):
    the cell is :data:`ABANDONED`, left for the next controller of its run to take over.
    """
    closed = []
    for row_id, holder in held.items():
        cell = store.cell(row_id)
        if cell is None or cell.status != "running" or (holder is not None and cell.worker != holder):
            continue
        progress = existing_progress_file(progress_dir, cell.run_id, cell.cell_id)
        stage = stage_reached(progress)
        message = f"{reason} before this cell finished"
        if cell.session_id:
            message += f"; its session was released by {released_by}"
        if abandoned:
            message += f"; the next controller of run {cell.run_id} that reaches it takes it over"
        if not store.finish_cell(row_id, status="failed", failure_stage=stage,
                                 failure_reason=ABANDONED if abandoned else "interrupted",
                                 error_message=message, if_held_by=cell.worker):
            continue  # taken over (or finished) between the read and the write
        _append(progress, lambda writer: writer.error(stage, message))
        closed.append(row_id)
    return closed


async def clean(
    store: Store, provider: Provider | None, *, api: str | None, released_by: str,
    reason: str, run_id: str | None = None, worker: str | None = None, check_liveness: bool = True,
    search_api: bool = True, close_running: bool = False, dry_run: bool = False,
    me: ProcessIdentity | None = None, progress_dir: Path | None = None, through: Through | None = None,
) -> CleanupReport:
    """One cleanup pass through ``api`` (``provider``; None when it cannot be reached).

    ``api`` is the API the user configured, the one ``provider`` talks to: only runs recorded
    against it are released (their sessions through ``provider``); the others are left alone.
    ``progress_dir`` is the configured progress folder (None: no progress line is written).
    ``through``: the cloud ``provider`` is (default: GPU Shopper at ``api``), as configured; runs
    recorded against another cloud, or the same one set up otherwise, are left alone.

    ``released_by`` is recorded with every release; ``reason`` says why the cells
    whose sessions are released stopped (e.g. ``worker gw1 crashed``).
    ``close_running`` also marks the scope's other ``running`` cells failed (a
    crashed worker's, or those left at the end of a run).
    """
    report = CleanupReport(dry_run=dry_run)
    live = LiveHolders(store)
    found = survey(store, api=api, run_id=run_id, worker=worker, check_liveness=check_liveness, me=me, live=live,
                   through=through)
    report.actions += found.left_alone
    leftovers = list(found.to_release)
    if provider is not None and search_api:
        try:
            extra, alone = await find_on_api(provider, store, found, run_id=run_id,
                                             check_liveness=check_liveness, me=me, live=live)
        except StageError as exc:
            report.notes.append(f"could not list the sessions at {shown_url(api)}: {exc}")
        else:
            leftovers += [lo for lo in extra if worker is None or held_by(lo.worker, worker)]
            report.actions += alone
    for leftover in found.ended_with_sandbox:
        action = Action(leftover=leftover, outcome=ReleaseOutcome.ENDED_WITH_SANDBOX,
                        detail="the run's own sandbox stopped every session when the run ended")
        report.actions.append(action)
        if not dry_run:
            record(store, action, "the run's sandbox, on exit", progress_dir)
    for leftover in found.leased_machines:
        action = Action(leftover=leftover, outcome=ReleaseOutcome.LEASE_ENDED,
                        detail="a machine the run does not own: its GPU lease is ended (it would run out anyway)")
        report.actions.append(action)
        if not dry_run:
            await asyncio.to_thread(end_gpu_leases, store, leftover)
            await asyncio.to_thread(record, store, action, released_by, progress_dir)
    touched: dict[str, str | None] = {}  # row id -> the holder it was found under
    for leftover in leftovers:
        if provider is None:
            action = Action(leftover=leftover, outcome=ReleaseOutcome.FAILED,
                            detail=f"the API at {shown_url(api)} cannot be reached")
        else:
            action = await release(provider, leftover, dry_run=dry_run)
        report.actions.append(action)
        if not dry_run:
            await asyncio.to_thread(record, store, action, released_by, progress_dir)
            if action.outcome not in (ReleaseOutcome.FAILED, ReleaseOutcome.LEFT_ALONE) and leftover.row_id:
                touched.setdefault(leftover.row_id, leftover.worker)
    if not dry_run:
        if close_running:
            for cell in store.cells(run_id):
                if cell.status == "running" and (worker is None or held_by(cell.worker, worker)):
                    touched.setdefault(cell.row_id, cell.worker)
        report.closed_cells = await asyncio.to_thread(close_cells, store, touched, reason, released_by,
                                                      progress_dir, abandoned=check_liveness)
    return report


def clouds_to_clean(store: Store, run_id: str | None = None) -> list[str]:
    """The clouds a cleanup of ``store`` (or of its run ``run_id``) releases through, one pass
    each: those its runs rented through that are installed here, GPU Shopper last and always
    (it also finds sessions only its API knows, as before runs recorded their cloud)."""
    runs = _all_runs(store)
    wanted = [runs[run_id]] if run_id is not None and run_id in runs else list(runs.values())
    found = {cloud for run in wanted for cloud in renting_clouds(run) if cloud != DEFAULT_CLOUD and is_known(cloud)}
    return [*sorted(found), DEFAULT_CLOUD]


async def clean_each(
    store: Store, providers: Mapping[str, Provider | None], *, settings_of: Mapping[str, Mapping[str, str]],
    api: str | None, close_running: bool = False, **scope: Any,
) -> CleanupReport:
    """One :func:`clean` pass per cloud of ``providers`` (``cloud:`` name -> its provider as the user
    configured it, None when it cannot be reached; ``settings_of``: what a run records of each),
    merged into one report. Each run's sessions go only to the cloud it recorded, configured as
    it recorded it; ``close_running`` is applied by the last pass, once every session is released."""
    report: CleanupReport | None = None
    clouds = list(providers)
    for index, cloud in enumerate(clouds):
        one = await clean(store, providers[cloud], api=api, through=Through(cloud, settings_of.get(cloud, {})),
                          close_running=close_running and index == len(clouds) - 1, **scope)
        if report is None:
            report = one
        else:
            report.merge(one)
    return report if report is not None else CleanupReport(dry_run=bool(scope.get("dry_run")))


# --------------------------------------------------------------------------------------------------
# Who records the end of a run several controllers share, and with which status.
#
# Each controller (``pytest`` process) of a shared run ends on its own. The run's end is
# recorded by the last of them: one that sees no cell of the run running under another
# controller with a live lease. Its status is the worst of its own exit status and the
# cells' outcomes, so a run whose earlier controller failed a cell does not read
# ``passed`` because the last one passed; a status an earlier controller recorded as
# ``failed`` is not overwritten (a run finished once may be started again: resume).


def others_running(store: Store, run_id: str, me: str) -> str | None:
    """A holder other than ``me`` (or its xdist workers) running a cell of ``run_id`` under a
    live lease (and not known dead), or None when this controller is the run's last."""
    now = time.time()
    for cell in store.cells(run_id):
        if (cell.status == "running" and cell.worker and not held_by(cell.worker, me)
                and cell.lease_expires_at is not None and cell.lease_expires_at > now
                and holder_alive(cell.worker) is not False):
            return cell.worker
    return None


def shared_run_status(store: Store, run_id: str, mine: str) -> str:
    """The run's end status when this controller is its last: ``mine`` (its own
    ``plugin.fixtures.run_status``), unless it is ``passed`` and either a cell of the run ended
    failed under any controller, or an earlier controller already recorded a worse end."""
    if mine != "passed":
        return mine
    if any(cell.status == "failed" for cell in store.cells(run_id)):
        return "failed"
    run = store.run(run_id)
    earlier = run.status if run is not None and run.finished_at else None
    return earlier if earlier not in (None, "running", "passed") else mine
