"""The ``hosts`` provider's choice of a machine for a cell (no SSH, no store: offers only)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pytest_gpubench.cloud.hosts_provider import HostsProvider, LocalProvider, on_leased_machine
from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.errors import NoEligibleOffer, Stage, StageError
from pytest_gpubench.settings import Settings

INVENTORY = """
hosts:
  big: {address: 10.0.0.1, agent: true, gpu: RTX 4090, gpus: 2, price_per_hour: 1.0, tags: [lab]}
  small: {address: 10.0.0.2, agent: true, gpu: RTX 4090, gpus: 1, price_per_hour: 0.4, tags: [lab, desk]}
  other: {address: 10.0.0.3, agent: true, gpu: A100 80GB}
"""


@pytest.fixture
def provider(tmp_path) -> HostsProvider:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    return HostsProvider(Settings(hosts=str(path)))


def choose(hosts: HostsProvider, **wanted):
    return asyncio.run(hosts.choose_offer(Constraints(**{"gpu": "RTX 4090", "provider": "hosts", "vram_gb": 8,
                                                            **wanted})))


def test_a_cell_pays_the_share_of_the_machine_it_holds_cheapest_first(provider):
    choice = choose(provider, runtime="vllm")
    assert [(o.id, o.gpu_count, o.price_per_hour) for o in choice.eligible] == [
        ("small", 1, 0.4), ("big/gpus=1", 1, 0.5)]
    assert choice.offers_found == 2 and choice.offer.machine_id == "small"
    # Ollama serves one server per machine (any runtime without a server per cell): it holds, and pays
    # for, every GPU of it.
    assert [(o.id, o.gpu_count, o.price_per_hour) for o in choose(provider, runtime="ollama").eligible] == [
        ("small", 1, 0.4), ("big", 2, 1.0)]
    assert [o.id for o in choose(provider, runtime="vllm", gpu_count=2).eligible] == ["big"]


def test_a_rows_provider_pins_a_host_by_name_or_tag(provider):
    assert [o.machine_id for o in choose(provider, provider="big", runtime="vllm").eligible] == ["big"]
    assert [o.machine_id for o in choose(provider, provider="desk", runtime="vllm").eligible] == ["small"]
    assert choose(provider, provider="big", runtime="vllm").offer.provider == "big"


def test_no_eligible_machine_says_why(provider):
    with pytest.raises(NoEligibleOffer, match="fewer than 4 GPUs"):
        choose(provider, gpu_count=4)
    with pytest.raises(NoEligibleOffer, match="over the price cap of \\$0.30/h"):
        choose(provider, runtime="vllm", max_price=0.3)
    with pytest.raises(NoEligibleOffer, match="no hosts machine with a H100"):
        choose(provider, gpu="H100")


def test_without_an_inventory_or_with_a_bad_one_the_cell_fails_at_inventory(tmp_path):
    with pytest.raises(StageError, match="needs a hosts inventory") as missing:
        choose(HostsProvider(Settings()))
    assert missing.value.stage == Stage.INVENTORY
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts: {a: {address: x, agent: true, gpu: T4, gpus: 0}}\n")
    with pytest.raises(StageError, match="hosts.a.gpus") as broken:
        choose(HostsProvider(Settings()), hosts_file=str(bad))
    assert broken.value.stage == Stage.INVENTORY
    assert asyncio.run(HostsProvider(Settings()).offers()) == []  # `gpubench offers` without one: nothing


def fake_nvidia_smi(tmp_path, monkeypatch, *gpus: str) -> None:
    """This machine's ``nvidia-smi`` answering the ``index,name`` query with ``gpus`` (nvidia-smi's names)."""
    program = tmp_path / "bin" / "nvidia-smi"
    program.parent.mkdir()
    lines = "".join(f"{index}, {name}\n" for index, name in enumerate(gpus))
    program.write_text(f"#!/bin/sh\nprintf '%s' '{lines}'\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(program.parent))


@pytest.mark.parametrize(("product", "row_gpu"), [("NVIDIA A100-SXM4-80GB", "A100 80GB"),
                                                  ("NVIDIA H100 80GB HBM3", "H100 80GB"),
                                                  ("NVIDIA GeForce RTX 4090", "RTX 4090")])
def test_the_local_machine_is_named_as_a_matrix_names_its_gpu(tmp_path, monkeypatch, product, row_gpu):
    fake_nvidia_smi(tmp_path, monkeypatch, product)
    local = LocalProvider(Settings())
    offer = asyncio.run(local.choose_offer(Constraints(gpu=row_gpu, provider="local", vram_gb=8))).offer
    assert offer.gpu_type == row_gpu and offer.gpu_count == 1


def test_names_and_session_ids():
    assert on_leased_machine("hosts-lab1-1-abc123") and on_leased_machine("local-local-2-ff00aa")
    assert not on_leased_machine("3f2b0c5e-1111-4111-8111-111111111111")


def test_a_machine_with_mixed_gpus_leases_only_the_gpus_of_the_cells_type(tmp_path, monkeypatch):
    from pytest_gpubench.store.opening import open_store

    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB")
    with open_store(tmp_path / "manifest.db") as store:
        store.start_run("r1", [], [])
        local = LocalProvider(Settings(run_id="r1"), lambda: store)

        async def lease(gpu: str, gpus: int, runtime: str) -> tuple[str, tuple[int, ...]]:
            choice = await local.choose_offer(Constraints(gpu=gpu, provider="local", vram_gb=8, gpu_count=gpus,
                                                          runtime=runtime))
            created = await local.create(choice.offer, "c", 1, runtime=runtime)
            running = await local.wait_running(created.session.id, timeout=5)
            return choice.offer.gpu_type, local.ssh_details(created, running).gpu_indices

        async def cells():
            try:
                return await lease("A100 80GB", 2, "vllm"), await lease("RTX 4090", 1, "sglang")
            finally:
                await local.aclose()

        a100, rtx = asyncio.run(cells())
    assert a100 == ("A100 80GB", (0, 2)) and rtx == ("RTX 4090", (1,))
    with pytest.raises(NoEligibleOffer, match="fewer than 2 GPUs"):
        asyncio.run(LocalProvider(Settings()).choose_offer(Constraints(gpu="RTX 4090", provider="local", vram_gb=8,
                                                                       gpu_count=2)))


def test_on_a_mixed_machine_a_server_per_machine_runtime_holds_every_gpu_and_uses_its_own(tmp_path, monkeypatch):
    """Ollama runs one server per machine: its cell leases all the machine's GPUs, so a cell of the
    other GPU type cannot share (or, finding it gpubench's, end) that server; it serves on its type's GPU."""
    from pytest_gpubench.store.opening import open_store

    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB")
    with open_store(tmp_path / "manifest.db") as store:
        store.start_run("r1", [], [])
        local = LocalProvider(Settings(run_id="r1"), lambda: store)

        async def cells():
            try:
                choice = await local.choose_offer(Constraints(gpu="RTX 4090", provider="local", vram_gb=8,
                                                              runtime="ollama"))
                created = await local.create(choice.offer, "ollama-cell", 1, runtime="ollama")
                running = await local.wait_running(created.session.id, timeout=5)
                other = await local.choose_offer(Constraints(gpu="A100 80GB", provider="local", vram_gb=8,
                                                             runtime="ollama"))
                waiting = await local.create(other.offer, "other-cell", 1, runtime="ollama")
                (lease,) = store.gpu_leases(active_at=time.time())
                return local.ssh_details(created, running).gpu_indices, waiting.session.status, lease
            finally:
                await local.aclose()

        own, other_status, held = asyncio.run(cells())
    assert own == (1,) and held.gpu_indices == (0, 1, 2)
    assert other_status == "pending"  # waits for the machine: never a second cell on one Ollama


TWINS = """
hosts:
  lab1: {address: 10.0.0.1, agent: true, gpu: RTX 4090, gpus: 1, price_per_hour: 0.4}
  lab2: {address: 10.0.0.2, agent: true, gpu: RTX 4090, gpus: 1, price_per_hour: 0.4}
  dear: {address: 10.0.0.3, agent: true, gpu: RTX 4090, gpus: 1, price_per_hour: 0.9}
"""


def test_a_machine_taken_since_it_was_offered_gives_way_to_an_idle_twin_not_a_dearer_one(tmp_path):
    """Two workers choosing at the same moment both see lab1 idle; the second to lease it goes to lab2
    (same shape, same price) instead of waiting, and says so; with lab2 busy too it waits, never on
    the dearer machine."""
    from pytest_gpubench.store.sqlite_store import SqliteStore

    (tmp_path / "hosts.yaml").write_text(TWINS)
    store = SqliteStore.open(tmp_path / "manifest.db")
    hosts = HostsProvider(Settings(hosts=str(tmp_path / "hosts.yaml"), run_id="twins"), store=lambda: store)

    async def scenario():
        wanted = Constraints(gpu="RTX 4090", provider="hosts", vram_gb=8, runtime="vllm")
        offer = (await hosts.choose_offer(wanted)).offer
        first = await hosts.create(offer, "twins/first", 1, runtime="vllm")
        second = await hosts.create(offer, "twins/second", 1, runtime="vllm")  # chose lab1 before first leased it
        third = await hosts.create(offer, "twins/third", 1, runtime="vllm")
        return offer, first, second, third

    try:
        offer, first, second, third = asyncio.run(scenario())
    finally:
        store.close()
    assert offer.machine_id == "lab1"
    assert (first.session.status, first.placed) == ("running", None)
    assert second.session.status == "running"
    assert second.placed is not None and (second.placed.machine_id, second.placed.price_per_hour) == ("lab2", 0.4)
    assert second.session.offer_id == "lab2" and second.session.id.startswith("hosts-lab2-")
    # Both twins busy: the cell queues on the machine it was offered, not on the dearer one.
    assert (third.session.status, third.placed) == ("pending", None) and third.session.id.startswith("hosts-lab1-")
