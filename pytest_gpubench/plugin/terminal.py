"""What the terminal shows: fail-fast API check, live progress and the summary table.

Registered only in the process that owns the terminal (the xdist controller, or
the single pytest process).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from ..cloud.budget import skipped_by_budget, spend_of, summary_line
from ..errors import ApiUnreachable
from ..run.live import LiveProgress, own_line
from .matrix_scan import matrix_files, runs_matrix_files
from ..errors import redact
from ..store.records import summary_title
from .stash import SANDBOX_KEY, SETTINGS_KEY, run_context
from ..report.summary_table import SummaryTable, exact_figures


class TerminalHooks:
    """Hooks of the terminal-owning process."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.summary = SummaryTable()
        self.live: LiveProgress | None = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = self.config
        if config.option.collectonly or config.option.showfixtures or config.option.show_fixtures_per_test:
            return
        settings = config.stash[SETTINGS_KEY]
        if runs_matrix_files(config):
            try:
                for cloud in _clouds_of_run(config):
                    run_context(config).provider_for(cloud)  # fail fast, before any worker starts
            except ApiUnreachable as exc:
                raise pytest.UsageError(str(exc)) from None
        if settings.live and config.option.verbose >= 0:
            self.live = LiveProgress(settings.progress_dir / settings.run_id, self._write)
            self.live.start()

    def _write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        if capture is not None:
            # Without xdist the tests run in this process with output captured.
            with capture.global_and_fixture_disabled():
                own_line(self.config, reporter, line)
        else:
            own_line(self.config, reporter, line)

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter writes the cell's letter
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.live is not None:
            # What the cell wrote up to its report (its ERROR line, for a failure) comes first.
            self.live.poll()
        if report.when == "teardown":
            self.summary.add(dict(report.user_properties))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # The run's end is recorded by the lifecycle (plugin/lifecycle.py), by the last
        # controller of a shared run, not here by every one that ends.
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _billed(self, run_id: str) -> float | None:
        """What the run's sessions cost (the attempts table, where a shared session is one
        row), or None when it has none (cells that never rented)."""
        try:
            attempts = run_context(self.config).store.attempts(run_id)
        except Exception:  # noqa: BLE001 - the summary falls back to the cells' own figures
            return None
        return spend_of(attempts, datetime.now(timezone.utc)).spent if attempts else None

    def _exact(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The cells' stored figures, unrounded; empty when the store cannot say."""
        try:
            return exact_figures(run_context(self.config).store.results(run_id))
        except Exception:  # noqa: BLE001 - the summary falls back to the rounded properties
            return {}

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        settings = self.config.stash[SETTINGS_KEY]
        if self.summary.rows:
            if settings.columns:
                self.summary.columns = settings.columns
            terminalreporter.write_sep("=", summary_title(settings), yellow=settings.sandbox)
            billed = self._billed(settings.run_id)
            for line in self.summary.render(billed, self._exact(settings.run_id)):
                terminalreporter.write_line(line)
            for row in sorted(self.summary.rows, key=lambda r: str(r.get("gpubench_cell", ""))):
                if row.get("gpubench_comparison"):
                    terminalreporter.write_line(f"{row['gpubench_cell']}: {row['gpubench_comparison']}")
                if row.get("gpubench_invalid_because"):
                    terminalreporter.write_line(
                        f"{row['gpubench_cell']}: not a valid GPU figure: {row['gpubench_invalid_because']}",
                        yellow=True)
            if settings.budget is not None:
                spent = billed if billed is not None else sum(
                    float(r.get("gpubench_cost_usd") or 0) for r in self.summary.rows)
                cells = run_context(self.config).store.cells(settings.run_id)
                skipped = sum(1 for c in cells if c.status == "skipped" and skipped_by_budget(c.error_message))
                terminalreporter.write_line(summary_line(settings.budget, spent, skipped))
            terminalreporter.write_line(f"run {settings.run_id}; store {redact(settings.store_location)}; "
                                        f"progress files {settings.progress_dir / settings.run_id}")
        sandbox = self.config.stash.get(SANDBOX_KEY, None)
        if sandbox is not None:
            left = sandbox.running_sessions()
            if left:
                terminalreporter.write_line(
                    f"gpubench sandbox: {len(left)} session(s) still running: {', '.join(left)}", red=True)


def _clouds_of_run(config: pytest.Config) -> list[str]:
    """The registered clouds the run's matrix files rent through, to check before any cell runs:
    a run of running endpoints only (``runtime: openai``) needs no GPU Shopper API. A file that
    cannot be read counts as the default cloud (collection reports what is wrong with it)."""
    from ..cloud.registry import is_known
    from ..matrix.cells import DEFAULT_CLOUD, load_cells

    clouds: set[str] = set()
    for path in matrix_files(config):
        try:
            clouds.update(cell.cloud for cell in load_cells(path))
        except Exception:  # noqa: BLE001 - a broken file is collection's to report
            clouds.add(DEFAULT_CLOUD)
    return sorted(cloud for cloud in clouds if is_known(cloud))
