import pytest

from pytest_gpubench.errors import NoEligibleOffer
from pytest_gpubench.cloud.offers import Constraints, select_offer
from pytest_gpubench.cloud.shopper_client import Offer


def offer(id, gpu="RTX 4090", provider="vastai", price=0.5, vram=23, conf=0.9, **kw):
    return Offer(id=id, provider=provider, gpu_type=gpu, price_per_hour=price, vram_gb=vram,
                 availability_confidence=conf, **kw)


def test_cheapest_eligible_wins():
    offers = [offer("a", price=0.6), offer("b", price=0.4), offer("c", price=0.3, conf=0.5),
              offer("d", gpu="RTX 3090", price=0.1)]
    chosen, eligible = select_offer(offers, Constraints("RTX4090", "vastai", vram_gb=8))
    assert chosen.id == "b"
    assert [o.id for o in eligible] == ["b", "a"]  # "c" sits exactly at the bar: not above it


def test_vast_rounded_vram_still_fits_a_24gb_model():
    chosen, _ = select_offer([offer("a", vram=23)], Constraints("RTX 4090", "vastai", vram_gb=24))
    assert chosen.id == "a"
    with pytest.raises(NoEligibleOffer, match="less than the 48 GB"):
        select_offer([offer("a", vram=23)], Constraints("RTX 4090", "vastai", vram_gb=48))


def test_tensordock_needs_its_own_bar():
    td = [offer("t1", provider="tensordock", conf=0.3)]
    with pytest.raises(NoEligibleOffer) as info:
        select_offer(td, Constraints("RTX 4090", "tensordock", vram_gb=8, min_confidence=0.5))
    assert "availability confidence not above 0.5 for tensordock, best 0.30" in info.value.message
    chosen, _ = select_offer(td, Constraints("RTX 4090", "tensordock", vram_gb=8, min_confidence=0.2))
    assert chosen.id == "t1"


def test_absent_confidence_counts_as_certain():
    raw = {"id": "x", "provider": "vastai", "gpu_type": "RTX 4090", "price_per_hour": 0.4, "vram_gb": 23}
    assert Offer.model_validate(raw).availability_confidence == 1.0


def test_price_cap_and_no_offers_messages():
    with pytest.raises(NoEligibleOffer, match=r"over the price cap of \$0.30/h, cheapest \$0.40/h"):
        select_offer([offer("a", price=0.4)], Constraints("RTX 4090", "vastai", vram_gb=8, max_price=0.3))
    with pytest.raises(NoEligibleOffer, match="no offers found for H200 NVL on vastai"):
        select_offer([offer("a")], Constraints("H200 NVL", "vastai", vram_gb=48))


def test_gpu_match_is_exact_after_normalising():
    offers = [offer("a80", gpu="A100 80GB", vram=80), offer("a40", gpu="A100", vram=40)]
    chosen, eligible = select_offer(offers, Constraints("A100 80GB", "vastai", vram_gb=24))
    assert [o.id for o in eligible] == ["a80"]
