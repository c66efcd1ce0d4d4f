"""Tests of pytest_gpubench.results: statistics, costs, nvidia-smi parsing, GPU names."""

from __future__ import annotations

import json
import random
import statistics
from datetime import datetime, timezone

import pytest

from pytest_gpubench.results import (
    BenchmarkResult,
    CostAnalysis,
    GPUStats,
    HardwareInfo,
    ModelInfo,
    PerformanceResults,
    RequestRecord,
    TestConfig,
    cost_analysis,
    decode_tokens_per_second,
    gpu_name_matches,
    parse_gpu_query_csv,
    parse_nvidia_smi_xml,
    percentile,
    summarize,
)


def record(index: int, **fields) -> RequestRecord:
    base = dict(index=index, prompt_index=index % 3, started_at=1_770_000_000.0 + index,
                ttft_ms=100.0, latency_ms=1000.0, output_tokens=10)
    base.update(fields)
    return RequestRecord(**base)


# ------------------------------------------------------------------------ records


def test_request_record_ok_and_counted_tokens():
    good = record(0, eval_count=12)
    bad = record(1, error="runner crashed")
    assert good.ok and not bad.ok
    assert good.counted_tokens == 12
    assert record(2).counted_tokens == 10


def test_request_record_parses_generator_json():
    line = json.dumps({"index": 3, "warmup": True, "prompt_index": 1, "started_at": 1.5,
                       "ttft_ms": None, "latency_ms": 20.0, "output_tokens": 0,
                       "eval_count": None, "eval_duration_ns": None, "prompt_tokens": None,
                       "tokens_per_second": None, "error": "model not found",
                       "future_field": 1})
    parsed = RequestRecord.model_validate_json(line)
    assert parsed.warmup and parsed.error == "model not found" and not parsed.ok


def test_decode_tokens_per_second():
    assert decode_tokens_per_second(101, 1100.0, 100.0) == pytest.approx(100.0)
    assert decode_tokens_per_second(1, 1100.0, 100.0) is None
    assert decode_tokens_per_second(0, 1100.0, 100.0) is None
    assert decode_tokens_per_second(10, 1100.0, None) is None
    assert decode_tokens_per_second(10, 100.0, 100.0) is None


# -------------------------------------------------------------------- percentiles


def test_percentile_matches_numpy_linear_on_known_lists():
    ten = list(range(1, 11))
    assert percentile(ten, 50) == pytest.approx(5.5)
    assert percentile(ten, 95) == pytest.approx(9.55)
    assert percentile(ten, 99) == pytest.approx(9.91)
    assert percentile(ten, 0) == 1 and percentile(ten, 100) == 10
    five = [50, 15, 40, 35, 20]  # order must not matter
    assert percentile(five, 40) == pytest.approx(29.0)
    assert percentile(five, 95) == pytest.approx(48.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def test_percentile_agrees_with_inclusive_quantiles():
    rng = random.Random(4)
    values = [rng.uniform(1, 500) for _ in range(37)]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for p in (1, 25, 50, 95, 99):
        assert percentile(values, p) == pytest.approx(cuts[p - 1])


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


# ---------------------------------------------------------------------- summarize


def test_summarize_hand_computed():
    records = [
        record(0, warmup=True, tokens_per_second=999.0, latency_ms=5000.0, eval_count=500,
               prompt_tokens=50),
        record(1, tokens_per_second=10.0, latency_ms=1000.0, ttft_ms=100.0, output_tokens=10,
               eval_count=12, prompt_tokens=5),
        record(2, tokens_per_second=20.0, latency_ms=2000.0, ttft_ms=200.0, output_tokens=20),
        record(3, tokens_per_second=30.0, latency_ms=3000.0, ttft_ms=300.0, output_tokens=30,
               eval_count=30, prompt_tokens=7),
        # one token: no decode rate, but it counts as a successful request
        record(4, tokens_per_second=None, latency_ms=4000.0, ttft_ms=400.0, output_tokens=1),
        record(5, error="connection reset", latency_ms=9000.0, output_tokens=3, eval_count=3),
    ]
    r = summarize(records, duration_seconds=60.0)
    assert r.total_requests == 5
    assert r.total_errors == 1
    assert r.error_rate == pytest.approx(0.2)
    assert r.total_tokens == 12 + 20 + 30 + 1  # eval_count where present
    assert r.total_prompt_tokens == 12
    assert r.duration_seconds == 60.0
    assert r.avg_tokens_per_second == pytest.approx(20.0)
    assert (r.min_tokens_per_second, r.max_tokens_per_second) == (10.0, 30.0)
    assert r.p50_tokens_per_second == pytest.approx(20.0)
    assert r.p95_tokens_per_second == pytest.approx(29.0)
    assert r.p99_tokens_per_second == pytest.approx(29.8)
    assert r.avg_latency_ms == pytest.approx(2500.0)
    assert (r.min_latency_ms, r.max_latency_ms) == (1000.0, 4000.0)
    assert r.p50_latency_ms == pytest.approx(2500.0)
    assert r.p95_latency_ms == pytest.approx(3850.0)
    assert r.p99_latency_ms == pytest.approx(3970.0)
    assert r.avg_ttft_ms == pytest.approx(250.0)
    assert r.p50_ttft_ms == pytest.approx(250.0)
    assert r.p95_ttft_ms == pytest.approx(385.0)
    assert r.requests_per_minute == pytest.approx(4.0)
    assert r.avg_tokens_per_request == pytest.approx(63 / 4)


def test_summarize_excludes_warmups_entirely():
    warm = [record(i, warmup=True, error="cold start" if i else None) for i in range(3)]
    measured = [record(10, tokens_per_second=50.0)]
    r = summarize(warm + measured, duration_seconds=30.0)
    assert r.total_requests == 1 and r.total_errors == 0 and r.error_rate == 0
    assert r.avg_tokens_per_second == 50.0
    assert r.requests_per_minute == pytest.approx(2.0)


@pytest.mark.parametrize(
    "records",
    [[], [record(0, warmup=True)], [record(0, error="a"), record(1, error="b")]],
    ids=["nothing", "only-warmup", "only-errors"],
)
def test_summarize_without_successes_gives_zeros(records):
    r = summarize(records, duration_seconds=0.0)
    assert r.avg_tokens_per_second == 0 and r.p99_latency_ms == 0 and r.avg_ttft_ms == 0
    assert r.requests_per_minute == 0 and r.avg_tokens_per_request == 0
    assert r.total_tokens == 0
    errors = sum(1 for x in records if not x.warmup)
    assert r.total_errors == errors
    assert r.error_rate == (1.0 if errors else 0.0)


# ---------------------------------------------------------------------------- cost


def test_cost_analysis_arithmetic():
    c = cost_analysis(0.40, 100.0)
    assert c.cost_per_million_tokens == pytest.approx(1.1111, abs=1e-4)
    assert c.tokens_per_dollar == pytest.approx(900_000)
    assert c.cost_per_hour == 0.40
    assert c.estimated_monthly_24x7 == pytest.approx(288.0)


def test_cost_analysis_matches_go_test_case():
    # internal/benchmark/parser_test.go: $0.36/h at 100 tok/s
    c = cost_analysis(0.36, 100.0)
    assert c.tokens_per_dollar == pytest.approx(1_000_000)
    assert c.cost_per_million_tokens == pytest.approx(1.0)
    assert c.estimated_monthly_24x7 == pytest.approx(259.2)


def test_cost_analysis_zero_inputs_are_undefined_not_errors():
    no_tps = cost_analysis(2.5, 0.0)
    assert no_tps.cost_per_million_tokens is None
    assert no_tps.tokens_per_dollar == 0.0
    assert no_tps.estimated_monthly_24x7 == pytest.approx(1800.0)
    free = cost_analysis(0.0, 50.0)
    assert free.tokens_per_dollar is None
    assert free.cost_per_million_tokens == 0.0
    both = cost_analysis(0.0, 0.0)
    assert both == CostAnalysis(cost_per_hour=0.0, estimated_monthly_24x7=0.0)
    with pytest.raises(ValueError):
        cost_analysis(-1.0, 10.0)


def test_benchmark_result_cost_analysis_uses_avg_tps():
    result = BenchmarkResult(price_per_hour=0.4,
                             results=PerformanceResults(avg_tokens_per_second=100.0))
    assert result.cost_analysis().cost_per_million_tokens == pytest.approx(1.1111, abs=1e-4)


# -------------------------------------------------------------- the Go JSON shape

GO_FIELDS = {
    "": {"id", "timestamp", "hardware", "model", "test_config", "results", "gpu_stats",
         "provider", "location", "price_per_hour"},
    "hardware": {"gpu_name", "gpu_memory_mib", "gpu_count", "driver_version", "cuda_version",
                 "cpu_model", "cpu_cores", "ram_gib"},
    "model": {"name", "family", "parameter_count", "quantization", "size_gb", "runtime",
              "runtime_version"},
    "test_config": {"duration_minutes", "max_tokens", "prompt_types", "concurrent_reqs",
                    "warmup_requests"},
    "results": {"total_requests", "total_tokens", "total_prompt_tokens", "total_errors",
                "duration_seconds", "avg_tokens_per_second", "min_tokens_per_second",
                "max_tokens_per_second", "p50_tokens_per_second", "p95_tokens_per_second",
                "p99_tokens_per_second", "avg_latency_ms", "min_latency_ms", "max_latency_ms",
                "p50_latency_ms", "p95_latency_ms", "p99_latency_ms", "requests_per_minute",
                "avg_tokens_per_request", "error_rate", "avg_ttft_ms", "p50_ttft_ms",
                "p95_ttft_ms", "match_rate", "prompts_with_expected", "prompts_matching"},
    "gpu_stats": {"avg_utilization_pct", "max_utilization_pct", "avg_memory_used_mib",
                  "max_memory_used_mib", "avg_temperature_c", "max_temperature_c",
                  "avg_power_draw_w", "max_power_draw_w"},
}


def test_benchmark_result_json_matches_go_struct_tags():
    data = json.loads(BenchmarkResult().model_dump_json())
    assert set(data) == GO_FIELDS[""]
    for section, names in GO_FIELDS.items():
        if section:
            assert set(data[section]) == names, section
    assert set(CostAnalysis().model_dump()) == {
        "tokens_per_dollar", "cost_per_million_tokens", "cost_per_hour", "estimated_monthly_24x7"}


def test_benchmark_result_round_trip_and_timezone():
    result = BenchmarkResult(
        id="b-1",
        timestamp=datetime(2026, 2, 7, 10, 13, 6),  # naive: taken as UTC
        hardware=HardwareInfo(gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_mib=24564,
                              gpu_count=1),
        model=ModelInfo(name="qwen2:7b", runtime="ollama"),
        test_config=TestConfig(duration_minutes=5, max_tokens=256, prompt_types=["code"]),
        gpu_stats=GPUStats(max_memory_used_mib=9000),
        provider="vastai", price_per_hour=0.4,
    )
    text = result.model_dump_json()
    assert '"timestamp":"2026-02-07T10:13:06Z"' in text
    assert BenchmarkResult.model_validate_json(text) == result
    assert result.timestamp.tzinfo is timezone.utc
    with pytest.raises(ValueError):
        result.provider = "other"  # frozen value


# ---------------------------------------------------------------------- nvidia-smi

QUERY = "name,memory.total,memory.used,temperature.gpu,power.draw,utilization.gpu"


def test_parse_gpu_query_csv_values_and_missing():
    text = (
        "NVIDIA GeForce RTX 4090, 24564, 1234, 45, 65.43, 12\n"
        "NVIDIA A100 80GB PCIe, 81920, [N/A], [Not Supported], [N/A], 0\n"
        "\n"
    )
    rows = parse_gpu_query_csv(text, QUERY)
    assert rows == [
        {"name": "NVIDIA GeForce RTX 4090", "memory.total": 24564, "memory.used": 1234,
         "temperature.gpu": 45, "power.draw": 65.43, "utilization.gpu": 12},
        {"name": "NVIDIA A100 80GB PCIe", "memory.total": 81920, "memory.used": None,
         "temperature.gpu": None, "power.draw": None, "utilization.gpu": 0},
    ]


def test_parse_gpu_query_csv_never_crashes_on_odd_lines():
    rows = parse_gpu_query_csv("Tesla T4, 15360 MiB, weird\nonly-name\n",
                               ["name", "memory.total", "memory.used"])
    assert rows[0] == {"name": "Tesla T4", "memory.total": 15360, "memory.used": "weird"}
    assert rows[1] == {"name": "only-name", "memory.total": None, "memory.used": None}
    assert parse_gpu_query_csv("", QUERY) == []


def test_parse_gpu_query_csv_keeps_versions_as_text():
    rows = parse_gpu_query_csv("550.54.15, 12.10\n", ["driver_version", "vbios_version"])
    assert rows == [{"driver_version": "550.54.15", "vbios_version": "12.10"}]


NVIDIA_SMI_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
    <timestamp>Sat Feb  7 10:00:00 2026</timestamp>
    <driver_version>550.54.15</driver_version>
    <cuda_version>12.4</cuda_version>
    <attached_gpus>2</attached_gpus>
    <gpu id="00000000:01:00.0">
        <product_name>NVIDIA GeForce RTX 4090</product_name>
        <uuid>GPU-1111</uuid>
        <fb_memory_usage>
            <total>24564 MiB</total>
            <reserved>346 MiB</reserved>
            <used>2 MiB</used>
            <free>24215 MiB</free>
        </fb_memory_usage>
        <temperature>
            <gpu_temp>34 C</gpu_temp>
        </temperature>
        <gpu_power_readings>
            <power_draw>21.86 W</power_draw>
        </gpu_power_readings>
    </gpu>
    <gpu id="00000000:02:00.0">
        <product_name>NVIDIA GeForce RTX 4090</product_name>
        <uuid>GPU-2222</uuid>
        <fb_memory_usage>
            <total>24564 MiB</total>
            <used>N/A</used>
        </fb_memory_usage>
        <temperature>
            <gpu_temp>N/A</gpu_temp>
        </temperature>
    </gpu>
</nvidia_smi_log>
"""


def test_parse_nvidia_smi_xml():
    info = parse_nvidia_smi_xml(NVIDIA_SMI_XML)
    assert info["driver_version"] == "550.54.15"
    assert info["cuda_version"] == "12.4"
    assert info["attached_gpus"] == 2
    first, second = info["gpus"]
    assert first == {"product_name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-1111",
                     "memory_total_mib": 24564, "memory_used_mib": 2, "temperature_c": 34,
                     "power_draw_w": 21.86}
    assert second["memory_total_mib"] == 24564
    assert second["memory_used_mib"] is None and second["temperature_c"] is None
    assert second["power_draw_w"] is None


def test_parse_nvidia_smi_xml_versions_stay_text_and_bad_xml_raises():
    info = parse_nvidia_smi_xml(
        "<nvidia_smi_log><driver_version>570.10</driver_version>"
        "<cuda_version>12.10</cuda_version></nvidia_smi_log>"
    )
    assert info == {"driver_version": "570.10", "cuda_version": "12.10",
                    "attached_gpus": None, "gpus": []}
    with pytest.raises(ValueError):
        parse_nvidia_smi_xml("NVIDIA-SMI has failed because it couldn't communicate")


# ------------------------------------------------------------------------ GPU names


@pytest.mark.parametrize(
    ("expected", "product"),
    [
        ("RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("RTX4090", "NVIDIA GeForce RTX 4090"),
        ("rtx 4090", "NVIDIA GeForce RTX 4090"),
        ("A100 80GB", "NVIDIA A100 80GB PCIe"),
        ("A100 80GB", "NVIDIA A100-SXM4-80GB"),
        ("A100", "NVIDIA A100-SXM4-40GB"),
        ("H200 NVL", "NVIDIA H200 NVL"),
        ("H100", "NVIDIA H100 80GB HBM3"),
        ("H100 SXM", "NVIDIA H100 80GB HBM3"),
        ("H100 PCIe", "NVIDIA H100 PCIe"),
        ("RTX 5070 Ti", "NVIDIA GeForce RTX 5070 Ti"),
        ("RTX 5060 Ti", "NVIDIA GeForce RTX 5060 Ti"),
        ("RTX 3090", "NVIDIA GeForce RTX 3090"),
        ("RTX A6000", "NVIDIA RTX A6000"),
        ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation"),
        ("V100", "Tesla V100-SXM2-16GB"),
        ("T4", "Tesla T4"),
        ("L40S", "NVIDIA L40S"),
    ],
)
def test_gpu_name_matches(expected, product):
    assert gpu_name_matches(expected, product)


@pytest.mark.parametrize(
    ("expected", "product"),
    [
        ("RTX 4090", "NVIDIA GeForce RTX 4080"),
        ("RTX 5070", "NVIDIA GeForce RTX 5070 Ti"),
        ("RTX 5070 Ti", "NVIDIA GeForce RTX 5070"),
        ("RTX 4090", "NVIDIA GeForce RTX 4090 D"),
        ("RTX 4090", "NVIDIA GeForce RTX 4090 Laptop GPU"),
        ("A100 80GB", "NVIDIA A100-SXM4-40GB"),
        ("A100", "NVIDIA A10"),
        ("A10", "NVIDIA A100-PCIE-40GB"),
        ("L40", "NVIDIA L40S"),
        ("H200", "NVIDIA H200 NVL"),
        ("H100 NVL", "NVIDIA H100 PCIe"),
        ("RTX 6000 Ada", "Quadro RTX 6000"),
        ("", "NVIDIA GeForce RTX 4090"),
        ("RTX 4090", ""),
    ],
)
def test_gpu_name_does_not_match(expected, product):
    assert not gpu_name_matches(expected, product)
