"""Offer selection: seed 000's rule, with the reasons a person needs when none fits.

Rule: the cell's GPU count exactly (``gpus:``), availability confidence above the
provider's bar (seed: 0.5), enough VRAM for the model (over all the offer's GPUs),
under the price cap, then the cheapest (ties: more confident). An offer's
``price_per_hour`` and so every cost figure is the whole machine's.

**An offer that vanished for a moment** (:func:`choose_offer_rechecking`): look again before skipping the cell.

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
from collections.abc import Callable, Iterable

from ..errors import NoEligibleOffer, Stage, StageError
from ..matrix.cells import gpu_matches, gpus_label
from .provider import Constraints, Offer, OfferChoice, Provider

#: Vast.ai reports vram_gb as MiB / 1024 rounded down (an RTX 4090 shows 23),
#: so a card is accepted when it is within one GB of the need.
VRAM_ROUNDING_GB = 1.0


def select_offer(offers: Iterable[Offer], wanted: Constraints) -> tuple[Offer, list[Offer]]:
    """The offer to rent and the eligible ones in preference order.

    Raises ``NoEligibleOffer`` with why each candidate was turned down.
    """
    candidates = [
        offer
        for offer in offers
        if offer.provider.lower() == wanted.provider.lower() and gpu_matches(wanted.gpu, offer.gpu_type)
    ]
    eligible: list[Offer] = []
    rejected: dict[str, list[Offer]] = {}
    for offer in candidates:
        reason = rejection(offer, wanted)
        if reason:
            rejected.setdefault(reason, []).append(offer)
        else:
            eligible.append(offer)
    if not eligible:
        raise NoEligibleOffer(_explain(candidates, rejected, wanted))
    eligible.sort(key=lambda o: (o.price_per_hour, -o.availability_confidence, o.id))
    return eligible[0], eligible


def put_first(eligible: Iterable[Offer], chosen: Offer, chooser: str) -> list[Offer]:
    """``eligible`` with ``chosen`` (picked by ``chooser``, a user's hook) first, the rest in
    :func:`select_offer`'s order for failover. Only an eligible offer may be chosen."""
    eligible = list(eligible)
    found = next((offer for offer in eligible if offer.id == getattr(chosen, "id", None)), None)
    if found is None:
        ids = ", ".join(offer.id for offer in eligible)
        raise StageError(Stage.INVENTORY, f"{chooser} chose {getattr(chosen, 'id', chosen)!r}, which is not "
                         f"one of the {len(eligible)} eligible offer(s): {ids}")
    return [found, *(offer for offer in eligible if offer is not found)]


def next_offer(eligible: Iterable[Offer], failed: Iterable[Offer]) -> Offer | None:
    """The offer to fail over to after ``failed`` ones, or ``None`` when none is left.

    ``eligible`` is in :func:`select_offer`'s order; offers that failed are never
    tried again. Seed 001's mitigation for "No available public IPs" is another
    location, and a machine that failed once tends to fail again, so offers away
    from every failed location and machine come first, then those away from a
    failed machine only, then the rest; each group keeps the seed's order.
    """
    failed = list(failed)
    tried = {offer.id for offer in failed}
    places = {offer.location for offer in failed if offer.location}
    machines = {str(offer.machine_id) for offer in failed if offer.machine_id not in (None, "")}
    left = [offer for offer in eligible if offer.id not in tried]
    if not left:
        return None

    def distance(offer: Offer) -> int:
        new_machine = offer.machine_id in (None, "") or str(offer.machine_id) not in machines
        new_place = not offer.location or offer.location not in places
        return 0 if new_machine and new_place else 1 if new_machine else 2

    return min(left, key=distance)  # min() keeps the first of equals: the seed's order


def unfit(offer: Offer, wanted: Constraints) -> str | None:
    """Why a session already rented on ``offer`` cannot serve a cell wanting ``wanted``
    (another provider, or an offer the cell's own rule rejects); None when it can."""
    if offer.provider.lower() != wanted.provider.lower():
        return f"it is on {offer.provider}"
    return rejection(offer, wanted) or None


def rejection(offer: Offer, wanted: Constraints) -> str:
    """Why ``offer`` is not eligible for ``wanted``; empty when it is."""
    if not offer.available:
        return "not available"
    if offer.gpu_count != wanted.gpu_count:  # a bigger machine is billed whole, a smaller one cannot hold the cell
        return f"with {offer.gpu_count} GPU(s), not {wanted.gpu_count}"
    if offer.availability_confidence <= wanted.min_confidence:
        return f"availability confidence not above {wanted.min_confidence:g} for {wanted.provider}"
    if offer_vram_gb(offer) + VRAM_ROUNDING_GB < wanted.vram_gb:
        return f"less than the {wanted.vram_gb:g} GB of VRAM the model needs"
    if wanted.max_price is not None and offer.price_per_hour > wanted.max_price:
        return f"over the price cap of ${wanted.max_price:.2f}/h"
    return ""


def offer_vram_gb(offer: Offer) -> float:
    """GB of VRAM over all the offer's GPUs (the inventory's ``vram_gb`` is one GPU's)."""
    return offer.vram_gb * max(1, offer.gpu_count)


def _explain(candidates: list[Offer], rejected: dict[str, list[Offer]], wanted: Constraints) -> str:
    gpus = gpus_label(wanted.gpu, wanted.gpu_count)
    if not candidates:
        more = f" (the inventory was asked for at least {wanted.gpu_count} GPUs)" if wanted.gpu_count > 1 else ""
        return f"no offers found for {gpus} on {wanted.provider}{more}"
    parts = []
    for reason, offers in rejected.items():
        detail = ""
        if reason.startswith("availability"):
            detail = f", best {max(o.availability_confidence for o in offers):.2f}"
        elif reason.startswith("over the price"):
            detail = f", cheapest ${min(o.price_per_hour for o in offers):.2f}/h"
        elif reason.startswith("less than"):
            detail = f", largest {max(offer_vram_gb(o) for o in offers):g} GB"
        parts.append(f"{len(offers)} {reason}{detail}")
    return (
        f"{len(candidates)} offer(s) for {gpus} on {wanted.provider}, none eligible: "
        + "; ".join(parts)
    )


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
