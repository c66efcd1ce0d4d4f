"""Tests of pytest_gpubench.measure.metrics on hand-computed samples."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pytest_gpubench.measure.metrics import (
    DetailedMetrics,
    LoadgenSummary,
    Slo,
    detailed_metrics,
    meets_slo,
    request_tpot_ms,
    token_counts_disagree,
)
from pytest_gpubench.measure.results import quality, summarize
from pytest_gpubench.remote.readings import RequestRecord


def record(index: int = 0, **fields) -> RequestRecord:
    base = dict(index=index, prompt_index=0, started_at=1_770_000_000.0 + index,
                ttft_ms=100.0, latency_ms=1000.0, output_tokens=10)
    base.update(fields)
    return RequestRecord(**base)


TEN = [float(v) for v in range(100, 1001, 100)]  # 100 .. 1000


# --------------------------------------------------------- latency distributions


def test_ttft_and_e2e_percentiles_on_known_values():
    records = [record(i, ttft_ms=t, latency_ms=t * 10) for i, t in enumerate(TEN)]
    m = detailed_metrics(records, 60.0)
    assert m.ttft_avg_ms == pytest.approx(550.0)
    assert m.ttft_p50_ms == pytest.approx(550.0)
    assert m.ttft_p90_ms == pytest.approx(910.0)
    assert m.ttft_p95_ms == pytest.approx(955.0)
    assert m.ttft_p99_ms == pytest.approx(991.0)
    assert m.e2e_avg_ms == pytest.approx(5500.0)
    assert m.e2e_p50_ms == pytest.approx(5500.0)
    assert m.e2e_p95_ms == pytest.approx(9550.0)
    assert m.e2e_p99_ms == pytest.approx(9910.0)


def test_warmups_and_errors_stay_out_of_latency_figures():
    records = [
        record(0, warmup=True, ttft_ms=9999.0, latency_ms=99999.0),
        record(1, ttft_ms=100.0, latency_ms=1000.0),
        record(2, error="boom", ttft_ms=5000.0, latency_ms=50000.0),
    ]
    m = detailed_metrics(records, 10.0)
    assert (m.requests, m.successful, m.errors) == (2, 1, 1)
    assert m.error_rate == pytest.approx(0.5)
    assert m.ttft_avg_ms == 100.0 and m.e2e_p99_ms == 1000.0


def test_incomplete_requests_count_for_what_they_streamed_not_for_latency():
    # Cut at the deadline: 300 ms TTFT, 21 tokens in 2 s; no end, no server counters.
    cut = record(2, incomplete=True, ttft_ms=300.0, latency_ms=2300.0, output_tokens=21, tokens_per_second=10.0,
                 tpot_ms=100.0)
    records = [record(0, eval_count=10, tokens_per_second=20.0, tpot_ms=50.0),
               record(1, eval_count=10, tokens_per_second=30.0, tpot_ms=40.0), cut]
    m = detailed_metrics(records, 10.0, slo=Slo(ttft_ms=1000))
    assert (m.requests, m.successful, m.errors, m.incomplete) == (3, 2, 0, 1)
    assert m.error_rate == 0.0
    assert m.ttft_p99_ms == pytest.approx(100 + 0.98 * 200)  # the cut request's 300 ms is in
    assert m.e2e_p99_ms == 1000.0  # its 2,300 ms are not a request's latency
    assert m.tpot_avg_ms == pytest.approx((50 + 40 + 100) / 3)
    assert m.decode_tps_client_avg == pytest.approx(20.0)
    assert m.output_throughput_tps == pytest.approx((10 + 10 + 21) / 10.0)
    assert m.request_throughput_rps == pytest.approx(0.2)
    assert m.good_requests == 2  # it met the TTFT bound, but never completed
    results = summarize(records, 10.0)
    assert (results.total_requests, results.total_errors, results.total_tokens) == (3, 0, 41)
    assert results.avg_tokens_per_second == pytest.approx(20.0)
    assert results.max_latency_ms == 1000.0 and results.avg_tokens_per_request == 10.0
    assert results.requests_per_minute == pytest.approx(12.0)
    assert results.avg_ttft_ms == pytest.approx(500 / 3)


def test_no_successes_give_none_not_zero():
    m = detailed_metrics([record(0, error="x")], 10.0)
    assert m.ttft_avg_ms is None and m.e2e_p50_ms is None and m.tpot_avg_ms is None
    assert m.itl_source is None and m.itl_mean_ms is None
    assert m.decode_tps_client_avg is None and m.decode_tps_server_avg is None
    assert m.output_throughput_tps == 0.0 and m.request_throughput_rps == 0.0
    empty = detailed_metrics([], 0.0)
    assert empty == DetailedMetrics()


# ---------------------------------------------------------------------- TPOT


def test_tpot_per_request():
    # (1000 - 100) / (10 - 1) = 100 ms
    assert request_tpot_ms(record()) == pytest.approx(100.0)
    assert request_tpot_ms(record(tpot_ms=42.0)) == 42.0  # the generator's own figure wins
    assert request_tpot_ms(record(output_tokens=1)) is None
    assert request_tpot_ms(record(ttft_ms=None)) is None


def test_tpot_statistics_skip_requests_without_a_decode_phase():
    records = [record(i, tpot_ms=t) for i, t in enumerate([10.0, 20.0, 30.0, 40.0])]
    records.append(record(9, output_tokens=1, latency_ms=100.0))
    m = detailed_metrics(records, 10.0)
    assert m.tpot_avg_ms == pytest.approx(25.0)
    assert m.tpot_p50_ms == pytest.approx(25.0)
    assert m.tpot_p95_ms == pytest.approx(38.5)
    assert m.tpot_p99_ms == pytest.approx(39.7)


# ----------------------------------------------------------------------- ITL


def test_itl_prefers_the_load_generators_run_level_summary():
    records = [record(i, itl_mean_ms=50.0, itl_max_ms=80.0) for i in range(3)]
    loadgen = {"event": "finish", "status": "completed", "duration_seconds": 10.0,
               "itl_ms": {"count": 27, "mean": 48.0, "p50": 45.0, "p90": 60.0, "p95": 66.0,
                          "p99": 90.0, "max": 120.0},
               "some_future_field": True}
    m = detailed_metrics(records, 10.0, loadgen=loadgen)
    assert m.itl_source == "loadgen"
    assert (m.itl_mean_ms, m.itl_p50_ms, m.itl_p90_ms, m.itl_p95_ms, m.itl_p99_ms, m.itl_max_ms) == (
        48.0, 45.0, 60.0, 66.0, 90.0, 120.0)


@pytest.mark.parametrize(
    "loadgen",
    [None, {}, {"itl_ms": None}, {"itl_ms": {"count": 0, "mean": None}}],
    ids=["no-event", "no-itl", "null-itl", "zero-count"],
)
def test_itl_falls_back_to_per_request_means(loadgen):
    records = [record(i, itl_mean_ms=v, itl_max_ms=v * 2) for i, v in enumerate([10.0, 20.0, 30.0, 40.0])]
    records.append(record(9, itl_mean_ms=None))  # one token: no gaps
    m = detailed_metrics(records, 10.0, loadgen=loadgen)
    assert m.itl_source == "per_request_means"
    assert m.itl_mean_ms == pytest.approx(25.0)
    assert m.itl_p50_ms == pytest.approx(25.0)
    assert m.itl_p90_ms == pytest.approx(37.0)
    assert m.itl_max_ms == 80.0


def test_itl_absent_everywhere_is_none():
    m = detailed_metrics([record()], 10.0, loadgen={"itl_ms": {"count": 0}})
    assert m.itl_source is None and m.itl_mean_ms is None and m.itl_max_ms is None


# ----------------------------------------------------------------- throughput


def test_throughput_over_the_whole_run_and_decode_rates():
    records = [
        # server counted 12, client 10: the server's count is the output token count
        record(0, output_tokens=10, eval_count=12, eval_duration_ns=200_000_000, tokens_per_second=40.0),
        record(1, output_tokens=20, eval_count=20, eval_duration_ns=400_000_000, tokens_per_second=60.0,
               server_tokens_per_second=55.0),
        record(2, output_tokens=8, tokens_per_second=None),
        record(3, error="x", output_tokens=30, eval_count=30),
    ]
    m = detailed_metrics(records, 4.0)
    assert m.output_throughput_tps == pytest.approx((12 + 20 + 8) / 4.0)
    assert m.request_throughput_rps == pytest.approx(3 / 4.0)
    assert m.decode_tps_client_avg == pytest.approx(50.0)
    # 12 / 0.2 s = 60 tok/s, and the generator's own 55 for the second
    assert m.decode_tps_server_avg == pytest.approx(57.5)
    assert m.output_tokens_client == 38 and m.output_tokens_server == 32
    assert m.server_counted_requests == 2
    assert detailed_metrics(records, 0.0).output_throughput_tps is None


def test_prompt_tokens():
    records = [record(0, prompt_tokens=30), record(1, prompt_tokens=50), record(2)]
    m = detailed_metrics(records, 1.0)
    assert m.prompt_tokens == 80 and m.prompt_tokens_avg == pytest.approx(40.0)
    assert detailed_metrics([record()], 1.0).prompt_tokens is None


# ------------------------------------------------------------ token mismatch


@pytest.mark.parametrize(
    "client, server, disagree",
    [(105, 100, False), (106, 100, True), (94, 100, True), (95, 100, False),
     (12, 10, False), (13, 10, True), (7, 10, True), (8, 10, False)],
)
def test_token_counts_disagree_at_both_sides_of_the_allowance(client, server, disagree):
    # allowance is max(2, 5% of the server count): 5 for 100 tokens, 2 for 10
    assert token_counts_disagree(client, server) is disagree


def test_mismatch_flag_counts_successful_requests_only():
    records = [
        record(0, output_tokens=100, eval_count=100),
        record(1, output_tokens=80, eval_count=100),
        record(2, output_tokens=10, eval_count=20),
        record(3, output_tokens=1, eval_count=50, error="cut"),
        record(4, warmup=True, output_tokens=1, eval_count=50),
    ]
    m = detailed_metrics(records, 1.0)
    assert m.token_count_mismatch is True and m.token_count_mismatches == 2
    clean = detailed_metrics([record(0, output_tokens=100, eval_count=101)], 1.0)
    assert clean.token_count_mismatch is False and clean.token_count_mismatches == 0
    assert detailed_metrics([record()], 1.0).token_count_mismatch is None


# -------------------------------------------------------------------- goodput


@pytest.mark.parametrize(
    "slo, fields, good",
    [
        (Slo(ttft_ms=200), dict(ttft_ms=200.0), True),
        (Slo(ttft_ms=200), dict(ttft_ms=200.01), False),
        (Slo(ttft_ms=200), dict(ttft_ms=None), False),
        (Slo(tpot_ms=50), dict(tpot_ms=50.0), True),
        (Slo(tpot_ms=50), dict(tpot_ms=50.5), False),
        (Slo(tpot_ms=50), dict(tpot_ms=None, output_tokens=1), True),  # no decode phase: TPOT 0
        (Slo(tpot_ms=50), dict(tpot_ms=None, ttft_ms=None), False),
        (Slo(e2e_ms=1000), dict(latency_ms=1000.0), True),
        (Slo(e2e_ms=1000), dict(latency_ms=1000.1), False),
        (Slo(ttft_ms=200, e2e_ms=1000), dict(ttft_ms=150.0, latency_ms=1001.0), False),
        (Slo(ttft_ms=200, e2e_ms=1000), dict(ttft_ms=150.0, latency_ms=999.0), True),
        (Slo(ttft_ms=200), dict(ttft_ms=10.0, error="timeout"), False),
    ],
)
def test_slo_bounds_are_inclusive_and_all_must_hold(slo, fields, good):
    assert meets_slo(record(**fields), slo) is good


def test_goodput_counts_share_and_rate():
    records = [
        record(0, ttft_ms=100.0, latency_ms=900.0),  # good
        record(1, ttft_ms=300.0, latency_ms=900.0),  # TTFT too slow
        record(2, ttft_ms=100.0, latency_ms=1500.0),  # too long overall
        record(3, ttft_ms=200.0, latency_ms=1000.0),  # good, on both bounds
        record(4, error="reset"),  # errors count against the share
        record(5, warmup=True, ttft_ms=1.0, latency_ms=2.0),  # not measured
    ]
    m = detailed_metrics(records, 20.0, slo=Slo(ttft_ms=200, e2e_ms=1000))
    assert m.good_requests == 2
    assert m.goodput_share == pytest.approx(2 / 5)
    assert m.goodput_rps == pytest.approx(2 / 20.0)
    assert m.slo == Slo(ttft_ms=200, e2e_ms=1000)


@pytest.mark.parametrize("slo", [None, Slo()])
def test_no_slo_means_no_goodput(slo):
    m = detailed_metrics([record()], 1.0, slo=slo)
    assert m.good_requests is None and m.goodput_share is None and m.goodput_rps is None and m.slo is None


def test_slo_validation():
    with pytest.raises(ValidationError):
        Slo(ttft_ms=0)
    with pytest.raises(ValidationError):
        Slo(ttft=200)  # a typo must not silently disable the bound
    assert Slo.model_validate({"tpot_ms": 50}).is_set


# -------------------------------------------------------------------- quality


def test_quality_counts_checked_successful_measured_requests():
    records = [
        record(0, matched=True),
        record(1, matched=False),
        record(2, matched=True),
        record(3, matched=None),  # the prompt expected nothing
        record(4, matched=False, error="timeout"),  # failed prompts are not judged
        record(5, matched=False, warmup=True),
    ]
    rate, with_expected, matching = quality(records)
    assert (with_expected, matching) == (3, 2)
    assert rate == pytest.approx(2 / 3)
    assert quality([record(), record(1, matched=None)]) == (0.0, 0, 0)


# ------------------------------------------------------------ load generator


def test_cpu_cost_per_thousand_tokens():
    records = [record(0, output_tokens=500, warmup=True), record(1, output_tokens=1500)]
    m = detailed_metrics(records, 10.0, loadgen={"cpu_seconds": 4.0})
    assert m.cpu_seconds == 4.0
    assert m.cpu_seconds_per_1k_tokens == pytest.approx(2.0)  # 4 s over 2,000 received tokens
    given = detailed_metrics(records, 10.0, loadgen={"cpu_seconds": 4.0, "cpu_seconds_per_1k_tokens": 1.5})
    assert given.cpu_seconds_per_1k_tokens == 1.5
    assert detailed_metrics(records, 10.0).cpu_seconds_per_1k_tokens is None


def test_send_lag_from_records_and_from_summary():
    lags = [record(i, send_lag_ms=v) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 100.0])]
    m = detailed_metrics(lags, 10.0, loadgen={"send_lag_ms": {"p50": 9.0, "p99": 9.0, "max": 9.0}})
    assert m.send_lag_p50_ms == 3.0 and m.send_lag_max_ms == 100.0
    assert m.send_lag_p99_ms == pytest.approx(96.16)
    from_summary = detailed_metrics([record()], 10.0, loadgen={"send_lag_ms": {"p50": 1.0, "p99": 5.0, "max": 7.0}})
    assert (from_summary.send_lag_p50_ms, from_summary.send_lag_p99_ms, from_summary.send_lag_max_ms) == (
        1.0, 5.0, 7.0)


def test_client_saturated_by_send_lag():
    # mean latency 1000 ms: the bar is a send-lag p99 of 100 ms
    under = [record(i, send_lag_ms=100.0) for i in range(4)]
    m = detailed_metrics(under, 10.0)
    assert m.client_saturated is False and m.saturation_reasons == ()
    over = [record(i, send_lag_ms=101.0) for i in range(4)]
    m = detailed_metrics(over, 10.0)
    assert m.client_saturated is True
    assert "send-lag p99" in m.saturation_reasons[0]


def test_client_saturated_by_delivered_concurrency():
    m = detailed_metrics([record()], 10.0, loadgen={"delivered_concurrency": 7.6}, concurrency=8)
    assert m.client_saturated is False  # 7.6 is exactly 95% of 8
    m = detailed_metrics([record()], 10.0, loadgen={"delivered_concurrency": 7.59}, concurrency=8)
    assert m.client_saturated is True and "delivered concurrency" in m.saturation_reasons[0]
    from_event = detailed_metrics([record()], 10.0,
                                  loadgen={"delivered_concurrency": 3.0, "configured_concurrency": 8})
    assert from_event.client_saturated is True and from_event.configured_concurrency == 8


def test_delivered_concurrency_by_littles_law_when_the_event_says_nothing():
    # four requests of 5 s each in a 10 s window: two in flight on average
    records = [record(i, latency_ms=5000.0) for i in range(4)]
    m = detailed_metrics(records, 10.0, concurrency=2)
    assert m.delivered_concurrency == pytest.approx(2.0)
    assert m.client_saturated is False
    assert detailed_metrics(records, 10.0, concurrency=4).client_saturated is True


def test_saturation_unknown_without_evidence():
    assert detailed_metrics([record()], 10.0).client_saturated is None


def test_loadgen_summary_model_is_accepted_as_is():
    summary = LoadgenSummary.model_validate({"itl_ms": {"count": 3, "mean": 20.0, "p50": 20.0}})
    m = detailed_metrics([record()], 1.0, loadgen=summary)
    assert m.itl_source == "loadgen" and m.itl_mean_ms == 20.0


def test_detailed_metrics_is_a_frozen_json_value():
    m = detailed_metrics([record(send_lag_ms=1.0)], 1.0, slo=Slo(e2e_ms=2000))
    assert DetailedMetrics.model_validate_json(m.model_dump_json()) == m
    with pytest.raises(ValidationError):
        m.errors = 3
