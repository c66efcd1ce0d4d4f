"""Speculative decoding acceptance from vLLM's /metrics (issue 23 item 4): the counters, the
figures, and the sandbox's vllm stand-in that serves them."""

from __future__ import annotations

import pytest

from pytest_gpubench.figures import FIGURES, FigureSource
from pytest_gpubench.measure import spec_decode
from pytest_gpubench.sandbox.openai_launchers import (
    SPEC_ACCEPTANCE,
    LaunchError,
    expected_accepted,
    metrics_text,
    parse_vllm,
)


def exposition(drafts, draft_tokens, accepted, engines=1, v0=False):
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts counter"]
    for engine in range(engines):
        label = f'{{engine="{engine}",model_name="m"}}'
        if not v0:
            lines.append(f"vllm:spec_decode_num_drafts_total{label} {drafts / engines}")
        lines += [f"vllm:spec_decode_num_draft_tokens_total{label} {draft_tokens / engines}",
                  f"vllm:spec_decode_num_accepted_tokens_total{label} {accepted / engines}",
                  f"vllm:spec_decode_num_accepted_tokens_created{label} 1.7e9",
                  f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{engine}",position="0"}} 99']
    return "\n".join(lines + ["vllm:num_requests_running 0"]) + "\n"


def test_acceptance_is_the_difference_over_the_run_summed_over_engines():
    found = spec_decode.acceptance(exposition(10, 30, 12, engines=2), exposition(110, 330, 222, engines=2))
    assert found == {"acceptance_rate": 0.7, "mean_acceptance_length": 3.1, "drafts": 100.0,
                     "draft_tokens": 300.0, "accepted_tokens": 210.0, "source": "vllm /metrics", "reason": None}


def test_the_v0_names_give_the_rate_without_a_length():
    found = spec_decode.acceptance(exposition(0, 40, 10, v0=True), exposition(0, 140, 60, v0=True))
    assert (found["acceptance_rate"], found["mean_acceptance_length"]) == (0.5, None)


@pytest.mark.parametrize("before, after, reason", [
    (None, None, "exposes no Prometheus /metrics"),
    ("vllm:num_requests_running 0\n", "vllm:num_requests_running 1\n", "no speculative-decoding counters"),
    (exposition(5, 15, 9), exposition(5, 15, 9), "no tokens were drafted"),
    (exposition(50, 150, 90), exposition(5, 15, 9), "went backwards"),
])
def test_no_acceptance_is_none_with_the_reason_never_zero(before, after, reason):
    found = spec_decode.acceptance(before, after, runtime="vllm")
    assert found["acceptance_rate"] is None and found["mean_acceptance_length"] is None
    assert reason in found["reason"]


def test_repeated_runs_add_their_counts_and_the_figures_read_the_details():
    runs = [spec_decode.summary(10, 30, 15), spec_decode.summary(30, 90, 75), None]
    together = spec_decode.combined(runs)
    assert (together["acceptance_rate"], together["mean_acceptance_length"]) == (0.75, 3.25)
    assert spec_decode.combined([None]) is None
    assert spec_decode.combined([spec_decode.absent("why")])["reason"] == "why"
    source = FigureSource(result={}, details={"spec_decode": together})
    assert FIGURES["spec_decode_acceptance_rate"].value(source) == 0.75
    assert FIGURES["spec_decode_mean_acceptance_length"].value(source) == 3.25
    empty = FigureSource(result={}, details={"spec_decode": spec_decode.absent("ollama has none")})
    assert FIGURES["spec_decode_acceptance_rate"].value(empty) is None


def test_the_vllm_standin_counts_what_its_speculative_config_implies():
    launch = parse_vllm(["serve", "qwen2:7b", "--speculative-config",
                         '{"method": "eagle", "model": "d", "num_speculative_tokens": 3}'])
    assert launch.speculative_tokens == 3
    expected = SPEC_ACCEPTANCE + SPEC_ACCEPTANCE ** 2 + SPEC_ACCEPTANCE ** 3
    assert expected_accepted(3) == pytest.approx(expected)
    found = spec_decode.acceptance(metrics_text(launch, 0), metrics_text(launch, 100_000))
    assert found["acceptance_rate"] == pytest.approx(expected / 3, rel=1e-4)
    assert found["mean_acceptance_length"] == pytest.approx(1 + expected, rel=1e-4)
    plain = parse_vllm(["serve", "qwen2:7b"])
    assert plain.speculative_tokens == 0 and spec_decode.parse_counters(metrics_text(plain, 50)) is None


@pytest.mark.parametrize("config", ["{not json", '{"method": "eagle"}', '{"num_speculative_tokens": 0}', "[3]"])
def test_a_bad_speculative_config_stops_the_standin_as_vllm_would(config):
    with pytest.raises(LaunchError, match="speculative"):
        parse_vllm(["serve", "qwen2:7b", "--speculative-config", config])
