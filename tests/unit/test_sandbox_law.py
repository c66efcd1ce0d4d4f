"""The sandbox's batching and power law (sandbox/law.py, docs/sandbox.md "Batching and power law"):
the numbers, the catalog's per-runtime factors and their overrides, and nvidia-smi's power following load."""

from __future__ import annotations

import time

import pytest
import yaml

from pytest_gpubench.runtime_facts import all_facts
from pytest_gpubench.sandbox.catalog import DEFAULT_CATALOG, CatalogError, load_catalog
from pytest_gpubench.sandbox.instance_spec import InstanceSpec
from pytest_gpubench.sandbox.instances import instance_document
from pytest_gpubench.sandbox.law import LawPoint, batched_point, expected_point, expected_power_w
from pytest_gpubench.sandbox.nvidia_smi_standin import read_gpus, utilization_pct
from pytest_gpubench.sandbox.standin_state import LoadedModel, RuntimeState, StateStore

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128)
#: The runtimes the sandbox serves with the batching engine (the worker's containers run one stream each).
SANDBOX_RUNTIMES = ("ollama", "vllm", "sglang", "tgi", "llamacpp")


def test_one_stream_is_the_catalog_rate_and_a_batch_shares_each_step():
    assert batched_point(200.0, 40.0, 2.0, 1) == LawPoint(200.0, 200.0, 40.0)
    aggregate, per_stream, ttft = batched_point(200.0, 40.0, 2.0, 4)  # s = 1 + 3 / 2 = 2.5
    assert (aggregate, per_stream, ttft) == pytest.approx((320.0, 80.0, 100.0))
    assert batched_point(200.0, 40.0, None, 8) == LawPoint(1600.0, 200.0, 40.0)  # no factor: free
    # The aggregate approaches F x r1 and never passes it.
    totals = [batched_point(100.0, 10.0, 12.0, c).output_tps for c in CONCURRENCIES + (100_000,)]
    assert totals == sorted(totals) and totals[-1] == pytest.approx(1200.0, rel=1e-3)


def test_output_tokens_count_the_prefill_and_a_queue_waits():
    # One request holds its slot s * (ttft + n / r1): 2.5 * (0.04 + 100 / 200) = 1.35 s.
    point = batched_point(200.0, 40.0, 2.0, 4, output_tokens=100)
    assert point.output_tps == pytest.approx(4 * 100 / 1.35)
    assert point.ttft_ms == pytest.approx(100.0)
    # Eight clients on four slots: the same throughput, and each waits one request's time more.
    queued = batched_point(200.0, 40.0, 2.0, 8, output_tokens=100, parallel=4)
    assert queued.output_tps == pytest.approx(point.output_tps)
    assert queued.per_stream_tps == pytest.approx(80.0)
    assert queued.ttft_ms == pytest.approx(100.0 + 1350.0)
    with pytest.raises(ValueError, match="output_tokens"):
        batched_point(200.0, 40.0, 2.0, 8, parallel=4)
    with pytest.raises(ValueError, match="at least 1"):
        batched_point(200.0, 40.0, 2.0, 0)


def test_each_runtime_batches_by_its_own_factor():
    catalog = load_catalog()
    r1 = catalog.rate("RTX 4090", "vastai", "qwen2:7b")[0]
    factors = {runtime: catalog.batch_ceiling("RTX 4090", "vastai", "qwen2:7b", runtime) / r1
               for runtime in SANDBOX_RUNTIMES}
    assert factors == pytest.approx({"ollama": 2.0, "llamacpp": 4.0, "tgi": 10.0, "vllm": 12.0, "sglang": 12.0},
                                    rel=1e-3)
    at_8 = {runtime: expected_point("RTX 4090", "qwen2:7b", runtime, 8, provider="vastai", catalog=catalog)
            for runtime in SANDBOX_RUNTIMES}
    assert at_8["ollama"].per_stream_tps < at_8["llamacpp"].per_stream_tps < at_8["tgi"].per_stream_tps \
        < at_8["vllm"].per_stream_tps < r1
    assert at_8["ollama"].ttft_ms > at_8["vllm"].ttft_ms  # prefill in steps shared with fewer, faster ones


def test_per_gpu_and_per_model_overrides_name_runtimes(tmp_path):
    raw = yaml.safe_load(DEFAULT_CATALOG.read_text())
    raw["batching"]["runtimes"]["tgi"] = 7.0
    raw["gpus"]["A100 80GB"]["batch_ceiling_factor"] = {"vllm": 30.0}
    raw["gpus"]["RTX 3090"]["batch_ceiling_factor"] = 3.0  # a number: every runtime on that card
    raw["rates"].append({"gpu": "RTX 4090", "model": "qwen2:7b", "provider": "vastai", "tokens_per_second": 195.3,
                         "ttft_ms": 40, "batch_ceiling_tokens_per_second": {"sglang": 4000.0}})
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw))
    catalog = load_catalog(path)
    assert catalog.ceiling_factor("A100 80GB", "vllm") == 30.0
    assert catalog.ceiling_factor("A100 80GB", "sglang") == 12.0  # not named there: the catalog's
    assert catalog.ceiling_factor("A100 80GB", "tgi") == 7.0
    assert catalog.ceiling_factor("A100 80GB", "ollama") == 2.0
    assert catalog.ceiling_factor("RTX 3090", "vllm") == catalog.ceiling_factor("RTX 3090", "ollama") == 3.0
    assert catalog.batch_ceiling("RTX 4090", "vastai", "qwen2:7b", "sglang") == 4000.0
    assert catalog.batch_ceiling("RTX 4090", "vastai", "qwen2:7b", "vllm") == pytest.approx(12 * 195.3, abs=0.1)
    # The instance carries every runtime's factor; a file without them falls back to the one factor.
    doc = instance_document(catalog, catalog.offer("vastai-18430201"), "s-1", 0.01, tmp_path)
    model = InstanceSpec.model_validate(doc).models["qwen2:7b"]
    programs = {facts.name: facts.sandbox.program for facts in all_facts() if facts.sandbox}
    assert model.ceiling_factor(programs["sglang"]) == pytest.approx(4000.0 / 195.3)
    assert model.ceiling_factor(programs["llamacpp"]) == model.ceiling_factor("llama-server") == pytest.approx(4.0)
    assert model.ceiling_factor(programs["ollama"]) == pytest.approx(2.0)
    old = model.model_copy(update={"batch_ceiling_factors": {}})
    assert old.ceiling_factor("vllm") == old.batch_ceiling_factor


@pytest.mark.parametrize(("where", "value", "message"), [
    (("batching", "runtimes"), {"vLLM": 3.0}, "batching.runtimes: unknown runtime 'vLLM'; known runtimes: ollama, vllm"),
    (("gpus", "RTX 4090", "batch_ceiling_factor"), {"vllm": -3},
     "gpus.RTX 4090.batch_ceiling_factor: vllm: must be a number above 0"),
    (("gpus", "RTX 4090", "batch_ceiling_factor"), "fast", "expected a number or a mapping {runtime: number}"),
])
def test_a_bad_factor_names_file_field_and_what_is_allowed(tmp_path, where, value, message):
    raw = yaml.safe_load(DEFAULT_CATALOG.read_text())
    node = raw
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_energy_per_token_falls_as_concurrency_rises_everywhere():
    catalog = load_catalog()
    for gpu, spec in catalog.gpus.items():
        for runtime in SANDBOX_RUNTIMES:
            joules = [expected_power_w(spec.power_limit_w, c)
                      / expected_point(gpu, "qwen2:1.5b", runtime, c, output_tokens=256, catalog=catalog).output_tps
                      for c in CONCURRENCIES]
            assert joules == sorted(joules, reverse=True) and joules[-1] < joules[0], (gpu, runtime)


def test_nvidia_smi_power_and_utilisation_follow_the_batch(tmp_path):
    catalog = load_catalog()
    spec = InstanceSpec.model_validate(instance_document(catalog, catalog.offer("vastai-18430201"), "s-1", 0.01,
                                                         tmp_path / "state"))
    limit = spec.gpu.power_limit_w
    store = StateStore(spec.state_dir)
    readings = {}
    for batch in (0, 1, 2, 4, 8, 32):
        store.write_runtime(RuntimeState(
            pid=1, active_requests=batch, busy_since=time.time() - 3600 if batch else None,
            idle_since=None if batch else time.time() - 3600,
            loaded=[LoadedModel(name="qwen2:7b", size=5 << 30, size_vram=5 << 30, digest="d" * 64)]))
        readings[batch] = read_gpus(spec)[0]
    power = [readings[b].power_draw_w for b in sorted(readings)]
    util = [readings[b].utilization_gpu for b in sorted(readings)]
    assert power == sorted(power) and util == sorted(util), (power, util)
    assert readings[0].power_draw_w == pytest.approx(0.045 * limit + 6, abs=1)  # idle: a cold card
    assert readings[1].power_draw_w == pytest.approx(expected_power_w(limit, 1), abs=2.5)  # ~55% of the limit
    assert readings[32].power_draw_w == pytest.approx(expected_power_w(limit, 32), abs=2.5)
    assert 0.5 * limit < readings[1].power_draw_w < 0.6 * limit < 0.95 * limit < readings[32].power_draw_w <= limit
    assert readings[1].utilization_gpu == pytest.approx(utilization_pct(1), abs=1.5)


def test_the_documented_factors_are_the_catalogs():
    from pathlib import Path

    catalog = load_catalog()
    text = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text(encoding="utf-8")
    section = text.split("## Batching and power law", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    documented = {name.strip(" `"): float(row[3]) for row in rows for name in row[1].split(",")}
    assert documented == {runtime: catalog.ceiling_factor("RTX 4090", runtime) for runtime in SANDBOX_RUNTIMES}
