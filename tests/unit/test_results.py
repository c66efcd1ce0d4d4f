"""Tests of pytest_gpubench.measure.results: statistics, costs, nvidia-smi parsing, GPU names."""

from __future__ import annotations

import json
import random
import statistics
from datetime import datetime, timezone

import pytest

from pytest_gpubench.measure.results import (
    BenchmarkResult,
    CostAnalysis,
    ModelInfo,
    PerformanceResults,
    TestConfig,
    cost_analysis,
    decode_tokens_per_second,
    percentile,
    summarize,
)
from pytest_gpubench.remote.readings import GPUStats, HardwareInfo, RequestRecord


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


def test_summarize_fills_quality_fields_from_checked_requests():
    records = [
        record(0, matched=True),
        record(1, matched=False),
        record(2, matched=True),
        record(3, matched=None),  # nothing expected of this prompt
        record(4, matched=True, error="timeout"),  # failed prompts are not judged
        record(5, matched=False, warmup=True),
    ]
    r = summarize(records, duration_seconds=10.0)
    assert (r.prompts_with_expected, r.prompts_matching) == (3, 2)
    assert r.match_rate == pytest.approx(2 / 3)
    data = json.loads(r.model_dump_json())
    assert data["prompts_with_expected"] == 3 and data["match_rate"] == pytest.approx(2 / 3)


def test_summarize_without_expectations_leaves_quality_at_zero():
    r = summarize([record(0), record(1, matched=None)], duration_seconds=10.0)
    assert (r.match_rate, r.prompts_with_expected, r.prompts_matching) == (0.0, 0, 0)


# ---------------------------------------------------------------------------- cost


def test_cost_analysis_on_uneven_figures():
    # $1.29/h at 37.5 tok/s: 135,000 tokens an hour
    c = cost_analysis(1.29, 37.5)
    assert c.cost_per_hour == 1.29
    assert c.tokens_per_dollar == pytest.approx(135_000 / 1.29)
    assert c.cost_per_million_tokens == pytest.approx(1.29 / 135_000 * 1e6)  # $9.5556
    assert c.cost_per_million_tokens == pytest.approx(9.5556, abs=1e-4)
    assert c.estimated_monthly_24x7 == pytest.approx(1.29 * 720)  # 30 days of 24 h: $928.80
    # the Go server derives one from the other: cost per million = 1e6 / tokens per dollar
    assert c.tokens_per_dollar * c.cost_per_million_tokens == pytest.approx(1e6)


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


def test_benchmark_result_cost_is_per_delivered_token_not_per_stream():
    # Four streams at 100 tokens/s each for 10 s: the machine delivered 4,000 tokens.
    result = BenchmarkResult(price_per_hour=0.4, results=PerformanceResults(
        avg_tokens_per_second=100.0, total_tokens=4000, duration_seconds=10.0))
    assert result.output_tokens_per_second == 400.0
    assert result.cost_analysis().cost_per_million_tokens == pytest.approx(0.4 / (400 * 3600) * 1e6)
    assert result.per_stream_cost_analysis().cost_per_million_tokens == pytest.approx(1.1111, abs=1e-4)
    assert BenchmarkResult(price_per_hour=0.4).cost_analysis().cost_per_million_tokens is None


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
