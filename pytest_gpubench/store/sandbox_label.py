"""How a sandbox run says so wherever its figures appear.

A ``--gpubench-sandbox`` run measures the emulated cloud: its token rates and TTFT
are the sandbox catalog's, its benchmarks run on the sandbox's clock (300 s take
6 s at time scale 0.02, see ``Settings.benchmark_seconds``) and nothing is billed.
Its figures must never pass for a GPU's: the terminal summary's header, every
cell's JUnit properties (``gpubench_sandbox``), the first STATUS line of each
progress file, the manifest's ``runs.sandbox`` column and the report's title and
note all say so. Only the run's own sandbox counts: the plugin cannot know that
another API (``--gpubench-api``) is a standalone sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The JUnit property every cell carries: "true" for a sandbox run, else "false".
SANDBOX_PROPERTY = "gpubench_sandbox"


def _clock(settings: Any) -> str:
    scale = settings.benchmark_scale
    return f"benchmarks on its clock x{scale:g}" if scale != 1.0 else "benchmarks in real time"


def summary_title(settings: Any) -> str:
    """The terminal summary's header: ``gpubench summary`` and, in the sandbox, what that means."""
    if not settings.sandbox:
        return "gpubench summary"
    return f"gpubench summary: SANDBOX figures (emulated GPUs, {_clock(settings)})"


def junit_property(settings: Any) -> tuple[str, str]:
    """``("gpubench_sandbox", "true" | "false")``."""
    return SANDBOX_PROPERTY, "true" if settings.sandbox else "false"


def progress_labels(settings: Any) -> dict[str, Any]:
    """Fields of a progress file's first STATUS line: ``sandbox=true time_scale=0.02``
    in a sandbox run (benchmark_scale 1 with ``--gpubench-sandbox-real-time``); none else."""
    if not settings.sandbox:
        return {}
    return {"sandbox": "true", "time_scale": settings.benchmark_scale}


def report_note(sandbox_runs: Sequence[str], runs: Sequence[str]) -> str:
    """The report's note on sandbox figures ("" when no run used the sandbox)."""
    if not sandbox_runs:
        return ""
    which = ("Every run in this report" if len(sandbox_runs) == len(runs)
             else f"Run{'s' * (len(sandbox_runs) > 1)} {', '.join(sandbox_runs)}")
    return (f"Sandbox figures: {which} used pytest-gpubench's emulated cloud (--gpubench-sandbox), "
            "not rented GPUs. Token rates and TTFT are its catalog's figures for each GPU and model, "
            "measured over benchmarks on its clock (shortened unless --gpubench-sandbox-real-time); "
            "prices and costs are emulated.")


def report_title(sandbox_runs: Sequence[str], runs: Sequence[str]) -> str:
    """``GPU Benchmark Report``, marked when its figures come from the sandbox."""
    if not sandbox_runs:
        return "GPU Benchmark Report"
    if len(sandbox_runs) == len(runs):
        return "GPU Benchmark Report (sandbox)"
    return "GPU Benchmark Report (includes sandbox runs)"
