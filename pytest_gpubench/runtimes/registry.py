"""Runtime names -> implementations: what a cell's ``runtime:`` may name, and the one place that builds one.

A new runtime is a module in this folder implementing :class:`~.base.Runtime`, an
entry in :data:`RUNTIMES`, and its name in ``matrix/fields.py``'s ``RUNTIME_NAMES``;
``tests/e2e/test_runtime_contract.py`` then runs the contract suite against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..remote.ssh import Connection
from .base import Runtime
from .gpus import GpuPlacement
from .llamacpp import LlamacppRuntime
from .ollama import OllamaRuntime
from .sglang import SglangRuntime
from .tgi import TgiRuntime
from .openai_endpoint import OpenAIEndpointRuntime
from .vllm import VllmRuntime
from .worker import WorkerRuntime

#: Builds a cell's runtime on an open SSH connection to its instance, on the GPUs it was given.
RuntimeFactory = Callable[[Connection, Cell, GpuPlacement], Runtime]

RUNTIMES: dict[str, RuntimeFactory] = {
    OllamaRuntime.name: OllamaRuntime.for_cell,
    VllmRuntime.name: VllmRuntime.for_cell,
    SglangRuntime.name: SglangRuntime.for_cell,
    TgiRuntime.name: TgiRuntime.for_cell,
    LlamacppRuntime.name: LlamacppRuntime.for_cell,
    OpenAIEndpointRuntime.name: OpenAIEndpointRuntime.for_cell,
    WorkerRuntime.name: WorkerRuntime.for_cell,
}


def runtime_for(cell: Cell, conn: Connection, gpu_indices: Iterable[int] = ()) -> Runtime:
    """The runtime ``cell`` names, driven through ``conn``, its server spanning ``cell.gpus`` GPUs
    (``gpu_indices``: the machine's GPUs the provider leased to the cell; empty: all of them)."""
    factory = RUNTIMES.get(cell.runtime)
    if factory is None:  # a matrix cannot name one; a Cell built by hand can
        raise StageError(Stage.RUNTIME_SETUP, f"unknown runtime {cell.runtime!r}; "
                                               f"known runtimes: {', '.join(RUNTIMES)}")
    return factory(conn, cell, GpuPlacement.of(cell.gpus, gpu_indices))
