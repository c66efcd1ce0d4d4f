"""Issue 23 item 4: multi-turn conversations and shared system prompts, as a matrix writes them,
the prefix-reuse figures computed from the records, and the sandbox's prefix cache law."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pytest_gpubench.figures import FIGURES, FigureSource
from pytest_gpubench.matrix.conversations import conversation_spec
from pytest_gpubench.matrix.synthetic import count_tokens
from pytest_gpubench.matrix.workload import ChatPrompt, Prompt, Workload
from pytest_gpubench.measure.metrics import detailed_metrics
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.ollama_common import TOKENS_PER_WORD, OutputPlan
from pytest_gpubench.sandbox.ollama_engine import PREFILL_FLOOR, PREFIX_BLOCK_WORDS, Job, PrefixCache

DOCS = Path(__file__).resolve().parents[2] / "docs"


def workload(prompts, **extra) -> Workload:
    return Workload(prompts=prompts, **extra)


# ------------------------------------------------------------------ conversations


def test_conversations_draw_turns_lengths_and_think_times_the_same_everywhere():
    spec = {"turns": {"uniform": [2, 5]}, "input_tokens": 26, "output_tokens": {"uniform": [8, 12]},
            "think_time": {"uniform": [1, 3]}, "count": 40, "seed": 7}
    made = conversation_spec(spec).conversations()
    assert made == conversation_spec(spec).conversations()  # seeded, not the process's
    assert made != conversation_spec({**spec, "seed": 8}).conversations()
    assert {len(c.turns) for c in made} == {2, 3, 4, 5}
    for conversation in made:
        first, *later = conversation.turns
        assert first.think_s == 0.0 and all(1 <= t.think_s <= 3 for t in later)
        assert all(count_tokens(t.text) == 26 and 8 <= t.max_tokens <= 12 for t in conversation.turns)
    # Fixed think time, written as a duration.
    fixed = conversation_spec({"turns": 3, "input_tokens": 13, "think_time": "2s", "count": 1}).conversations()
    assert [t.think_s for t in fixed[0].turns] == [0.0, 2.0, 2.0] and fixed[0].turns[0].max_tokens is None


def test_a_conversation_is_one_prompt_whose_payload_carries_its_later_turns():
    prompts = workload({"conversations": {"turns": 3, "input_tokens": 13, "output_tokens": 5, "think_time": 1.5,
                                          "count": 2}}).prompts
    assert len(prompts) == 2 and all(isinstance(p, ChatPrompt) for p in prompts)
    entry = prompts[0].payload()
    assert entry["prompt"] == prompts[0].text and entry["max_tokens"] == 5 and "system" not in entry
    assert [(t["think_s"], t["max_tokens"]) for t in entry["turns"]] == [(1.5, 5), (1.5, 5)]
    assert pickle.loads(pickle.dumps(prompts)) == prompts and prompts.source.identity.startswith("conversations")
    assert prompts[0] != Prompt(prompts[0].text, max_tokens=5)  # the turns are part of it


@pytest.mark.parametrize("spec, message", [
    ({"turns": 2}, "`conversations.input_tokens` is required"),
    ({"turns": 2, "input_tokens": 10, "think": 1}, "unknown key 'think'"),
    ({"turns": 0, "input_tokens": 10}, "`conversations.turns` must be a whole number from 1"),
    ({"turns": 2, "input_tokens": 10, "think_time": -1}, "`conversations.think_time` must be seconds"),
    ({"turns": 2, "input_tokens": 10, "think_time": {"uniform": [3, 1]}}, "lo <= hi"),
])
def test_bad_conversations_say_which_field_and_what_is_allowed(spec, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        workload({"conversations": spec})


def test_conversations_are_a_closed_loop_so_a_rate_is_refused():
    with pytest.raises(ValidationError, match="`rate:` does not apply to conversations"):
        workload({"conversations": {"turns": 2, "input_tokens": 10}}, rate=(2.0,))


def test_sharegpt_multi_turn_replays_every_human_turn_with_recorded_answer_lengths(tmp_path):
    talk = [{"from": "human", "value": "first question here"}, {"from": "gpt", "value": "one two three four"},
            {"from": "human", "value": "second"}, {"from": "gpt", "value": "a b"},
            {"from": "human", "value": "third, unanswered"}]
    (tmp_path / "share.json").write_text(json.dumps([{"conversations": talk},
                                                     {"conversations": [{"from": "gpt", "value": "x"}]}]))
    spec = {"dataset": "share.json", "multi_turn": True, "think_time": 2, "output_tokens": "dataset"}
    prompts = Workload.model_validate({"prompts": spec}, context={"base_dir": tmp_path}).prompts
    (only,) = prompts
    assert only.text == "first question here" and only.max_tokens == count_tokens("one two three four")
    assert only.turns == (("second", count_tokens("a b"), 2.0),)  # the unanswered turn has no length: dropped
    assert "1 of 1 conversations" in prompts.source.label
    without = Workload.model_validate({"prompts": {"dataset": "share.json", "multi_turn": True}},
                                      context={"base_dir": tmp_path}).prompts[0]
    assert [t[0] for t in without.turns] == ["second", "third, unanswered"]  # the model's own answers go between
    with pytest.raises(ValidationError, match="`think_time` applies only with `multi_turn: true`"):
        Workload.model_validate({"prompts": {"dataset": "share.json", "think_time": 1}},
                                context={"base_dir": tmp_path})


# ------------------------------------------------------------------ shared prefixes


@pytest.mark.parametrize("share", [0.5, "90%", 0.0])
def test_a_shared_prefix_is_that_share_of_every_prompt_and_byte_identical(share):
    prompts = workload({"synthetic": {"input_tokens": 130, "shared_prefix": share, "count": 6}}).prompts
    fraction = float(share.rstrip("%")) / 100 if isinstance(share, str) else share
    if not fraction:
        assert all(type(p) is Prompt for p in prompts)  # nothing shared: the plain prompts of before
        assert prompts == workload({"synthetic": {"input_tokens": 130, "count": 6}}).prompts
        return
    systems = {p.system for p in prompts}
    assert len(systems) == 1
    (system,) = systems
    for prompt in prompts:
        total = count_tokens(system) + count_tokens(prompt.text)
        assert abs(total - 130) <= 2 and abs(count_tokens(system) / total - fraction) <= 0.02
    assert len({p.text for p in prompts}) == 6  # the rest is unique
    assert prompts[0].payload()["system"] == system


@pytest.mark.parametrize("bad", [1, "100%", -0.1, "half"])
def test_a_shared_prefix_must_leave_a_unique_part(bad):
    with pytest.raises(ValidationError, match=r"`synthetic.shared_prefix` must be .* below 1"):
        workload({"synthetic": {"input_tokens": 100, "shared_prefix": bad}})


def _section(name: str) -> str:
    text = (DOCS / "workloads.md").read_text()
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("section", ["Multi-turn conversations", "Shared prefixes"])
def test_the_docs_examples_collect(section, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sharegpt.json").write_text(json.dumps(
        [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]}]))
    blocks = re.findall(r"```yaml\n(.*?)```", _section(section), re.S)
    assert blocks
    for block in blocks:
        Workload.model_validate(yaml.safe_load(block)["workload"], context={"base_dir": tmp_path})


# ------------------------------------------------------------------ the figures


def record(index, sent=None, cacheable=None, cached=None, error=None) -> RequestRecord:
    return RequestRecord(index=index, prompt_index=0, started_at=0.0, latency_ms=10.0, output_tokens=3,
                         ttft_ms=5.0, error=error, sent_prompt_tokens=sent, cacheable_prompt_tokens=cacheable,
                         cached_prompt_tokens=cached)


def test_prefix_shares_divide_by_the_tokens_sent_over_successful_requests():
    records = [record(0, 100, 0, 0), record(1, 200, 100, 80), record(2, 100, 50, None),
               record(3, 1000, 1000, 1000, error="boom")]
    metrics = detailed_metrics(records, 1.0)
    assert metrics.prefix_cacheable_share == pytest.approx(150 / 400)
    assert metrics.prefix_cached_share == pytest.approx(80 / 300)  # only where the server said
    assert metrics.cached_prompt_tokens == 80
    # A server whose tokenizer counts more than the sent length: never above all of it.
    assert detailed_metrics([record(0, 10, 10, 14)], 1.0).prefix_cached_share == 1.0
    plain = detailed_metrics([record(0)], 1.0)
    assert plain.prefix_cacheable_share is None and plain.prefix_cached_share is None
    # The registry reads them from the stored metrics, as JUnit, CSV and the terminal show them.
    source = FigureSource({}, {"metrics": metrics.model_dump(mode="json")})
    assert FIGURES["prefix_cacheable_share"].read(source) == pytest.approx(150 / 400)
    assert FIGURES["prefix_cached_share"].read(source) == pytest.approx(80 / 300)


# ------------------------------------------------------------------ the sandbox's cache


def job(text: str, context: str = "") -> Job:
    return Job(model="m", prompt=text, prompt_eval_count=max(1, round(len(f"{context} {text}".split())
                                                                       * TOKENS_PER_WORD)),
               num_predict=None, keep_alive=0, arrived=0.0, context=context)


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_the_prefix_cache_serves_whole_leading_blocks_and_shortens_prefill_by_its_law():
    cache, plan = PrefixCache(), OutputPlan(tokens=["answer "] * 3, done_reason="stop")
    system = words(3 * PREFIX_BLOCK_WORDS + 5, "s")
    ttft, first = cache.prefill(job(words(20, "a"), system), plan, 1.0)
    assert (ttft, first.cached_tokens) == (1.0, 0)  # nothing cached yet
    ttft, second = cache.prefill(job(words(20, "b"), system), plan, 1.0)
    cached = round(3 * PREFIX_BLOCK_WORDS * TOKENS_PER_WORD)  # three whole blocks: the partial one is not
    assert second.cached_tokens == cached
    assert ttft == pytest.approx(1 - cached / second.prompt_eval_count)
    # The same block behind another prefix does not match: blocks are chained.
    shifted = "x " + system
    assert cache.prefill(job(words(20, "c"), shifted), plan, 1.0)[1].cached_tokens == 0
    # A prompt seen whole is all cached but one token, and still pays the floor.
    ttft, again = cache.prefill(job(words(20, "a"), system), plan, 1.0)
    assert again.cached_tokens < again.prompt_eval_count and ttft == pytest.approx(
        max(PREFILL_FLOOR, 1 - again.cached_tokens / again.prompt_eval_count))
    # The answer is cached behind its prompt: the next turn's history hits beyond the prompt.
    history = f"{system} {words(20, 'a')} " + "answer " * 3
    turn = job(history + words(PREFIX_BLOCK_WORDS, "u"))
    assert cache.prefill(turn, plan, 1.0)[1].cached_tokens == round(
        (len(history.split()) // PREFIX_BLOCK_WORDS) * PREFIX_BLOCK_WORDS * TOKENS_PER_WORD)


def test_the_prefix_cache_is_bounded_least_recently_used_first():
    cache, plan = PrefixCache(capacity=4), OutputPlan(tokens=[], done_reason="stop")
    old, new = words(2 * PREFIX_BLOCK_WORDS, "o"), words(3 * PREFIX_BLOCK_WORDS, "n")
    cache.prefill(job(old), plan, 1.0)
    cache.prefill(job(new), plan, 1.0)
    assert len(cache.blocks) == 4
    assert cache.cached_words(old.split()) == 0  # its first block went first
    assert cache.cached_words(new.split()) == 3 * PREFIX_BLOCK_WORDS
