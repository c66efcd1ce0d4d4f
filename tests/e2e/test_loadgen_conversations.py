"""Issue 23 items 4 and 7: the load generator's conversations and shared prefixes against a real
Ollama stand-in (its /api/chat, /api/generate and /v1/chat/completions), proved by the server's
own request log: turn k carries turns 1..k-1 with the model's own answers verbatim after the
think time, a shared system prompt is byte-identical on every request, and the stand-in's
prefix cache serves what was sent before, by its documented law."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest
from standin_helpers import TTFT_MS, Server, write_instance

from pytest_gpubench.matrix.synthetic import count_tokens
from pytest_gpubench.matrix.workload import Workload
from pytest_gpubench.measure.benchmark import LOADGEN_BOOTSTRAP, BenchmarkPlan, loadgen_input
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.ollama_common import Thought, plan_output
from pytest_gpubench.sandbox.ollama_engine import PREFILL_FLOOR
from pytest_gpubench.sandbox.standin_state import read_requests

MODEL = "qwen2:7b"
THINK_S = 0.15


@pytest.fixture(scope="module")
def ollama(tmp_path_factory):
    server = Server(write_instance(tmp_path_factory.mktemp("conversations")), OLLAMA_NUM_PARALLEL="4")
    server.pull(MODEL)
    yield server
    server.stop()


def run(server, tmp_path, prompts, protocol, **extra):
    """One load-generator run as the plugin starts it; its measured records, and the server's log
    of the requests this run sent."""
    before = len(read_requests(server.instance.parent / "state"))
    config = BenchmarkPlan(model=MODEL, duration=1.5, max_tokens=12, prompts=prompts, warmup_requests=1,
                           progress_interval=5, checkpoint_every=50, checkpoint_path=str(tmp_path / "ck.json"),
                           concurrency=2, protocol=protocol).config(server.url)
    config.update(extra)
    done = subprocess.run([sys.executable, "-c", LOADGEN_BOOTSTRAP], input=loadgen_input(config), text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["event"] == "finish" and events[-1]["status"] == "completed", events[-1]
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert all(r.error is None for r in records), [r.error for r in records]
    return [r for r in records if not r.warmup], read_requests(server.instance.parent / "state")[before:]


def answer_to(messages, max_tokens):
    """What the stand-in answers to these messages (its answers are decided by the prompt)."""
    plan = plan_output("\n".join(m["content"] for m in messages), max_tokens, model=MODEL)
    return "".join(t for t in plan.tokens if not isinstance(t, Thought))


@pytest.mark.parametrize("protocol, route", [("ollama", "/api/chat"), ("openai-chat", "/v1/chat/completions")])
def test_each_turn_carries_the_history_with_the_models_own_answers_after_the_think_time(
        ollama, tmp_path, protocol, route):
    spec = {"turns": 3, "input_tokens": 26, "output_tokens": 12, "think_time": THINK_S, "count": 40,
            "seed": len(protocol)}  # prompts of their own: the other run's cache does not serve these
    prompts = Workload(prompts={"conversations": spec}).prompt_payload()
    records, log = run(ollama, tmp_path, prompts, protocol)
    assert {e["route"] for e in log} == {route}  # Ollama's /api/generate takes no history: /api/chat

    by_first = defaultdict(list)  # the server's view: requests by their conversation's first message
    for entry in log[1:]:  # the warm-up first
        by_first[entry["messages"][0]["content"]].append(entry)
    finished = 0
    for entries in by_first.values():
        entries.sort(key=lambda e: e["received_at"])
        written = next(p for p in prompts if p["prompt"] == entries[0]["messages"][0]["content"])
        users = [written["prompt"]] + [t["prompt"] for t in written["turns"]]
        assert len(entries) <= 3
        for k, entry in enumerate(entries):
            messages = entry["messages"]
            assert [m["content"] for m in messages if m["role"] == "user"] == users[:k + 1]
            if k:
                before = entries[k - 1]
                # Turn k: turn k-1's messages, the model's own answer to them verbatim, the new turn.
                assert messages[:-2] == before["messages"]
                assert messages[-2] == {"role": "assistant", "content": answer_to(before["messages"], 12)}
                assert entry["received_at"] - before["received_at"] >= THINK_S
        finished += len(entries) == 3
    assert finished >= 2

    # The records: conversation and turn, what a cache could serve, what the stand-in's did.
    turns = defaultdict(list)
    for r in records:
        turns[r.conversation].append(r.turn)
    assert all(sorted(t) == list(range(1, len(t) + 1)) for t in turns.values()) and len(turns) >= 2
    for r in records:
        assert r.sent_prompt_tokens > 0
        if r.turn == 1:
            assert r.cacheable_prompt_tokens == 0 or r.conversation == 0  # the warm-up sent conversation 0's
            continue
        assert 0 < r.cached_prompt_tokens <= r.cacheable_prompt_tokens < r.sent_prompt_tokens
        if protocol == "ollama":
            # Ollama counts only what it evaluated, and its prefill is the uncached share (the law).
            total = r.prompt_tokens + r.cached_prompt_tokens
            assert total == r.sent_prompt_tokens
            share = max(PREFILL_FLOOR, 1 - r.cached_prompt_tokens / total)
            assert r.prompt_eval_duration_ns == pytest.approx(TTFT_MS * 1e6 * share, rel=0.01)
        else:
            assert r.prompt_tokens == r.sent_prompt_tokens  # OpenAI's usage counts the whole prompt


@pytest.mark.parametrize("protocol", ["ollama", "openai-chat"])
def test_a_shared_system_prompt_is_byte_identical_at_its_share_and_served_from_the_cache(
        ollama, tmp_path, protocol):
    spec = {"input_tokens": 130, "output_tokens": 4, "shared_prefix": "50%", "count": 400, "seed": len(protocol)}
    prompts = Workload(prompts={"synthetic": spec}).prompt_payload()
    records, log = run(ollama, tmp_path, prompts, protocol)
    if protocol == "ollama":
        systems = [e["system"] for e in log]
        uniques = [e["prompt"] for e in log]
    else:
        assert all([m["role"] for m in e["messages"]] == ["system", "user"] for e in log)
        systems = [e["messages"][0]["content"] for e in log]
        uniques = [e["messages"][1]["content"] for e in log]
    assert len(log) >= 4 and len(set(systems)) == 1 and systems[0] == prompts[0]["system"]
    assert len(set(uniques)) == len(uniques)  # the rest is each request's own
    for entry, system in zip(log, systems, strict=True):
        assert count_tokens(system) / entry["prompt_tokens"] == pytest.approx(0.5, abs=0.02)
    shared = count_tokens(systems[0])
    for r in records:  # the warm-up sent it first: every measured request could be served it
        assert r.cacheable_prompt_tokens == shared
        assert 0 < r.cached_prompt_tokens <= shared  # the stand-in caches whole blocks of 16 words


def test_without_a_shared_prefix_nothing_is_cacheable_or_cached(ollama, tmp_path):
    prompts = Workload(prompts={"synthetic": {"input_tokens": 130, "output_tokens": 4, "count": 400,
                                              "seed": 99}}).prompt_payload()
    records, log = run(ollama, tmp_path, prompts, "openai-chat", warmup_requests=0)
    assert records and all("system" not in e and len(e["messages"]) == 1 for e in log)
    assert all(r.cacheable_prompt_tokens == 0 and r.cached_prompt_tokens == 0 for r in records)
