"""The runners file (seed 002): phases, named sets of cells with reruns, and which host takes what.

::

    phases:
      nightly:
        matrix: [gpubench_seed.yaml]     # optional, relative to this file; default: the files pytest collects
        gpus: [RTX 4090, A100 80GB]      # optional filters, matched like --gpubench-gpu/provider/model
        providers: [vastai]
        models: [qwen2:7b]
        reruns: 2                        # each cell runs twice, as two cells (the second's id ends -rerun2)
    runners:
      gpu-box-a: {phase: nightly, gpus: [RTX 4090], providers: [local], models: [qwen2:7b]}
      default: {phase: nightly}          # any other host; without it an unknown host is an error

Every machine of a phase runs ``pytest matrix/ --gpubench-runners runners.yaml`` into one run
named after the phase; :func:`plan_runner` says which phase this host runs and which of its
cells it takes. A bad file is a :class:`RunnersError` naming the file, the field
(``runners.gpu-box-a.phase``), the line and what is allowed. docs/runners.md has the rest.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationInfo, field_validator

from ..errors import RunnersError
from .fields import NAME_RE, StrictModel, describe, invalid
from .selection import cell_selected
from .yaml_errors import at_line, load_while_unchanged, node_line, validate_file

__all__ = ["DEFAULT_RUNNER", "PhaseSpec", "RunnerPlan", "RunnerSpec", "RunnersError", "RunnersFile",
           "load_runners", "plan_runner", "rerun_id"]

#: The runner every host without an entry of its own gets.
DEFAULT_RUNNER = "default"
#: The most reruns a phase may ask for.
MAX_RERUNS = 100
#: A phase name is the run id of its machines: the run id's rule.
MAX_PHASE_NAME = 64


def _names(value: Any, what: str) -> tuple[str, ...]:
    """A filter's values: one string or a list of non-empty strings."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise invalid(f"must be a list of {what}; got {describe(value)}")
    return tuple(v.strip() for v in value)


#: What each filter lists, as its error says.
_FILTER_VALUES = {"gpus": "GPU names, such as [RTX 4090, A100 80GB]", "providers": "providers, such as [vastai, local]",
                  "models": "models, such as [qwen2:7b] (a name without a tag selects every tag)"}


class _Filters(StrictModel):
    """GPUs, providers and models, matched as ``--gpubench-gpu/provider/model`` match; empty: any."""

    gpus: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    @field_validator("gpus", "providers", "models", mode="before")
    @classmethod
    def _values(cls, value: Any, info: ValidationInfo) -> Any:
        return _names(value, _FILTER_VALUES[info.field_name])

    def selects(self, cell: Any) -> bool:
        return cell_selected(cell, self.gpus, self.providers, self.models)

    def label(self) -> str:
        """``RTX 4090 on local, qwen2:7b``, ``cells on local``, ``qwen2``; ``every cell`` without filters."""
        head = ", ".join(self.gpus) or ("cells" if self.providers else "")
        head += f" on {', '.join(self.providers)}" if self.providers else ""
        models = ", ".join(self.models)
        return ", ".join(part for part in (head, models) if part) or "every cell"


class PhaseSpec(_Filters):
    """A phase: its matrix files (none: whatever pytest collects), filters and reruns."""

    matrix: tuple[str, ...] = ()
    reruns: int = 1

    @field_validator("matrix", mode="before")
    @classmethod
    def _matrix(cls, value: Any, info: ValidationInfo) -> Any:
        paths = _names(value, "matrix files, such as [matrix/gpubench_seed.yaml]")
        base = Path((info.context or {}).get("base_dir") or ".")
        return tuple(str((base / Path(p).expanduser()).resolve()) for p in paths)

    @field_validator("reruns", mode="before")
    @classmethod
    def _reruns(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RERUNS:
            raise invalid(f"must be how many times each cell runs, from 1 to {MAX_RERUNS}; got {describe(value)}")
        return value

    def holds(self, cell: Any) -> bool:
        """Whether ``cell`` belongs to the phase: from one of its files (if it names any) and selected."""
        if self.matrix and str(Path(cell.source).resolve()) not in self.matrix:
            return False
        return self.selects(cell)


class RunnerSpec(_Filters):
    """What one host runs: its phase (none: the file's only one) and what it may take of it."""

    phase: str | None = None


def _phase_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_PHASE_NAME:
        raise invalid(f"a phase name is its run id: 1-{MAX_PHASE_NAME} letters, digits, '.', '_', '-'; "
                      f"got {describe(name)}")
    return name


class RunnersFile(StrictModel):
    """A whole runners file."""

    phases: dict[str, PhaseSpec]
    runners: dict[str, RunnerSpec] = {}
    _source: str = PrivateAttr(default="")

    @property
    def source(self) -> str:
        """The file it was read from."""
        return self._source

    @field_validator("phases", mode="before")
    @classmethod
    def _phases(cls, value: Any) -> Any:
        if isinstance(value, dict):
            if not value:
                raise invalid("must name at least one phase, such as `nightly: {reruns: 1}`")
            for name in value:
                _phase_name(name)
            return {name: {} if spec is None else spec for name, spec in value.items()}
        return value

    @field_validator("runners", mode="before")
    @classmethod
    def _runners(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, dict):
            for name in value:
                if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                    raise invalid(f"a runner is a host name (letters, digits, '.', '_', '-') or `default`; "
                                  f"got {describe(name)}")
            return {name: {} if spec is None else spec for name, spec in value.items()}
        return value


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> RunnersFile:
    runners, root = validate_file(path, RunnersFile, RunnersError, (
        "must be a mapping with `phases:` (name -> phase) and `runners:` (host -> runner); see docs/runners.md"))
    for name, runner in runners.runners.items():
        if runner.phase is not None and runner.phase not in runners.phases:
            raise RunnersError(path, f"runners.{name}.phase", (
                f"no phase {runner.phase!r} in this file; phases: {', '.join(runners.phases)}"
                + at_line(node_line(root, ("runners", name, "phase")))))
    runners._source = path
    return runners


def load_runners(path: str | os.PathLike[str]) -> RunnersFile:
    """Read and check the runners file at ``path`` (cached while the file is unchanged)."""
    return load_while_unchanged(path, _load, RunnersError, "the runners file")


def rerun_id(cell_id: str, rerun: int) -> str:
    """The test id of a cell's ``rerun``-th run: the cell's own id for the first, ``{id}-rerun2`` after."""
    return cell_id if rerun == 1 else f"{cell_id}-rerun{rerun}"


@dataclass(frozen=True)
class RunnerPlan:
    """What this host runs: a phase of a runners file, and what of it the host's runner takes."""

    source: str
    #: The host asked about (the hostname, or ``--gpubench-runner``) and the runner entry it got.
    host: str
    runner: str
    phase: str
    spec: PhaseSpec
    takes: _Filters

    def test_ids(self, cell: Any) -> list[str]:
        """The test ids of ``cell``'s runs in this phase (one per rerun)."""
        return [rerun_id(cell.cell_id, n) for n in range(1, self.spec.reruns + 1)]

    def split(self, cells: Iterable[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """``(taken, not_taken, outside)``: the phase's cells this runner takes, those it leaves to
        others, and cells outside the phase."""
        taken: list[Any] = []
        left: list[Any] = []
        outside: list[Any] = []
        for cell in cells:
            if not self.spec.holds(cell):
                outside.append(cell)
            else:
                (taken if self.takes.selects(cell) else left).append(cell)
        return taken, left, outside

    def summary(self, taken: int, total: int) -> str:
        """``runner gpu-box-a takes RTX 4090 on local: 6 of 10 cells of phase nightly``."""
        who = f"runner {self.runner}" + (f" (host {self.host})" if self.runner != self.host else "")
        return f"{who} takes {self.takes.label()}: {taken} of {total} cells of phase {self.phase}"


def plan_runner(runners: RunnersFile, host: str, phase: str | None = None) -> RunnerPlan:
    """The plan of ``host`` (its entry, else its short name's, else ``default``) in ``phase``
    (else its runner's, else the file's only phase). A file without ``runners:`` lets every
    host take every cell of the phase."""
    source = runners.source
    name, runner = _runner_of(runners, host)
    wanted = phase or runner.phase
    if wanted is None:
        if len(runners.phases) != 1:
            raise RunnersError(source, f"runners.{name}.phase" if runners.runners else "phases", (
                f"runner {name} names no phase and the file has {len(runners.phases)} "
                f"({', '.join(runners.phases)}): add `phase:` or pass --gpubench-phase NAME"))
        wanted = next(iter(runners.phases))
    if wanted not in runners.phases:
        raise RunnersError(source, "phases", f"no phase {wanted!r}; phases: {', '.join(runners.phases)}")
    return RunnerPlan(source=source, host=host, runner=name, phase=wanted, spec=runners.phases[wanted],
                      takes=_Filters(gpus=runner.gpus, providers=runner.providers, models=runner.models))


def _runner_of(runners: RunnersFile, host: str) -> tuple[str, RunnerSpec]:
    if not runners.runners:
        return host, RunnerSpec()
    by_name = {name.lower(): name for name in runners.runners}
    for candidate in (host.lower(), host.lower().split(".", 1)[0], DEFAULT_RUNNER):
        if candidate in by_name:
            name = by_name[candidate]
            return name, runners.runners[name]
    known = ", ".join(name for name in runners.runners)
    raise RunnersError(runners.source, "runners", (
        f"no runner for host {host!r} and no `{DEFAULT_RUNNER}:` entry; runners: {known} "
        "(add this host, or pass --gpubench-runner NAME)"))
