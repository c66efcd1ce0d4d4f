"""An offer that vanished for a moment: look again before skipping the cell.

GPU Shopper evicts an offer whose create failed (stale inventory, a provisioning
error at create) from its provider cache until the provider's cache TTL passes
(60 s for Vast.ai, 30 s for TensorDock), then lists it again. A cell that queries
the inventory in that window finds no eligible offer and is skipped in about a
second, so the rest of a reuse group, run one cell after another on one worker,
drained into skips while its offers were away: in the 1,000-cell soak of issue 21,
a whole H200 NVL group (one 1-GPU offer left) skipped within three seconds of a
stale offer, and skips grew with the matrix (202 of 1,000).

So when no offer is eligible for a cell whose GPU and provider (its reuse group)
had an eligible offer earlier in this process's run, the inventory is asked again
for up to :data:`EVICTION_SECONDS` (on the run's clock) before the cell is
skipped. A GPU that was never offered in this run is skipped at once, as before:
waiting for it would only slow a matrix with a row nobody offers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from ..errors import NoEligibleOffer
from .provider import Constraints, OfferChoice, Provider

#: The longest cache TTL of GPU Shopper's providers: an offer evicted after a failed create is listed again then.
EVICTION_SECONDS = 60.0
#: However small the time scale, the wait is at least this (the sandbox scales the TTL too).
MIN_RECHECK_WAIT = 1.0
#: Looks at the inventory during that wait.
RECHECKS = 6


class OfferMemory:
    """The reuse groups that had an eligible offer earlier in this process's run (thread-safe)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def saw(self, group: str) -> None:
        with self._lock:
            self._seen.add(group)

    def seen(self, group: str) -> bool:
        with self._lock:
            return group in self._seen


async def choose_offer_rechecking(provider: Provider, wanted: Constraints, *, offered_before: bool,
                                  wait: float, on_wait: Callable[[str, float], None] | None = None) -> OfferChoice:
    """``provider.choose_offer(wanted)``; when it finds no eligible offer and ``offered_before``,
    ask again every ``wait / RECHECKS`` seconds for up to ``wait`` seconds (``on_wait`` is told
    the reason and the wait once), then raise the last ``NoEligibleOffer``."""
    try:
        return await provider.choose_offer(wanted)
    except NoEligibleOffer as first:
        if not offered_before or wait <= 0:
            raise
        if on_wait is not None:
            on_wait(first.message, wait)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        await asyncio.sleep(min(wait / RECHECKS, max(0.0, deadline - loop.time())))
        try:
            return await provider.choose_offer(wanted)
        except NoEligibleOffer:
            if loop.time() >= deadline:
                raise
