"""The one restart a runtime allows a server that stopped answering, shared by every implementation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import Stage, StageError


async def restart_once(runtime: Any, *, where: str, probe: str, log: str, stage: Stage, timeout: float,
                       on_restart: Callable[[str], None] | None, serve: Callable[[], Awaitable[None]]) -> None:
    """Start the server of ``runtime`` again after ``probe`` went unanswered: once per runtime.

    ``on_restart`` is told why first; a server this runtime started is stopped first, since
    a hung one (alive, not answering) would keep the port; one it found running it cannot
    tell from another process, and leaves alone. Raises at ``stage`` on a second failure or
    when ``serve`` does not bring the server back. ``runtime`` counts its ``restarts``.
    """
    if runtime.restarts:
        raise StageError(stage, f"{where} stopped answering again after its one restart",
                         hint=f"its log is {log} on the instance")
    runtime.restarts += 1
    reason = f"{where} did not answer {probe}"
    if on_restart is not None:
        on_restart(reason)
    if runtime.started_here:
        await runtime.stop(timeout, stage)
    try:
        await serve()
    except StageError as exc:
        raise StageError(stage, f"{reason} and did not come back after one restart: {exc.message}") from None
