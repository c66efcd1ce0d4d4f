"""Runtime names -> implementations: the one place that builds a cell's runtime.

Which runtimes there are, and each one's facts, is ``runtime_facts.py``'s registry: the
built-in ones (one module each in this folder, declaring ``RUNTIME``) and those a third party
registers in the entry point group ``pytest_gpubench.runtimes``. The contract suite
(``run/runtime_contract.py``) holds each to :class:`~.base.Runtime`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..remote.ssh import Connection
from ..runtime_facts import UnknownRuntime, facts_of
from .base import Runtime
from .gpus import GpuPlacement


def runtime_for(cell: Cell, conn: Connection, gpu_indices: Iterable[int] = ()) -> Runtime:
    """The runtime ``cell`` names, driven through ``conn``, its server spanning ``cell.gpus`` GPUs
    (``gpu_indices``: the machine's GPUs the provider leased to the cell; empty: all of them)."""
    try:
        facts = facts_of(cell.runtime)
    except UnknownRuntime as exc:  # a matrix cannot name one; a Cell built by hand can
        raise StageError(Stage.OLLAMA_INSTALL, str(exc)) from None
    return facts.runtime.for_cell(conn, cell, GpuPlacement.of(cell.gpus, gpu_indices))
