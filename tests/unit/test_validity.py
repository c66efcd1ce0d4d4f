from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.measure.validity import context_truncated, judge, token_count_mismatch

PROMPTS = ["Write a Python function to implement binary search on a sorted list."]  # 70 chars: ~17 tokens


def record(prompt_tokens=15, output=100, eval_count=100, error=None):
    return RequestRecord(index=0, prompt_index=0, started_at=0.0, latency_ms=1000.0, output_tokens=output,
                         eval_count=eval_count, prompt_tokens=prompt_tokens, error=error)


def test_fully_resident_complete_and_consistent_is_valid():
    verdict = judge([record()], PROMPTS, {"size": 4_000, "size_vram": 4_000, "fully_in_gpu": True})
    assert verdict.valid and verdict.reasons == ()
    assert verdict.fully_in_gpu and verdict.context_truncated is False and verdict.token_count_mismatch is False


def test_cpu_offload_is_flagged_with_the_share_on_gpu():
    verdict = judge([record()], PROMPTS, {"size": 20_000, "size_vram": 15_000, "fully_in_gpu": False})
    assert not verdict.valid
    assert verdict.reasons == ("model only 75% in GPU memory (size_vram < size): CPU offload",)


def test_truncation_when_server_counts_far_fewer_prompt_tokens_or_hits_num_ctx():
    assert context_truncated([record(prompt_tokens=5)], PROMPTS) is True
    assert context_truncated([record(prompt_tokens=2048)], PROMPTS) is True
    assert context_truncated([record(prompt_tokens=16)], PROMPTS) is False
    assert context_truncated([record(prompt_tokens=None)], PROMPTS) is None


def test_token_mismatch_tolerates_small_differences():
    assert token_count_mismatch([record(output=98, eval_count=100)]) is False
    assert token_count_mismatch([record(output=90, eval_count=100)]) is True
    assert token_count_mismatch([record(eval_count=None)]) is None
    assert token_count_mismatch([record(output=1, eval_count=100, error="boom")]) is None  # errors don't count


def test_unknown_residency_does_not_invalidate():
    verdict = judge([record()], PROMPTS, None)
    assert verdict.valid and verdict.fully_in_gpu is None
