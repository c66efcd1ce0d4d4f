"""A reuse group's offer evicted for a provider's cache TTL: looked for again before its cells skip
(cloud/offers.py). Issue 21's 1,000-cell soak: a whole H200 NVL group drained into skips within
three seconds of a stale offer. The provider is a fake: a cloud is mocked here, the rule is the plugin's."""

from __future__ import annotations

import asyncio

import pytest

from pytest_gpubench.cloud.offers import OfferMemory, choose_offer_rechecking
from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.errors import NoEligibleOffer


class Evicted:
    """An inventory whose only eligible offer is away for the first ``away`` queries."""

    def __init__(self, away: int) -> None:
        self.away, self.queries = away, 0

    async def choose_offer(self, wanted: Constraints) -> str:
        self.queries += 1
        if self.queries <= self.away:
            raise NoEligibleOffer("1 offer(s) for H200 NVL on vastai, none eligible: 1 with 8 GPU(s), not 1")
        return "vastai-18430501"


WANTED = Constraints(gpu="H200 NVL", provider="vastai", vram_gb=48)


def test_an_offer_seen_earlier_is_waited_for_instead_of_skipping():
    provider, waits = Evicted(away=2), []
    choice = asyncio.run(choose_offer_rechecking(provider, WANTED, offered_before=True, wait=0.3,
                                                 on_wait=lambda reason, s: waits.append((reason, s))))
    assert choice == "vastai-18430501" and provider.queries == 3
    assert waits == [("1 offer(s) for H200 NVL on vastai, none eligible: 1 with 8 GPU(s), not 1", 0.3)]


def test_a_gpu_never_offered_in_the_run_skips_at_once_and_a_wait_has_an_end():
    provider = Evicted(away=100)
    with pytest.raises(NoEligibleOffer):
        asyncio.run(choose_offer_rechecking(provider, WANTED, offered_before=False, wait=5.0))
    assert provider.queries == 1
    with pytest.raises(NoEligibleOffer):
        asyncio.run(choose_offer_rechecking(provider, WANTED, offered_before=True, wait=0.2))
    assert 2 < provider.queries <= 1 + 1 + 8  # a few looks within the wait, then the last reason


def test_offer_memory_is_per_reuse_group():
    memory = OfferMemory()
    memory.saw("H200_NVL-vastai")
    assert memory.seen("H200_NVL-vastai") and not memory.seen("RTX_4090-vastai")
