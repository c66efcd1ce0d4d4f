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


def test_n_auto_runs_four_workers_more_than_the_cores_unless_the_environment_says():
    import os

    cores = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_AUTO_NUM_WORKERS"}
    for extra_env, workers in (({}, cores + 4), ({"PYTEST_XDIST_AUTO_NUM_WORKERS": "1"}, 1)):
        done = subprocess.run([sys.executable, "-m", "pytest", "-n", "auto", "-p", "no:cacheprovider",
                               "tests/unit/test_aio.py"], cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**env, **extra_env})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"created: {workers}/{workers} worker" in done.stdout, done.stdout[-2000:]
