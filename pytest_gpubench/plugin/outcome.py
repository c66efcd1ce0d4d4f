"""A cell's outcome from its pytest phase reports: success, partial, failed, skipped."""

from __future__ import annotations

import pytest

from ..errors import BenchmarkInterrupted, ErrorBudgetExceeded, GpubenchError, Stage, StageError
from ..run.record import CellOutcome
from .stash import RECORDER_KEY, REPORTS_KEY


#: How a run ended, by pytest's exit status, as the manifest's ``runs.status`` says it.
RUN_STATUS = {pytest.ExitCode.OK: "passed", pytest.ExitCode.TESTS_FAILED: "failed",
              pytest.ExitCode.INTERRUPTED: "interrupted"}


def run_status(exitstatus: int) -> str:
    """``passed``, ``failed``, ``interrupted``, or ``exit N`` for pytest's other statuses."""
    return RUN_STATUS.get(int(exitstatus), f"exit {int(exitstatus)}")


def outcome_of(item: pytest.Item, current_stage: Stage) -> CellOutcome:
    """Classify the cell from its setup and call reports (teardown is not yet known).

    ``current_stage`` is where the cell was when it stopped: the stage blamed for
    an error that does not carry its own (an assertion, an interrupt).
    """
    reports = item.stash.get(REPORTS_KEY, {})
    for when in ("setup", "call"):
        report, error = reports.get(when, (None, None))
        if report is None:
            continue
        if report.skipped:
            # The stage says where the cell stopped: inventory (no offer), model_pull (too large)...
            return CellOutcome("skipped", failure_stage=str(current_stage), failure_reason="skipped",
                           error_message=_skip_reason(report))
        if report.failed:
            return _failure(error, current_stage)
    if "call" in reports:
        return CellOutcome("success")
    return CellOutcome("failed", failure_stage=str(current_stage), failure_reason="interrupted",
                   error_message="the run stopped before this cell finished")


def write_error_now(item: pytest.Item) -> None:
    """A cell's setup or call just failed: its ``ERROR:`` line goes to its progress file
    now, before pytest reports the failure (the terminal then shows it before the ``F``)."""
    recorder = item.stash.get(RECORDER_KEY, None)
    if recorder is not None:
        recorder.failed_now(outcome_of(item, recorder.stage))


def _failure(error: BaseException | None, stage: Stage) -> CellOutcome:
    if isinstance(error, BenchmarkInterrupted):
        return CellOutcome("partial", failure_stage=str(error.stage), failure_reason="interrupted",
                       error_message=str(error))
    if isinstance(error, ErrorBudgetExceeded):  # measured and kept, but mostly errors: seed 001's partial
        return CellOutcome("partial", failure_stage=str(error.stage), failure_reason="ErrorBudgetExceeded",
                           error_message=str(error))
    if isinstance(error, StageError):
        return CellOutcome("failed", failure_stage=str(error.stage), failure_reason=type(error).__name__,
                       error_message=str(error))
    if isinstance(error, GpubenchError):
        return CellOutcome("failed", failure_stage=str(stage), failure_reason=type(error).__name__,
                       error_message=str(error))
    message = f"{type(error).__name__}: {error}" if error is not None else "failed"
    return CellOutcome("failed", failure_stage=str(stage), failure_reason=type(error).__name__ if error else "failed",
                   error_message=message.strip())


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "skipped")
