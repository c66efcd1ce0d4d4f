"""The emulated inventory: the catalog's offers as the server lists and looks them up.

Like the server's inventory service:

- listings hold only ``available`` offers, filtered exactly (``gpu_type`` must equal
  the offer's, "A100" does not match "A100 80GB"), sorted by availability
  confidence (highest first), then price (lowest first);
- a lookup by id searches the provider cache, rented offers included;
- an offer whose create failed is evicted from the cache until the provider's
  cache TTL (time-scaled) has passed: it vanishes from listings and lookups.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .catalog import Catalog, OfferSpec, availability_confidence, offer_json, offer_vram_gb
from .sessions import ApiFailure


@dataclass
class OfferFilter:
    """Inventory query, as the server parses it (zero means "no constraint")."""

    provider: str = ""
    gpu_type: str = ""
    location: str = ""
    min_vram: int = 0
    max_price: float = 0.0
    min_gpu_count: int = 0
    min_reliability: float = 0.0
    min_availability_confidence: float = 0.0
    min_cuda: float = 0.0


class Inventory:
    """Offers of one sandbox, with the server's cache eviction."""

    def __init__(self, catalog: Catalog, time_scale: float) -> None:
        self.catalog = catalog
        self.time_scale = time_scale
        self._evicted: dict[str, float] = {}

    def _cached(self, offer: OfferSpec) -> bool:
        until = self._evicted.get(offer.id)
        return until is None or asyncio.get_running_loop().time() >= until

    def list_offers(self, query: OfferFilter, now: datetime) -> list[dict[str, Any]]:
        """Available offers matching ``query`` in the server's JSON and order."""
        if query.provider and query.provider not in self.catalog.providers:
            raise ApiFailure(400, f"provider not found: {query.provider}")
        chosen = [o for o in self.catalog.offers if o.available and self._cached(o) and self._matches(o, query)]
        chosen.sort(key=lambda o: (-availability_confidence(o), o.price_per_hour))
        return [offer_json(self.catalog, o, now) for o in chosen]

    def _matches(self, offer: OfferSpec, q: OfferFilter) -> bool:
        checks = (
            not q.provider or offer.provider == q.provider,
            not q.gpu_type or offer.gpu_type == q.gpu_type,
            not q.min_vram or offer_vram_gb(self.catalog, offer) >= q.min_vram,
            not q.max_price or offer.price_per_hour <= q.max_price,
            not q.location or q.location in offer.location,
            not q.min_reliability or offer.reliability >= q.min_reliability,
            not q.min_gpu_count or offer.gpu_count >= q.min_gpu_count,
            not q.min_availability_confidence or availability_confidence(offer) >= q.min_availability_confidence,
            not q.min_cuda or offer.cuda_version >= q.min_cuda,
        )
        return all(checks)

    def get_offer(self, offer_id: str) -> OfferSpec:
        """An offer still in the server's cache (rented ones included); else 404."""
        offer = self.catalog.offer(offer_id)
        if offer is None or not self._cached(offer):
            raise ApiFailure(404, f"offer not found: {offer_id}")
        return offer

    def evict(self, offer: OfferSpec) -> None:
        """Drop a failed offer from the cache until its provider's TTL passes."""
        ttl = self.catalog.providers[offer.provider].cache_ttl_seconds * self.time_scale
        self._evicted[offer.id] = asyncio.get_running_loop().time() + ttl
