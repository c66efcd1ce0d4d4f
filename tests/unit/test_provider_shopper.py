import asyncio

import httpx
import pytest

from pytest_gpubench.errors import NoEligibleOffer, StageError
from pytest_gpubench.cloud.provider import Constraints, consumer_id
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.run.provisioning import reservation_hours
from pytest_gpubench.settings import resolve
from pytest_gpubench.cloud.shopper_client import ShopperClient

SETTINGS = resolve({"time_scale": "0.001"}, {}, lambda name: None)


def provider_for(handler):
    return ShopperProvider(ShopperClient("http://shopper.test", transport=httpx.MockTransport(handler)), SETTINGS)


def session(status, **extra):
    return {"id": "s-1", "status": status, "ssh_port": 22, **extra}


def test_consumer_id_names_run_cell_and_attempt():
    first = consumer_id("20261122T000000Z-abc123", "RTX_4090-vastai-qwen2:7b")
    assert first == "gpubench-20261122T000000Z-abc123-RTX_4090-vastai-qwen2:7b-a1"
    assert consumer_id("r", "cell@test_x", attempt=2).endswith("cell_test_x-a2")


def test_reservation_is_whole_hours_within_server_limits():
    assert reservation_hours(SETTINGS, duration=300) == 1
    full_clock = resolve({}, {}, lambda name: None)
    assert reservation_hours(full_clock, duration=3 * 3600) == 4  # 25 min budget + 3 h benchmark
    assert reservation_hours(full_clock, duration=24 * 3600) == 12  # the server's cap


def test_wait_running_polls_until_running_and_reports_each_poll():
    answers = iter([session("provisioning"), session("provisioning"),
                    session("running", ssh_host="127.0.0.1", ssh_port=2201)])
    seen = []
    provider = provider_for(lambda request: httpx.Response(200, json=next(answers)))
    running = asyncio.run(provider.wait_running("s-1", lambda s, waited: seen.append(s.status)))
    assert running.ssh_port == 2201
    assert seen == ["provisioning", "provisioning", "running"]


@pytest.mark.parametrize("status", ["failed", "stopped"])
def test_wait_running_fails_at_provision_with_the_servers_error(status):
    provider = provider_for(lambda request: httpx.Response(200, json=session(status, error="No available public IPs")))
    with pytest.raises(StageError) as info:
        asyncio.run(provider.wait_running("s-1"))
    assert str(info.value.stage) == "provision"
    assert f"session s-1 {status}: No available public IPs" in str(info.value)


def test_choose_offer_skips_with_reason_when_nothing_fits():
    offers = {"offers": [{"id": "td-1", "provider": "tensordock", "gpu_type": "RTX 4090", "vram_gb": 24,
                          "price_per_hour": 0.35, "availability_confidence": 0.3}], "count": 1, "total": 1}
    provider = provider_for(lambda request: httpx.Response(200, json=offers))
    with pytest.raises(NoEligibleOffer, match="not above 0.5 for tensordock"):
        asyncio.run(provider.choose_offer(Constraints("RTX4090", "tensordock", vram_gb=8)))
    choice = asyncio.run(provider.choose_offer(Constraints("RTX4090", "tensordock", vram_gb=8, min_confidence=0.2)))
    assert choice.offer.id == "td-1" and choice.offers_found == 1


@pytest.mark.parametrize("fixed_offers, readings", [(False, 3), (True, 2)])
def test_fixed_offers_reads_each_marketplace_once(fixed_offers, readings):
    """``gpubench plan`` prices every cell against one reading of each marketplace's inventory."""
    asked = []
    offers = {"offers": [{"id": "v-1", "provider": "vastai", "gpu_type": "RTX 4090", "vram_gb": 24,
                          "price_per_hour": 0.35, "availability_confidence": 0.9}], "count": 1, "total": 1}

    def answer(request):
        asked.append(request.url.params.get("provider"))
        return httpx.Response(200, json=offers)

    provider = ShopperProvider(ShopperClient("http://shopper.test", transport=httpx.MockTransport(answer)), SETTINGS,
                               fixed_offers=fixed_offers)
    for wanted in (Constraints("RTX4090", "vastai", vram_gb=8), Constraints("RTX4090", "vastai", vram_gb=16)):
        assert asyncio.run(provider.choose_offer(wanted)).offer.id == "v-1"
    with pytest.raises(NoEligibleOffer):
        asyncio.run(provider.choose_offer(Constraints("RTX4090", "tensordock", vram_gb=8)))
    assert len(asked) == readings and set(asked) == {"vastai", "tensordock"}
