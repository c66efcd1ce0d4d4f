"""``gpubench offers`` against the sandbox's GPU Shopper API."""

from __future__ import annotations

import json
import socket

import pytest

from pytest_gpubench.commands.cli import main as gpubench


@pytest.fixture(scope="module")
def listed(api):
    """The sandbox inventory as the API gives it."""
    return api.get("/api/v1/inventory").json()["offers"]


def table_rows(out: str) -> list[list[str]]:
    """The table's rows split on runs of 2+ spaces (cells may hold one space)."""
    import re

    lines = out.splitlines()
    assert lines[0].split() == ["GPU", "provider", "$/hour", "VRAM", "GB", "GPUs", "confidence", "location",
                                "offer", "id"]
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:] if "  " in line and not line.startswith("*")]


def test_lists_one_gpu_s_offers_cheapest_first_with_price_vram_confidence_location(sandbox, listed, capsys):
    assert gpubench(["offers", "--api", sandbox.url, "--gpu", "rtx4090"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    expected = sorted((o for o in listed if o["gpu_type"] == "RTX 4090"),
                      key=lambda o: (o["price_per_hour"], -o["availability_confidence"]))
    assert [row[-1] for row in rows] == [o["id"] for o in expected]
    by_id = {row[-1]: row for row in rows}
    for offer in expected:
        gpu, provider, price, vram, count, confidence, location, _ = by_id[offer["id"]]
        assert (gpu, provider, location) == ("RTX 4090", offer["provider"], offer["location"])
        assert float(price) == pytest.approx(offer["price_per_hour"], abs=0.0005)
        assert float(vram) == offer["vram_gb"] and int(count) == offer["gpu_count"]
        assert float(confidence.rstrip(" *")) == pytest.approx(offer["availability_confidence"], abs=0.005)
        assert confidence.endswith("*") == (offer["availability_confidence"] <= 0.5)
    assert f"{len(expected)} offer(s) of 1 GPU type(s) on 2 provider(s) at {sandbox.url}" in out
    assert "* availability confidence not above 0.5" in out  # TensorDock's flat 0.3


def test_provider_filter_matches_as_pytest_s_does(sandbox, listed, capsys):
    assert gpubench(["offers", "--api", sandbox.url, "--provider", "Vast.ai", "--gpu", "A100 80GB"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert {row[-1] for row in rows} == {o["id"] for o in listed
                                         if o["provider"] == "vastai" and o["gpu_type"] == "A100 80GB"}


def test_json_has_the_api_s_fields(sandbox, listed, capsys):
    assert gpubench(["offers", "--api", sandbox.url, "--provider", "tensordock", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {o["id"] for o in data} == {o["id"] for o in listed if o["provider"] == "tensordock"}
    assert {"price_per_hour", "vram_gb", "availability_confidence", "location", "gpu_type"} <= set(data[0])


def test_nothing_matching_names_what_is_on_offer(sandbox, capsys):
    assert gpubench(["offers", "--api", sandbox.url, "--gpu", "4090"]) == 1
    err = capsys.readouterr().err
    assert "gpubench offers: error: no offer for GPU '4090' (close: RTX 4090); GPUs on offer: A100 80GB," in err
    assert gpubench(["offers", "--api", sandbox.url, "--gpu", "H200 NVL", "--provider", "tensordock"]) == 1
    assert "no offer matches H200 NVL and tensordock together; on offer: " in capsys.readouterr().err


def test_an_unreachable_api_is_one_line_naming_the_sandbox(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert gpubench(["offers", "--api", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no GPU Shopper API answers" in err and "--sandbox" in err


def test_api_and_sandbox_together_is_a_usage_error(capsys):
    assert gpubench(["offers", "--api", "http://127.0.0.1:1", "--sandbox"]) == 2
    assert "give --api URL or --sandbox, not both" in capsys.readouterr().err


def test_sandbox_lists_its_catalog_without_writing_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert gpubench(["offers", "--sandbox", "--gpu", "H200 NVL"]) == 0
    out = capsys.readouterr().out
    assert "H200 NVL" in out and "at the sandbox" in out
    assert list(tmp_path.iterdir()) == []
