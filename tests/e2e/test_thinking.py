"""Reasoning ("thinking") models, issue 9 item 8: the stand-in thinks as Ollama does,
and the load generator counts and times reasoning and answer tokens apart."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from standin_helpers import THINKING_MODEL, THINKING_RATE, THINKING_TTFT_MS, Server, write_instance

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import SEED_PROMPTS, load_cells
from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan
from pytest_gpubench.measure.metrics import detailed_metrics
from pytest_gpubench.measure.validity import judge
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.ollama_common import plan_output

MAX_TOKENS = 256


@pytest.fixture(scope="module")
def ollama(tmp_path_factory):
    server = Server(write_instance(tmp_path_factory.mktemp("thinking")), OLLAMA_NUM_PARALLEL="4")
    server.pull(THINKING_MODEL)
    server.pull("qwen2:7b")
    yield server
    server.stop()


def kind(chunk):
    body = chunk.get("message", chunk)
    text = body.get("content", body.get("response"))
    return "t" if body.get("thinking") else ("a" if text else "-")


# ------------------------------------------------------------------ the stand-in


def test_a_thinking_model_thinks_by_default_then_answers(ollama):
    # A prompt whose reasoning ends within the cap, so that an answer follows.
    prompt = next(p for p in SEED_PROMPTS if plan_output(p, MAX_TOKENS, model=THINKING_MODEL, think=True).answer_tokens)
    sent, chunks = ollama.stream("/api/generate", {"model": THINKING_MODEL, "prompt": prompt,
                                                   "options": {"num_predict": MAX_TOKENS}})
    plan = plan_output(prompt, MAX_TOKENS, model=THINKING_MODEL, think=True)
    *tokens, (_, final) = chunks
    kinds = "".join(kind(c) for _, c in tokens)
    # Ollama's shape: the reasoning in `thinking` beside an empty `response`, then
    # the swallowed closing tag as an empty chunk, then the answer.
    assert kinds == "t" * plan.thinking + "-" + "a" * plan.answer_tokens
    assert tokens[0][1]["response"] == "" and tokens[0][1]["thinking"]
    assert final["done"] is True and final["response"] == "" and "thinking" not in final
    assert final["eval_count"] == len(plan.tokens) == len(tokens)  # counts reasoning and answer


def test_think_false_answers_at_once_and_think_true_needs_the_capability(ollama):
    _, chunks = ollama.stream("/api/generate", {"model": THINKING_MODEL, "prompt": "Hello there", "think": False,
                                                "options": {"num_predict": 32}})
    assert set(kind(c) for _, c in chunks[:-1]) == {"a"}
    assert chunks[-1][1]["eval_count"] == len(chunks) - 1
    refused = ollama.http.post("/api/generate", json={"model": "qwen2:7b", "prompt": "Hi", "think": True})
    assert (refused.status_code, refused.json()) == (400, {"error": '"qwen2:7b" does not support thinking'})
    # think: false on a model without the capability is fine, as on Ollama.
    plain = ollama.http.post("/api/generate", json={"model": "qwen2:7b", "prompt": "Hi", "think": False,
                                                    "stream": False, "options": {"num_predict": 4}})
    assert plain.status_code == 200 and "thinking" not in plain.json()
    bad = ollama.http.post("/api/generate", json={"model": THINKING_MODEL, "prompt": "Hi", "think": "yes"})
    assert bad.status_code == 400 and "invalid think value" in bad.json()["error"]


def test_chat_and_openai_endpoints_carry_the_reasoning_in_their_own_fields(ollama):
    prompt = "Why is the sky blue?"
    plan = plan_output(prompt, 40, model=THINKING_MODEL, think=True)
    whole = ollama.http.post("/api/chat", json={"model": THINKING_MODEL, "stream": False,
                                                "options": {"num_predict": 40},
                                                "messages": [{"role": "user", "content": prompt}]}).json()
    assert whole["message"]["thinking"] == "".join(plan.tokens[:plan.thinking])
    _, chunks = ollama.stream("/api/chat", {"model": THINKING_MODEL, "options": {"num_predict": 40},
                                            "messages": [{"role": "user", "content": prompt}]})
    assert chunks[0][1]["message"] == {"role": "assistant", "content": "", "thinking": plan.tokens[0]}
    response = ollama.http.post("/v1/chat/completions", json={
        "model": THINKING_MODEL, "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": prompt}]})
    deltas = [json.loads(line[6:])["choices"] for line in response.text.splitlines()
              if line.startswith("data: {")]
    reasoning = "".join(c[0]["delta"].get("reasoning", "") for c in deltas if c)
    assert reasoning == "".join(plan.tokens[:plan.thinking])
    # reasoning_effort "none" is Ollama's think: false.
    off = ollama.http.post("/v1/chat/completions", json={
        "model": THINKING_MODEL, "max_tokens": 8, "reasoning_effort": "none",
        "messages": [{"role": "user", "content": prompt}]}).json()
    assert "reasoning" not in off["choices"][0]["message"] and off["choices"][0]["message"]["content"]


def test_the_catalog_marks_deepseek_r1_and_qwen3_as_thinking():
    catalog = load_catalog()
    thinking = {name for name, model in catalog.models.items() if model.thinking}
    assert {"deepseek-r1:14b", "deepseek-r1:32b", "deepseek-r1:70b", "qwen3:8b"} <= thinking
    assert not catalog.models["qwen2:7b"].thinking and not catalog.models["llama3:8b"].thinking


# ------------------------------------------------------------ the load generator


def run_loadgen(url, tmp_path, **extra):
    # Concurrency 1: each stream at the model's full rate, whatever the server's batching model.
    config = BenchmarkPlan(model=THINKING_MODEL, duration=3.0, max_tokens=MAX_TOKENS, prompts=list(SEED_PROMPTS),
                           warmup_requests=0, progress_interval=0.5, checkpoint_every=5,
                           checkpoint_path=str(tmp_path / "checkpoint.json")).config(url)
    config.update(extra)
    done = subprocess.run([sys.executable, "-", json.dumps(config)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["event"] == "finish" and events[-1]["status"] == "completed"
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    return records, events[-1]


def test_loadgen_counts_reasoning_and_times_the_first_token_of_either_kind(ollama, tmp_path):
    records, finish = run_loadgen(ollama.url, tmp_path)
    assert len(records) >= 3 and all(r.ok for r in records), [r.error for r in records]
    interval_ms = 1000 / THINKING_RATE
    for r in records:
        plan = plan_output(SEED_PROMPTS[r.prompt_index], MAX_TOKENS, model=THINKING_MODEL, think=True)
        answered = plan.answer_tokens > 0
        assert r.thinking_tokens == plan.thinking > 0
        # Every token with text is counted; only the swallowed closing tag is not.
        assert r.output_tokens == plan.thinking + plan.answer_tokens == r.eval_count - answered
        # TTFT: the first reasoning token, not the first answer token.
        assert THINKING_TTFT_MS * 0.9 <= r.ttft_ms < THINKING_TTFT_MS + 500
        if answered:
            # The stand-in schedules tokens on absolute times: the answer is due after
            # the TTFT, the reasoning and the tag, and no stall makes it earlier.
            due = THINKING_TTFT_MS + (plan.thinking + 1) * interval_ms
            assert due * 0.95 <= r.ttfat_ms <= r.latency_ms
            assert r.ttfat_ms > r.ttft_ms
        else:
            assert r.ttfat_ms is None and r.done_reason == "length"
    metrics = detailed_metrics(records, finish["duration_seconds"])
    share = sum(r.thinking_tokens for r in records) / sum(r.output_tokens for r in records)
    assert metrics.thinking_token_share == pytest.approx(share)
    assert 0.3 < metrics.thinking_token_share < 1
    assert metrics.thinking_tokens == sum(r.thinking_tokens for r in records)
    assert metrics.ttfat_p50_ms > metrics.ttft_p50_ms
    assert metrics.unanswered_requests == sum(1 for r in records if r.ttfat_ms is None)
    # The token-count check compares the right totals: this is a valid measurement.
    validity = judge(records, list(SEED_PROMPTS), {"fully_in_gpu": True, "size": 1, "size_vram": 1})
    assert validity.valid and validity.token_count_mismatch is False


def test_a_cap_inside_the_reasoning_leaves_requests_without_an_answer(ollama, tmp_path):
    records, finish = run_loadgen(ollama.url, tmp_path, max_tokens=48, duration=0.8, concurrency=4)
    assert records and all(r.ok and r.ttfat_ms is None and r.thinking_tokens == r.output_tokens == 48
                           for r in records)
    metrics = detailed_metrics(records, finish["duration_seconds"])
    assert metrics.unanswered_requests == len(records) and metrics.thinking_token_share == 1.0
    assert metrics.ttfat_p50_ms is None and metrics.ttft_p50_ms is not None


def test_loadgen_think_false_measures_the_answer_alone(ollama, tmp_path):
    records, _ = run_loadgen(ollama.url, tmp_path, think=False, duration=0.8, concurrency=4)
    assert records and all(r.ok for r in records)
    for r in records:
        assert r.thinking_tokens == 0 and r.output_tokens == r.eval_count
        assert r.ttfat_ms == r.ttft_ms


def test_loadgen_think_true_on_a_model_without_it_is_a_clear_per_request_error(ollama, tmp_path):
    records, finish = run_loadgen(ollama.url, tmp_path, model="qwen2:7b", think=True, duration=0.3)
    assert records and finish["status"] == "completed"
    assert all(r.error == 'HTTP 400: "qwen2:7b" does not support thinking' for r in records)


# ------------------------------------------------------------------- the matrix


def matrix(tmp_path, workload, row=""):
    path = tmp_path / "gpubench_think.yaml"
    path.write_text(f"workload: {workload}\nmatrix:\n  - gpu: RTX 4090\n    provider: vastai\n"
                    f"    model: deepseek-r1:14b\n{row}")
    return path


def test_matrix_think_is_true_false_or_absent(tmp_path):
    assert load_cells(matrix(tmp_path, "{duration: 10}"))[0].workload.think is None
    assert load_cells(matrix(tmp_path, "{think: false}"))[0].workload.think is False
    assert load_cells(matrix(tmp_path, "{think: false}", "    workload: {think: true}\n"))[0].workload.think is True
    # A row's `think: null` goes back to the runtime's default.
    assert load_cells(matrix(tmp_path, "{think: true}", "    workload: {think: null}\n"))[0].workload.think is None
    for bad in ('"yes"', "1", "high"):
        with pytest.raises(MatrixError, match=r"workload\.think: must be true or false"):
            load_cells(matrix(tmp_path, f"{{think: {bad}}}"))


def test_the_plan_sends_think_only_when_the_matrix_sets_it(tmp_path):
    plan = BenchmarkPlan(model="m", duration=1, max_tokens=8, prompts=["x"], warmup_requests=0,
                         progress_interval=1, checkpoint_every=1, checkpoint_path="c")
    assert plan.config("u")["think"] is None
    plan.think = False
    assert plan.config("u")["think"] is False
