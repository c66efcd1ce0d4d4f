"""Hooks for users (plugin/hookspec.py, docs/hooks.md), implemented in a conftest.py and
run against the sandbox: choose an offer, adjust a workload, receive each finished cell."""

from __future__ import annotations

import json

import pytest

from pytest_gpubench.cloud.offers import put_first
from pytest_gpubench.cloud.provider import Offer
from pytest_gpubench.errors import MatrixError, StageError
from pytest_gpubench.matrix.adjust import with_workload
from pytest_gpubench.matrix.cells import expand, parse_matrix

MATRIX = """
workload: {duration: 1s, max_tokens: 32, progress_interval: 1s, warmup_requests: 0}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:1.5b}
  - {gpu: RTX 3090, provider: vastai, model: qwen2:1.5b}
  - {gpu: A100 80GB, provider: vastai, model: qwen2:1.5b}
"""

#: One conftest implementing every hook; each cell meets a different case.
CONFTEST = """
import json


def pytest_gpubench_select_offer(cell, eligible, chosen, config):
    if cell.gpu == "RTX 3090":
        return "vastai-no-such-offer"  # not eligible: the cell fails at inventory
    return max(eligible, key=lambda offer: offer.price_per_hour)  # the dearest, not the plugin's cheapest


def pytest_gpubench_adjust_workload(cell, workload, config):
    if cell.gpu == "A100 80GB":
        return workload.model_copy(update={"concurrency": (4,)})  # the load point: refused
    return workload.model_copy(update={"max_tokens": 7})


def pytest_gpubench_cell_finished(finished, config):
    with open("finished.jsonl", "a") as out:
        out.write(json.dumps({"cell": finished.cell_key, "status": finished.status,
                              "stage": finished.failure_stage, "error": finished.error_message,
                              "max_tokens": finished.result.test_config.max_tokens if finished.result else None,
                              "price": finished.result.price_per_hour if finished.result else None,
                              "figures": finished.figures}) + "\\n")
"""


def test_a_conftest_chooses_offers_adjusts_workloads_and_receives_every_finished_cell(pytester, monkeypatch):
    for name in ("GPUBENCH_API_BASE", "GPUBENCH_STORE", "GPUBENCH_SANDBOX", "GPUBENCH_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    pytester.makefile(".yaml", gpubench_hooks=MATRIX)
    pytester.makeconftest(CONFTEST)
    # The sandbox's clock at 0.01, not the flag's 0.02: the hooks' effects do not depend on it.
    result = pytester.runpytest_subprocess("gpubench_hooks.yaml", "--gpubench-sandbox",
                                           "--gpubench-time-scale", "0.01", "-p", "no:cacheprovider",
                                           "--gpubench-store", str(pytester.path / "m.db"), timeout=300)
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=2)
    assert "During handling" not in out
    assert "pytest_gpubench_adjust_workload changed the concurrency of A100_80GB-vastai-qwen2:1.5b" in out, out
    finished = {row["cell"]: row for row in map(json.loads, (pytester.path / "finished.jsonl").read_text().splitlines())}
    # The A100 cell's workload was refused before its recording started: nothing finished for it.
    assert set(finished) == {"RTX_4090-vastai-qwen2:1.5b", "RTX_3090-vastai-qwen2:1.5b"}
    ran = finished["RTX_4090-vastai-qwen2:1.5b"]
    assert ran["status"] == "success" and ran["max_tokens"] == 7
    # The dearest of the four one-GPU offers (the 2x RTX 4090 machine is no offer for a one-GPU cell).
    assert ran["price"] == 0.322 and ran["figures"]["offer_id"] == "vastai-18430203"
    assert ran["figures"]["output_tokens_per_second"] > 0
    refused = finished["RTX_3090-vastai-qwen2:1.5b"]
    assert refused["status"] == "failed" and refused["stage"] == "inventory", refused
    assert "chose 'vastai-no-such-offer', which is not one of the 3 eligible offer(s)" in refused["error"]


def test_the_hooks_are_documented_to_pytest(pytester):
    """``pytest --help``-light: the specs are registered in every run, so a conftest may implement them."""
    pytester.makeconftest("def pytest_gpubench_cell_finished(finished, config):\n    pass\n")
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    pytester.runpytest("test_plain.py", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.makeconftest("def pytest_gpubench_no_such_hook(config):\n    pass\n")
    assert "unknown hook 'pytest_gpubench_no_such_hook'" in pytester.runpytest("test_plain.py").stdout.str()


# ------------------------------------------------------- the plain modules behind them

def offer(offer_id: str, price: float) -> Offer:
    return Offer(id=offer_id, provider="vastai", gpu_type="RTX 4090", vram_gb=24, price_per_hour=price,
                 available=True, availability_confidence=0.9)


def test_a_chosen_offer_goes_first_and_failover_keeps_the_plugin_s_order():
    eligible = [offer("a", 0.1), offer("b", 0.2), offer("c", 0.3)]
    assert [o.id for o in put_first(eligible, eligible[2], "hook")] == ["c", "a", "b"]
    assert [o.id for o in put_first(eligible, offer("b", 0.2), "hook")] == ["b", "a", "c"]  # equal by id
    with pytest.raises(StageError, match=r"hook chose 'z', which is not one of the 3 eligible offer\(s\): a, b, c"):
        put_first(eligible, offer("z", 0.1), "hook")


def test_an_adjusted_workload_is_validated_like_a_matrix_and_keeps_the_load_point():
    (cell,) = expand(parse_matrix("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n", "m.yaml"))
    assert with_workload(cell, None, "hook") is cell
    longer = with_workload(cell, cell.workload.model_copy(update={"duration": 10.0}), "hook")
    assert longer.workload.duration == 10.0 and longer.cell_id == cell.cell_id
    assert with_workload(cell, {**cell.workload.model_dump(), "max_tokens": 9}, "hook").workload.max_tokens == 9
    with pytest.raises(MatrixError, match="hook returned an invalid workload for RTX_4090-vastai-qwen2:7b: "
                                          "max_tokens"):
        with_workload(cell, cell.workload.model_copy(update={"max_tokens": -1}), "hook")
    with pytest.raises(MatrixError, match="hook changed the rate of"):
        with_workload(cell, cell.workload.model_copy(update={"rate": 2.0}), "hook")
