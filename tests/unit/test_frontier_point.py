"""A frontier point (issue 23 item 1): throughput per GPU, the three interactivities, billed cost."""

from __future__ import annotations

import pytest

from pytest_gpubench.measure.frontier import FrontierPoint, frontier_point, ntpot_interactivity
from pytest_gpubench.measure.metrics import Energy
from pytest_gpubench.remote.readings import RequestRecord


def streamed(index: int, *, ttft_ms: float, tpot_ms: float, tokens: int, warmup: bool = False) -> RequestRecord:
    latency = ttft_ms + tpot_ms * (tokens - 1)
    return RequestRecord(index=index, prompt_index=0, started_at=float(index), ttft_ms=ttft_ms, latency_ms=latency,
                         output_tokens=tokens, tpot_ms=tpot_ms, warmup=warmup)


def test_a_point_holds_all_three_interactivities_and_the_billed_cost() -> None:
    # Four requests of 101 tokens: TPOT 20 ms (50 tok/s per user once streaming), TTFT 500 ms.
    records = [streamed(i, ttft_ms=500.0, tpot_ms=20.0, tokens=101) for i in range(4)]
    records.append(streamed(9, ttft_ms=1.0, tpot_ms=1.0, tokens=101, warmup=True))  # never counted
    point = frontier_point(records, 10.0, concurrency=4, gpus=2, price_per_hour=3.6, batch_limit=4,
                           energy=Energy(joules_per_output_token=0.5, output_tokens_per_second_per_watt=2.0))
    assert point.output_tokens_per_second == pytest.approx(40.4)  # 404 tokens in 10 s
    assert point.output_tokens_per_second_per_gpu == pytest.approx(20.2)
    assert point.tpot_interactivity == pytest.approx(50.0)
    assert point.per_user_throughput == pytest.approx(10.1)
    # Each request: 2,500 ms for 101 tokens -> 24.75 ms per token -> 40.4 tokens/s.
    assert point.ntpot_interactivity == pytest.approx(1000 / (2500 / 101))
    assert point.interactivity() == point.tpot_interactivity
    assert point.cost_per_million_tokens == pytest.approx(3.6 / (40.4 * 3600) * 1e6)
    assert (point.batch_limit, point.joules_per_output_token, point.requests) == (4, 0.5, 4)


def test_a_rate_point_has_no_per_user_throughput_and_nothing_measured_is_none_not_zero() -> None:
    point = frontier_point([], 5.0, rate=2.0)
    assert point.per_user_throughput is None
    assert point.tpot_interactivity is None and point.ntpot_interactivity is None
    assert point.cost_per_million_tokens is None
    with pytest.raises(ValueError, match="unknown interactivity"):
        FrontierPoint().interactivity("speed")


def test_ntpot_is_the_90th_percentile_of_time_per_output_token_inverted() -> None:
    fast = [streamed(i, ttft_ms=100.0, tpot_ms=10.0, tokens=11) for i in range(9)]  # 200 ms / 11 tokens
    slow = [streamed(9, ttft_ms=1100.0, tpot_ms=10.0, tokens=11)]  # 1,200 ms / 11 tokens
    # p90 of nine 18.18 and one 109.09 interpolates at rank 8.1: 18.18 + 0.1 * 90.9 = 27.27 ms/token.
    assert ntpot_interactivity(fast + slow) == pytest.approx(1000 / (200 / 11 + 0.1 * 1000 / 11))
