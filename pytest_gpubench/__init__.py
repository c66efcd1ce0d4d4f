"""pytest-gpubench: GPU LLM-inference benchmarks as pytest tests.

The public face, for Python tests and tools built on the plugin::

    from pytest_gpubench import BenchmarkResult, Cell, StageError

pytest loads this package in every run of the environment (the plugin's entry
point is inside it), so the names below are imported on first use, not here.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_WHERE = {
    # A matrix cell, what a test's ``gpubench_cell`` fixture holds.
    "Cell": "pytest_gpubench.matrix.cells",
    "Workload": "pytest_gpubench.matrix.workload",
    "load_matrix": "pytest_gpubench.matrix.cells",
    # What ``gpubench.run()`` returns, and its parts.
    "Bench": "pytest_gpubench.run.cell_benchmark",
    "BenchmarkResult": "pytest_gpubench.measure.results",
    "PerformanceResults": "pytest_gpubench.measure.results",
    "RequestRecord": "pytest_gpubench.remote.readings",
    "DetailedMetrics": "pytest_gpubench.measure.metrics",
    "Slo": "pytest_gpubench.matrix.thresholds",
    # The error tree (errors.py draws it).
    "Stage": "pytest_gpubench.errors",
    "GpubenchError": "pytest_gpubench.errors",
    "StageError": "pytest_gpubench.errors",
    "MatrixError": "pytest_gpubench.errors",
    "UsageProblem": "pytest_gpubench.errors",
    # The seams (docs/architecture.md).
    "Provider": "pytest_gpubench.cloud.provider",
    "Runtime": "pytest_gpubench.runtimes.base",
    "Store": "pytest_gpubench.store.base",
    # Settings as the run resolved them.
    "Settings": "pytest_gpubench.settings",
}

__all__ = ["__version__", *sorted(_WHERE)]

if TYPE_CHECKING:
    from .errors import GpubenchError, MatrixError, Stage, StageError, UsageProblem
    from .matrix.cells import Cell, load_matrix
    from .matrix.workload import Workload
    from .measure.metrics import DetailedMetrics
    from .measure.results import BenchmarkResult, PerformanceResults
    from .remote.readings import RequestRecord
    from .matrix.thresholds import Slo
    from .run.cell_benchmark import Bench
    from .cloud.provider import Provider
    from .runtimes.base import Runtime
    from .store.base import Store
    from .settings import Settings


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pytest_gpubench' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
