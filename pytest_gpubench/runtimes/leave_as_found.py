"""Leaving a machine the run does not own as the run found it (``cloud: hosts``, ``local``).

A rented session is destroyed after its cells; a host is not, so whatever a cell started
there must end with the cell: the server, when this cell's runtime (or an earlier cell's
on the same session) started it, and a model it pulled, when the inventory says models do
not stay as a cache (``keep_models: false``). A server that was already running is used
and left running (``Runtime.started_here`` is false for it), and a model that was already
on the machine stays.
"""

from __future__ import annotations

from ..errors import Stage, StageError
from .base import Runtime


async def has_model(runtime: Runtime, model: str) -> bool:
    """Whether ``model`` is on the machine already (asked before a pull)."""
    try:
        await runtime.model_info(model)
    except (StageError, OSError, ValueError, KeyError):
        return False
    except Exception:  # noqa: BLE001 - a server that cannot say (not up yet): treat as absent
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
