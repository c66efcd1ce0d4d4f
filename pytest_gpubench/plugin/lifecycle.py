"""Hooks that keep sessions from outliving the run: SIGTERM, start-up, dead workers, the end.

Thin glue; the work is in :mod:`.cleanup` (and :mod:`.shutdown` for SIGTERM):

* SIGTERM becomes an orderly stop like Ctrl-C, so teardowns release sessions
  (every process of a run with benchmark cells; the xdist controller passes it on
  to its workers).
* At the start of a run (the controller, before any cell runs), sessions that dead
  runs of the same manifest left running are released; their cells are marked failed as
  ``abandoned``, which the next controller of their run takes over and runs (this one,
  when it joins that run).
* When an xdist worker dies, the controller releases its sessions and marks its
  unfinished cells failed; at the end of the run it releases whatever of the run
  is still open and records the run's end.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..aio import run as run_async
from ..cloud.provider import Provider
from ..run.cleanup import CleanupReport, ReleaseOutcome, clean_each
from ..errors import ApiUnreachable, Stage
from ..run.live import own_line
from ..store.opening import open_store, store_exists
from ..errors import redact
from .matrix_scan import runs_matrix_files
from .fixtures import run_status
from ..cloud.processes import ProcessIdentity, xdist_worker_pids
from ..run.cleanup import others_running, shared_run_status
from ..run.shutdown import GracefulTermination
from .stash import CELL_KEY, RESUME_KEY, SETTINGS_KEY, run_context

class RunLifecycle:
    """Registered as ``gpubench-lifecycle`` in every process of a run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.controller = not hasattr(config, "workerinput")
        self.termination = GracefulTermination(forward_to=xdist_worker_pids if self.controller else None)
        self.dead_workers: list[str] = []
        self.started = False  # the start-up cleanup ran
        settings = config.stash[SETTINGS_KEY]
        # Known before collection for matrix files; Python tests install it once collected.
        self.runs_cells = runs_matrix_files(config) or bool(settings.resume)
        if self.runs_cells and not config.option.collectonly:
            self.termination.install()

    # ------------------------------------------------------------------ hooks

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        plan = config.stash.get(RESUME_KEY, None)
        return plan.header() if plan is not None else None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        plan = self.config.stash.get(RESUME_KEY, None)
        if plan is not None and self.controller and self.config.option.verbose < 0:
            terminalreporter.write_line(plan.header())  # -q hides the header that says it

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.runs_cells:
            self._start()

    def _start(self) -> None:
        """Release what dead runs left; for a resumed run, make sure nothing of it is left."""
        config = self.config
        if not self.controller or config.option.collectonly or self.started:
            return
        self.started = True
        settings = config.stash[SETTINGS_KEY]
        self._clean(f"the start of run {settings.run_id}", reason="its run's process went away",
                    check_liveness=True, search_api=True)
        plan = config.stash.get(RESUME_KEY, None)
        if plan is not None and store_exists(settings.store_location):
            with open_store(settings.store_location) as store:
                left = store.unreleased_sessions(plan.run_id)
            if left:
                ids = ", ".join(s.session_id for s in left)
                raise pytest.UsageError(
                    f"--gpubench-resume: run {plan.run_id} still has sessions that could not be released "
                    f"({ids}): run `gpubench cleanup --api {redact(settings.api)}` and resume again")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Python tests on matrix cells are known only now (in the process that collects)."""
        if not session.config.option.collectonly and any(CELL_KEY in item.stash for item in session.items):
            self.termination.install()
            self._start()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """After every teardown (and every worker): release what of this run is still open."""
        if not self.controller or self.config.option.collectonly:
            return
        settings = self.config.stash[SETTINGS_KEY]
        if not store_exists(settings.store_location):
            return
        with open_store(settings.store_location) as store:
            run = store.run(settings.run_id)
        if run is None:
            return  # this run recorded nothing: nothing can be left
        # Listing the API is for sessions a dying process created but never recorded.
        interrupted = int(exitstatus) not in (0, 1) or bool(self.dead_workers)
        # Only what this controller and its workers hold: other controllers may share the run.
        self._clean("the run's controller, at its end", reason="the run ended", run_id=settings.run_id,
                    worker=ProcessIdentity.current().holder(), check_liveness=False, search_api=interrupted,
                    close_running=True)
        me = ProcessIdentity.current().holder()
        with open_store(settings.store_location) as store:
            still = others_running(store, settings.run_id, me)
            if still is not None:  # the last controller of a shared run records its end
                self._write(f"gpubench: run {settings.run_id} goes on under {still}: its end is theirs to record")
            else:
                store.finish_run(settings.run_id, shared_run_status(store, settings.run_id, run_status(exitstatus)))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.termination.uninstall()

    # ------------------------------------------------------------ from xdist

    def worker_down(self, worker: str, error: str) -> None:
        """An xdist worker died: release its sessions, fail the cells it was running."""
        self.dead_workers.append(worker)
        settings = self.config.stash[SETTINGS_KEY]
        holder = ProcessIdentity.current().holder(worker)  # what its cells' rows name it
        self._clean(f"the controller, after worker {holder} died", reason=f"worker {holder} died ({error})",
                    run_id=settings.run_id, worker=holder, check_liveness=False, search_api=False,
                    close_running=True)

    # ---------------------------------------------------------------- helpers

    def _clean(self, released_by: str, **scope: Any) -> CleanupReport | None:
        """One cleanup pass on this run's manifest and API; reports on the terminal, never raises."""
        settings = self.config.stash[SETTINGS_KEY]
        if not store_exists(settings.store_location):
            return None  # never create a manifest just to look into it
        context = run_context(self.config)
        providers: dict[str, Provider | None] = {}
        for cloud in context.cleanup_clouds():  # the clouds this run rents through, GPU Shopper last
            try:
                providers[cloud] = context.provider_for(cloud, record=False)
            except ApiUnreachable:
                providers[cloud] = None
        timeout = 3 * max(120.0, settings.stage_timeout(Stage.CLEANUP))
        try:
            with open_store(settings.store_location) as store:
                # The token goes only to the configured API; progress lines only under the configured folder.
                report = run_async(clean_each(store, providers, settings_of=context.recorded_clouds(),
                                              api=settings.api, released_by=released_by,
                                              progress_dir=settings.progress_dir, **scope), timeout)
        except Exception as exc:  # noqa: BLE001 - cleanup reports; it never breaks the run
            self._write(f"gpubench: cleanup by {released_by} failed: {type(exc).__name__}: {exc}", red=True)
            return None
        for action in report.actions:
            if action.outcome is not ReleaseOutcome.LEFT_ALONE:
                self._write(f"gpubench: {action.line()}", red=action.outcome is ReleaseOutcome.FAILED)
        # A dead holder's cell (found by a liveness check) is abandoned: whoever claims it next runs it.
        abandoned = " (abandoned: its run's next controller takes it over)" if scope.get("check_liveness") else ""
        for row_id in report.closed_cells:
            self._write(f"gpubench: cell {row_id} marked failed{abandoned}: {scope.get('reason', 'stopped')}")
        alone = report.count(ReleaseOutcome.LEFT_ALONE)
        if alone and scope.get("run_id") is None:
            self._write(f"gpubench: {alone} session(s) of other runs left alone (still running, or on another "
                        "API): see `gpubench cleanup --dry-run`")
        return report

    def _write(self, line: str, red: bool = False) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            own_line(self.config, reporter, line, red=red)  # not glued to "[100%]"
