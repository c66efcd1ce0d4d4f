"""How a run ended, in the one map both the terminal and the lifecycle use."""

import pytest

from pytest_gpubench.plugin.fixtures import run_status


@pytest.mark.parametrize(("exitstatus", "status"), [
    (pytest.ExitCode.OK, "passed"), (1, "failed"), (pytest.ExitCode.INTERRUPTED, "interrupted"),
    (pytest.ExitCode.NO_TESTS_COLLECTED, "exit 5"), (3, "exit 3"),
])
def test_run_status_names_pytest_s_exit_status(exitstatus, status):
    assert run_status(exitstatus) == status
