"""Runtime names -> implementations: the one place that builds a cell's runtime, and what a cell's
runtime does on a machine the run does not own (kept apart, left as found: below).

Which runtimes there are, and each one's facts, is ``runtime_facts.py``'s registry: the
built-in ones (one module each in this folder, declaring ``RUNTIME``) and those a third party
registers in the entry point group ``pytest_gpubench.runtimes``. The contract suite
(``run/runtime_contract.py``) holds each to :class:`~.base.Runtime`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..remote.ssh import Connection
from ..runtime_facts import UnknownRuntime, facts_of
from .base import GpuPlacement, Runtime
from .openai_server import OpenAIServerRuntime


def runtime_for(cell: Cell, conn: Connection, gpu_indices: Iterable[int] = ()) -> Runtime:
    """The runtime ``cell`` names, driven through ``conn``, its server spanning ``cell.gpus`` GPUs
    (``gpu_indices``: the machine's GPUs the provider leased to the cell; empty: all of them)."""
    try:
        facts = facts_of(cell.runtime)
    except UnknownRuntime as exc:  # a matrix cannot name one; a Cell built by hand can
        raise StageError(Stage.RUNTIME_SETUP, str(exc)) from None
    return facts.runtime.for_cell(conn, cell, GpuPlacement.of(cell.gpus, gpu_indices))


# --------------------------------------------------------------------- on a machine the run does not own
#
# Running on a machine the run does not own (``cloud: hosts``, ``local``): kept apart, left as found.
#
# Cells leasing different GPUs of one machine run side by side there, so each must keep its
# own server: :func:`keep_apart` gives an OpenAI-API server (vLLM, SGLang, TGI, llama.cpp)
# log, pid and port files of its own, named by the GPUs it holds, so that one cell never
# finds, stops or adopts another's server. (Ollama serves one server per machine; its cells
# lease the whole machine instead, ``cloud/hosts_provider.py``.)
#
# A rented session is destroyed after its cells; a host is not, so whatever a cell started
# there must end with the cell: the server, when this cell's runtime (or an earlier cell's
# on the same session) started it, and a model it pulled, when the inventory says models do
# not stay as a cache (``keep_models: false``). A server that was already running is used
# and left running (``Runtime.started_here`` is false for it), and a model that was already
# on the machine stays.


def keep_apart(runtime: Runtime, gpu_indices: tuple[int, ...]) -> None:
    """Give ``runtime``'s server files of its own for the GPUs ``gpu_indices`` (none: the whole machine)."""
    if gpu_indices and isinstance(runtime, OpenAIServerRuntime):
        runtime.spec = replace(runtime.spec, file_tag="-gpu" + "_".join(str(i) for i in gpu_indices))


async def has_model(runtime: Runtime, model: str) -> bool:
    """Whether ``model`` is on the machine already (asked before a pull)."""
    try:
        await runtime.model_info(model)
    except Exception:  # noqa: BLE001 - a server that cannot say (not up yet, an error): treat as absent
        return False
    return True


async def leave_as_found(runtime: Runtime, model: str, *, remove_model: bool, timeout: float) -> list[str]:
    """Remove ``model`` when asked, stop the server when it was started here; what was done."""
    done: list[str] = []
    if remove_model:
        await runtime.remove(model)
        done.append(f"removed {model}")
    if runtime.started_here:
        await runtime.stop(timeout, Stage.CLEANUP)
        done.append(f"stopped the {runtime.name} server it started")
    return done
