"""This suite's own xdist schedule (tests/conftest.py): ``-n`` alone means ``worksteal``,
a ``--dist`` the caller names is kept."""

from __future__ import annotations

import subprocess
import sys

import pytest
from e2e_helpers import REPO


@pytest.mark.parametrize(("extra", "scheduler"), [([], "WorkStealingScheduling"),
                                                  (["--dist", "load"], "LoadScheduling")])
def test_n_alone_steals_work_and_a_named_dist_is_kept(extra, scheduler):
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", *extra, "-p", "no:cacheprovider",
                           "tests/unit/test_aio.py"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"scheduling tests via {scheduler}" in done.stdout
