import pytest

from pytest_gpubench.errors import NoEligibleOffer
from pytest_gpubench.cloud.offers import select_offer
from pytest_gpubench.cloud.provider import Constraints, Offer


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


def test_only_offers_with_the_cells_gpu_count_are_eligible():
    offers = [offer("one", price=0.2), offer("two", price=0.6, gpu_count=2), offer("eight", price=3.0, gpu_count=8)]
    chosen, eligible = select_offer(offers, Constraints("RTX 4090", "vastai", vram_gb=8))
    assert [o.id for o in eligible] == ["one"]  # a bigger machine is billed whole: never rented for one GPU
    chosen, eligible = select_offer(offers, Constraints("RTX 4090", "vastai", vram_gb=8, gpu_count=2))
    assert chosen.id == "two" and [o.id for o in eligible] == ["two"]


def test_no_offer_with_the_count_says_which_counts_there_are():
    offers = [offer("one"), offer("one-b"), offer("eight", gpu_count=8)]
    with pytest.raises(NoEligibleOffer) as info:
        select_offer(offers, Constraints("RTX 4090", "vastai", vram_gb=8, gpu_count=2))
    assert info.value.message == ("3 offer(s) for 2x RTX 4090 on vastai, none eligible: "
                                  "2 with 1 GPU(s), not 2; 1 with 8 GPU(s), not 2")
    with pytest.raises(NoEligibleOffer, match=r"no offers found for 4x A100 80GB on vastai \(the inventory was "
                                              r"asked for at least 4 GPUs\)"):
        select_offer([], Constraints("A100 80GB", "vastai", vram_gb=8, gpu_count=4))


def test_vram_counts_every_gpu_of_the_offer():
    # Vast.ai's vram_gb is one GPU's: two 24 GB cards hold a 40 GB model, one does not.
    chosen, _ = select_offer([offer("two", vram=23, gpu_count=2)],
                             Constraints("RTX 4090", "vastai", vram_gb=40, gpu_count=2))
    assert chosen.id == "two"
    with pytest.raises(NoEligibleOffer, match="less than the 60 GB of VRAM the model needs, largest 46 GB"):
        select_offer([offer("two", vram=23, gpu_count=2)], Constraints("RTX 4090", "vastai", vram_gb=60, gpu_count=2))
