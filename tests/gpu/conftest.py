"""The ``gpu`` tier: ``cloud: local`` on this machine's real NVIDIA GPU (README, "Tests on a GPU").

Every test here is skipped, with the reason, unless this machine has a real NVIDIA GPU:
``nvidia-smi`` on ``PATH`` (not the sandbox's stand-in), NVML loadable through
``nvidia-ml-py``, and ``torch.cuda.is_available()`` (``gpucheck.gpu_absent_reason``, asked once
per process). ``GPUBENCH_REQUIRE_GPU=1`` makes a missing GPU a failure instead, for a GPU runner
that must not pass by skipping everything.

The run itself (``local_run``) happens once per machine, also under ``-n``: the first
worker to ask runs the matrix, under an exclusive file lock, and leaves what it found in a JSON
file the others read (``gpu_run.py``).
"""

from __future__ import annotations

import os
import sys

import pytest

from pytest_gpubench.measure.gpucheck import gpu_absent_reason

_REASON: list[str | None] = []
#: A dry run of the tier's plumbing on the sandbox's stand-ins (``gpubench sandbox local``'s
#: environment), for working on the tier without a GPU: its figures are the sandbox catalog's,
#: and its NVML is missing, so the figure checks fail there; nothing else about them is real.
STANDINS = "GPUBENCH_GPU_TIER_ON_STANDINS"


def absent_reason() -> str | None:
    """Why this machine cannot run the tier (asked once per process), or None."""
    if not _REASON:
        dry_run = os.environ.get(STANDINS) == "1" and os.environ.get("GPUBENCH_SANDBOX_INSTANCE")
        _REASON.append(None if dry_run else gpu_absent_reason(sys.executable))
    return _REASON[0]


@pytest.fixture(scope="session", autouse=True)
def _a_real_gpu() -> None:
    """Skip (or with ``GPUBENCH_REQUIRE_GPU=1``, fail) every test of the tier without a real GPU."""
    reason = absent_reason()
    if reason is None:
        return
    if os.environ.get("GPUBENCH_REQUIRE_GPU", "").strip() not in ("", "0"):
        pytest.fail(f"GPUBENCH_REQUIRE_GPU is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def local_run(_a_real_gpu: None, tmp_path_factory: pytest.TempPathFactory):
    """The tier's one ``cloud: local`` run on this machine (``gpu_run.run_once``)."""
    from gpu_run import run_once

    base = tmp_path_factory.getbasetemp()
    return run_once(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
