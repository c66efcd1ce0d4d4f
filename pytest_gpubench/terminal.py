"""What the terminal shows: fail-fast API check, live progress and the summary table.

Registered only in the process that owns the terminal (the xdist controller, or
the single pytest process).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from .budget import skipped_by_budget, spend_of, summary_line
from .errors import ApiUnreachable
from .live import LiveProgress
from .matrix_scan import runs_matrix_files
from .stash import SANDBOX_KEY, SETTINGS_KEY, run_context

COLUMNS = ("cell", "status", "tokens/s", "TTFT p50 ms", "$/M tokens", "cost $")


class SummaryTable:
    """One row per finished cell, from the properties its teardown report carries."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, properties: dict[str, Any]) -> None:
        if "gpubench_status" in properties:
            self.rows.append(properties)

    def render(self, billed: float | None = None) -> list[str]:
        """The table and a count line; ``billed`` is the run's bill from its sessions
        (a shared session once), else the cells' costs are summed."""
        table = [COLUMNS] + [
            (
                str(row.get("gpubench_cell", "")),
                _status(row),
                _tps(row),
                _fmt(row.get("gpubench_ttft_p50_ms"), "{:.0f}"),
                _fmt(row.get("gpubench_cost_per_million_tokens"), "{:.2f}"),
                _fmt(row.get("gpubench_cost_usd"), "{:.4f}"),
            )
            for row in sorted(self.rows, key=lambda r: str(r.get("gpubench_cell", "")))
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                           for i, cell in enumerate(line)) for line in table]
        total = billed if billed is not None else sum(float(r.get("gpubench_cost_usd") or 0) for r in self.rows)
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["gpubench_status"]] = counts.get(row["gpubench_status"], 0) + 1
        lines.append(", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
                     + f"; spent ${total:.4f}")
        return lines


def _status(row: dict[str, Any]) -> str:
    stage = row.get("gpubench_failure_stage")
    return f"{row['gpubench_status']} ({stage})" if stage else str(row["gpubench_status"])


def _tps(row: dict[str, Any]) -> str:
    """``195.3``, or ``195.3 ± 0.4`` over repeated runs, with ``!`` when not a valid GPU figure."""
    text = _fmt(row.get("gpubench_tokens_per_second"), "{:.1f}")
    if row.get("gpubench_tokens_per_second_std") is not None:
        text += f" ± {row['gpubench_tokens_per_second_std']:.1f}"
    return text + (" !" if row.get("gpubench_valid") is False else "")


def _fmt(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "-"


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
                run_context(config).provider  # noqa: B018 - fail fast, before any worker starts
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
                reporter.write_line(line)
        else:
            reporter.write_line(line)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.summary.add(dict(report.user_properties))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.summary.rows:
            status = {0: "passed", 1: "failed", 2: "interrupted"}.get(int(exitstatus), f"exit {int(exitstatus)}")
            context = run_context(self.config)
            context.manifest.finish_run(context.run_id, status)

    def _billed(self, run_id: str) -> float | None:
        """What the run's sessions cost (the attempts table, where a shared session is one
        row), or None when it has none (cells that never rented)."""
        try:
            attempts = run_context(self.config).manifest.attempts(run_id)
        except Exception:  # noqa: BLE001 - the summary falls back to the cells' own figures
            return None
        return spend_of(attempts, datetime.now(timezone.utc)).spent if attempts else None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        settings = self.config.stash[SETTINGS_KEY]
        if self.summary.rows:
            terminalreporter.write_sep("=", "gpubench summary")
            billed = self._billed(settings.run_id)
            for line in self.summary.render(billed):
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
                cells = run_context(self.config).manifest.cells(settings.run_id)
                skipped = sum(1 for c in cells if c["status"] == "skipped" and skipped_by_budget(c["error_message"]))
                terminalreporter.write_line(summary_line(settings.budget, spent, skipped))
            terminalreporter.write_line(f"run {settings.run_id}; manifest {settings.manifest}; "
                                        f"progress files {settings.progress_dir / settings.run_id}")
        sandbox = self.config.stash.get(SANDBOX_KEY, None)
        if sandbox is not None:
            left = sandbox.running_sessions()
            if left:
                terminalreporter.write_line(
                    f"gpubench sandbox: {len(left)} session(s) still running: {', '.join(left)}", red=True)
