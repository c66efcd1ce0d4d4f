"""Multi-GPU cells' offers against the sandbox's inventory: the API's ``min_gpu_count`` filter and the
exact count the selection keeps (cloud/offers.py, cloud/shopper_provider.py)."""

from __future__ import annotations

import asyncio

import pytest
from e2e_helpers import SANDBOX_TOKEN

from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.commands.plan import make_plan, render
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.errors import NoEligibleOffer
from pytest_gpubench.settings import resolve


def provider_on(url: str, *, fixed_offers: bool = False) -> ShopperProvider:
    settings = resolve({"api": url, "time_scale": "0.01"}, {"GPUBENCH_API_TOKEN": SANDBOX_TOKEN}, lambda name: None)
    return ShopperProvider.from_settings(settings, fixed_offers=fixed_offers)


@pytest.mark.parametrize("fixed_offers", [False, True])
def test_each_gpu_count_rents_its_own_machine(sandbox, fixed_offers: bool) -> None:
    provider = provider_on(sandbox.url, fixed_offers=fixed_offers)

    async def choose(gpu: str, count: int):
        return await provider.choose_offer(Constraints(gpu, "vastai", vram_gb=8, gpu_count=count))

    async def main():
        try:
            return [await choose("RTX 4090", 1), await choose("RTX 4090", 2), await choose("A100 80GB", 4),
                    await choose("H200 NVL", 8)]
        finally:
            await provider.client.aclose()

    one, two, four, eight = asyncio.run(main())
    assert one.offer.gpu_count == 1 and all(o.gpu_count == 1 for o in one.eligible)
    assert (two.offer.id, two.offer.gpu_count) == ("vastai-18430204", 2)
    assert two.offers_found < one.offers_found  # the server was asked for machines with at least 2 GPUs
    assert (four.offer.id, four.offer.gpu_count) == ("vastai-18430403", 4)
    assert (eight.offer.id, eight.offer.gpu_count) == ("vastai-18430503", 8)


def test_a_count_nobody_offers_is_no_eligible_offer(sandbox) -> None:
    provider = provider_on(sandbox.url)

    async def main():
        try:
            return await provider.choose_offer(Constraints("RTX 4090", "vastai", vram_gb=8, gpu_count=8))
        finally:
            await provider.client.aclose()

    with pytest.raises(NoEligibleOffer, match="no offers found for 8x RTX 4090 on vastai"):
        asyncio.run(main())


def test_the_plan_rents_a_two_gpu_machine_at_its_whole_price(sandbox, tmp_path) -> None:
    path = tmp_path / "gpubench_plan.yaml"
    path.write_text("runtime: vllm\nmatrix:\n"
                    "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n"
                    "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', gpus: 2}\n")
    plan = make_plan([str(path)], api=sandbox.url, manifest=tmp_path / "none" / "manifest.db")
    one, two = plan.cells
    assert (one.gpus, two.gpus) == (1, 2)
    assert two.cell.endswith("qwen2:7b-x2-runtime_vllm") and two.offer_id == "vastai-18430204"
    assert two.price_per_hour == pytest.approx(0.62)  # the machine's price, both GPUs
    assert one.offer_id != two.offer_id and len(plan.sessions) == 2
    assert [s.gpu_count for s in plan.sessions] == [1, 2]
    assert plan.totals.gpu_hours == pytest.approx((plan.sessions[0].seconds + 2 * plan.sessions[1].seconds) / 3600)
    header, first, second = render(plan)[:3]
    assert header.split()[-1] == "GPUs" and first.split()[-1] == "1" and second.split()[-1] == "2"


def test_a_plan_of_one_gpu_cells_has_no_gpus_column(sandbox, tmp_path) -> None:
    path = tmp_path / "gpubench_plan.yaml"
    path.write_text("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    plan = make_plan([str(path)], api=sandbox.url, manifest=tmp_path / "none" / "manifest.db")
    assert "GPUs" not in render(plan)[0]
