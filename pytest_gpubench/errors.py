"""The error tree. Every error that ends a cell knows the stage it happened in.

::

    GpubenchError                 anything this project raises on purpose
    ├── UsageProblem              bad options or environment (-> pytest.UsageError)
    ├── MatrixError               a matrix file that does not validate (file, field, message)
    ├── ApiUnreachable            nothing answers at the GPU Shopper URL: the run stops
    └── StageError                a cell failed at one stage (stage, message, hint)
        ├── NoEligibleOffer       inventory: offers exist or not, none fits -> skipped
        ├── ApiError              the API answered with an error (status, error_type)
        ├── RemoteCommandError    a command on the instance failed (exit status, stderr tail)
        └── BenchmarkInterrupted  the benchmark stopped early; carries what it measured

The stage becomes the manifest's ``failure_stage``, the progress file's ``ERROR:``
line and the first line of the test's failure report.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Stage(str, Enum):
    """The stage names of seed 000, in the order a cell passes through them."""

    INVENTORY = "inventory"
    PROVISION = "provision"
    SSH_WAIT = "ssh_wait"
    SSH_CONNECT = "ssh_connect"
    OLLAMA_INSTALL = "ollama_install"
    MODEL_PULL = "model_pull"
    BENCHMARK = "benchmark"
    RESULTS = "results"
    CLEANUP = "cleanup"

    def __str__(self) -> str:
        return self.value


class GpubenchError(Exception):
    """Base of every error pytest-gpubench raises on purpose."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageProblem(GpubenchError):
    """A bad option value, environment variable or ini setting."""


class MatrixError(GpubenchError):
    """A matrix file that cannot be used; names the file and the field."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = path
        self.field = field
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


class ApiUnreachable(GpubenchError):
    """Nothing answers at the GPU Shopper API URL: no cell can run."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(
            f"no GPU Shopper API answers at {url} ({reason})",
            hint="start the server, point --gpubench-api / GPUBENCH_API_BASE at it, "
            "or run offline with --gpubench-sandbox",
        )


class StageError(GpubenchError):
    """A cell failed at ``stage``; the message is one paragraph for a person."""

    def __init__(self, stage: Stage, message: str, *, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.stage = Stage(stage)


class NoEligibleOffer(StageError):
    """No offer meets the cell's constraints: the cell is skipped, not failed."""

    def __init__(self, message: str) -> None:
        super().__init__(Stage.INVENTORY, message)


class ApiError(StageError):
    """The GPU Shopper API answered with an error status."""

    def __init__(
        self,
        stage: Stage,
        status: int,
        message: str,
        *,
        error_type: str = "",
        retry_suggested: bool = False,
        call: str = "",
        hint: str = "",
    ) -> None:
        self.status = status
        self.error_type = error_type
        self.retry_suggested = retry_suggested
        kind = f" {error_type}" if error_type else ""
        to = f" to {call}" if call else ""
        super().__init__(stage, f"API answered {status}{kind}{to}: {message}", hint=hint)


class RemoteCommandError(StageError):
    """A command on the instance exited non-zero (asyncssh's own text omits stderr)."""

    def __init__(self, stage: Stage, what: str, exit_status: int | None, stderr: str) -> None:
        self.exit_status = exit_status
        self.stderr_tail = stderr.strip()[-600:]
        status = "was killed" if exit_status is None else f"exited {exit_status}"
        detail = f": {self.stderr_tail}" if self.stderr_tail else ""
        super().__init__(stage, f"{what} {status}{detail}")


class BenchmarkInterrupted(StageError):
    """The benchmark ended early; ``partial`` holds what was measured before."""

    def __init__(self, message: str, partial: Any = None) -> None:
        super().__init__(Stage.BENCHMARK, message)
        self.partial = partial
