"""Issue 11 item 4: prompts from datasets and synthetic length distributions, per-request output lengths."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.adjust import with_workload
from pytest_gpubench.matrix.cells import load_cells, load_matrix
from pytest_gpubench.matrix.synthetic import count_tokens, distribution, synthetic_spec, text_of_length
from pytest_gpubench.matrix.workload import Prompt, Workload
from pytest_gpubench.measure.compare import fingerprint, incomparable
from pytest_gpubench.sandbox.ollama_common import count_prompt_tokens

ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Why is the sky blue?"},
                                  {"from": "gpt", "value": " ".join(["word"] * 100)}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "no human turn here"}]},
    {"id": "c", "conversations": [{"from": "system", "value": "be brief"},
                                  {"from": "human", "value": "Name a prime."},
                                  {"from": "gpt", "value": "Seven."}]},
    {"id": "d", "conversations": []},
]


def matrix_with(tmp_path, prompts: str, extra: str = ""):
    path = tmp_path / "gpubench_w.yaml"
    path.write_text(f"workload:\n  prompts: {prompts}\n{extra}{ROW}")
    return path


def workload_of(tmp_path, prompts: str, extra: str = "") -> Workload:
    return load_matrix(matrix_with(tmp_path, prompts, extra)).workload


def error_of(tmp_path, prompts: str) -> str:
    with pytest.raises(MatrixError) as info:
        load_matrix(matrix_with(tmp_path, prompts))
    return str(info.value)


# ------------------------------------------------------------------------ datasets


def test_jsonl_prompts_relative_to_the_matrix_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "p.jsonl").write_text('{"prompt": "one"}\n\n{"prompt": "two", "x": 1}\n')
    workload = workload_of(tmp_path, "{dataset: data/p.jsonl}")
    assert list(workload.prompts) == ["one", "two"]
    assert workload.prompt_payload() == ["one", "two"]  # entries as today: plain texts
    assert workload.prompts_label == "dataset p.jsonl (2 of 2 prompts, in file order)"


def test_jsonl_with_a_named_field_and_output_lengths(tmp_path):
    lines = [{"q": "first", "answer": "a b c d e f g h i j"}, {"q": "second", "answer": 7}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    workload = workload_of(tmp_path, "{dataset: p.jsonl, field: q, output_field: answer, output_tokens: dataset}")
    assert workload.prompt_payload() == [{"prompt": "first", "max_tokens": 13}, {"prompt": "second", "max_tokens": 7}]


def test_sharegpt_first_human_turn_and_gpt_length(tmp_path):
    (tmp_path / "share.json").write_text(json.dumps(SHAREGPT, indent=2))
    plain = workload_of(tmp_path, "{dataset: share.json}")
    assert list(plain.prompts) == ["Why is the sky blue?", "Name a prime."]  # no human turn: skipped
    lengths = workload_of(tmp_path, "{dataset: share.json, output_tokens: dataset}")
    assert lengths.prompt_payload() == [{"prompt": "Why is the sky blue?", "max_tokens": 130},
                                        {"prompt": "Name a prime.", "max_tokens": 1}]
    # ShareGPT as JSONL reads the same.
    (tmp_path / "share.jsonl").write_text("\n".join(json.dumps(r) for r in SHAREGPT))
    assert list(workload_of(tmp_path, "{dataset: share.jsonl}").prompts) == list(plain.prompts)


def test_limit_shuffle_and_seed_are_deterministic(tmp_path):
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"prompt": f"p{i}"}) for i in range(50)))
    in_order = workload_of(tmp_path, "{dataset: p.jsonl, limit: 5}")
    assert list(in_order.prompts) == [f"p{i}" for i in range(5)]
    first = workload_of(tmp_path, "{dataset: p.jsonl, limit: 10, seed: 3}")
    again = workload_of(tmp_path, "{dataset: p.jsonl, limit: 10, shuffle: true, seed: 3}")
    other = workload_of(tmp_path, "{dataset: p.jsonl, limit: 10, seed: 4}")
    assert list(first.prompts) == list(again.prompts) != list(other.prompts)
    assert len(set(first.prompts)) == 10 and list(first.prompts) != list(in_order.prompts)[:10]
    assert "10 of 50 prompts, shuffled seed 3" in first.prompts_label


@pytest.mark.parametrize(("content", "spec", "expected"), [
    (None, "{dataset: nowhere.jsonl}", "nowhere.jsonl: cannot read it"),
    ('{"prompt": "ok"}\n{"prompt": "broken"\n', "{dataset: d.jsonl}", "d.jsonl line 2: invalid JSON"),
    ('{"prompt": "ok"}\n{"text": "no prompt"}\n', "{dataset: d.jsonl}",
     "d.jsonl line 2: field `prompt` is missing (the record's keys: text)"),
    ('{"q": ""}\n', "{dataset: d.jsonl, field: q}", "d.jsonl line 1: field `q` must be non-empty text"),
    ('\n\n', "{dataset: d.jsonl}", "d.jsonl: no prompts in it"),
    ('[\n {"prompt": "a"},\n {"prompt": "b",}\n]', "{dataset: d.jsonl}", "d.jsonl line 3: invalid JSON"),
    ('[\n {"conversations": "nope"}\n]', "{dataset: d.jsonl}",
     "d.jsonl line 2: field `conversations` must be a list of turns"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "{dataset: d.jsonl}",
     "no prompts in it (1 conversation had no usable turns)"),
    ('["just text"]', "{dataset: d.jsonl}", "d.jsonl line 1: a record must be a JSON object"),
    ('{"prompt": "a"}\n', "{dataset: d.jsonl, output_tokens: dataset}", "needs `output_field:`"),
    ('{"prompt": "a"}\n', "{dataset: d.jsonl, limit: 0}", "`limit` must be a whole number of at least 1"),
    ('{"prompt": "a"}\n', "{dataset: d.jsonl, sample: 3}", "unknown option 'sample'"),
    ('{"prompt": "a"}\n', "{datasets: d.jsonl}", "needs `dataset: PATH`, `synthetic: {...}` or `conversations: {...}`"),
])
def test_dataset_errors_name_the_file_line_and_field(tmp_path, content, spec, expected):
    if content is not None:
        (tmp_path / "d.jsonl").write_text(content)
    message = error_of(tmp_path, spec)
    assert "gpubench_w.yaml: workload.prompts:" in message and "(line 2)" in message
    assert expected in message


def test_the_dataset_content_is_in_the_fingerprint_and_its_name_is_not(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"prompt": "one"}\n')
    (tmp_path / "c.jsonl").write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    a, b, c = (workload_of(tmp_path, f"{{dataset: {n}.jsonl}}").prompt_source.identity for n in "abc")
    assert a == b != c and a.startswith("dataset sha256:")
    limited = workload_of(tmp_path, "{dataset: c.jsonl, limit: 1}")
    # The same single prompt as a.jsonl, taken from another file: other prompts' source, not comparable.
    fp = lambda w: cell_fingerprint(w)  # noqa: E731
    assert list(limited.prompts) == list(workload_of(tmp_path, "{dataset: a.jsonl}").prompts)
    assert fp(limited).hash != fp(workload_of(tmp_path, "{dataset: a.jsonl}")).hash


# ------------------------------------------------------------------------ synthetic


def test_fixed_length_prompts_count_within_one_token_under_the_sandbox_rule():
    rng = random.Random(0)
    for tokens in [1, 2, 3, 7, 64, 127, 128, 1000, 4096]:
        text = text_of_length(tokens, rng)
        assert abs(count_tokens(text) - tokens) <= 1
        assert count_tokens(text) == count_prompt_tokens(text)  # the stand-in counts the same way
    assert all(abs(count_tokens(text_of_length(t, rng)) - t) <= 1 for t in range(1, 3000))


def test_synthetic_prompts_are_deterministic_for_a_seed(tmp_path):
    spec = "{synthetic: {input_tokens: {uniform: [20, 200]}, output_tokens: {normal: {mean: 64, stdev: 16}}, count: 20, seed: 7}}"
    first, again = workload_of(tmp_path, spec), workload_of(tmp_path, spec)
    other = workload_of(tmp_path, spec.replace("seed: 7", "seed: 8"))
    assert first.prompt_payload() == again.prompt_payload() != other.prompt_payload()
    assert len(first.prompts) == 20 and len(set(first.prompts)) == 20
    assert all(isinstance(p.max_tokens, int) for p in first.prompts)
    assert first.prompt_source.identity == ("synthetic input uniform[20,200] output normal(64,16)[1,131072] "
                                            "count 20 seed 7")
    # Without output_tokens the entries carry no max_tokens: the workload's applies, as today.
    plain = workload_of(tmp_path, "{synthetic: {input_tokens: 32, count: 3}}")
    assert all(isinstance(e, str) and abs(count_tokens(e) - 32) <= 1 for e in plain.prompt_payload())


def test_uniform_draws_stay_in_bounds_and_centre_on_the_mean():
    dist, rng = distribution({"uniform": [100, 300]}, "x"), random.Random(1)
    draws = [dist.draw(rng) for _ in range(20000)]
    assert min(draws) == 100 and max(draws) == 300
    assert abs(statistics.fmean(draws) - 200) < 2  # stdev of the mean: 58/sqrt(20000) = 0.4


def test_normal_draws_have_the_mean_and_stdev_and_respect_min_max():
    rng = random.Random(2)
    free = distribution({"normal": {"mean": 500, "stdev": 50}}, "x")
    draws = [free.draw(rng) for _ in range(20000)]
    assert abs(statistics.fmean(draws) - 500) < 2 and abs(statistics.stdev(draws) - 50) < 2
    clamped = distribution({"normal": {"mean": 100, "stdev": 80, "min": 50, "max": 150}}, "x")
    draws = [clamped.draw(rng) for _ in range(20000)]
    assert min(draws) == 50 and max(draws) == 150
    assert distribution({"normal": {"mean": 1, "stdev": 10}}, "x").draw(rng) >= 1  # min defaults to 1
    assert distribution(64, "x").draw(rng) == 64


def test_synthetic_input_lengths_follow_the_distribution_in_tokens():
    spec = synthetic_spec({"input_tokens": {"normal": {"mean": 300, "stdev": 40}}, "count": 2000, "seed": 5})
    made = spec.prompts()
    measured = [count_tokens(p.text) for p in made]
    assert all(abs(m - p.input_tokens) <= 1 for m, p in zip(measured, made))
    assert abs(statistics.fmean(measured) - 300) < 4 and abs(statistics.stdev(measured) - 40) < 4


@pytest.mark.parametrize(("spec", "expected"), [
    ("{synthetic: {count: 3}}", "`synthetic.input_tokens` is required"),
    ("{synthetic: {input_tokens: 0}}", "`synthetic.input_tokens` must be a whole number from 1"),
    ("{synthetic: {input_tokens: {uniform: [9, 3]}}}", "lo <= hi; got [9, 3]"),
    ("{synthetic: {input_tokens: {normal: {mean: 5}}}}", "takes mean and stdev"),
    ("{synthetic: {input_tokens: {poisson: 5}}}", "got the key 'poisson'"),
    ("{synthetic: {input_tokens: 8, samples: 3}}", "unknown key 'samples'"),
    ("{synthetic: {input_tokens: 8}, count: 3}", "`synthetic` goes alone; 'count' belongs inside it"),
    ("{synthetic: {input_tokens: 8, count: 0}}", "`synthetic.count` must be a whole number from 1"),
])
def test_synthetic_errors_say_what_is_allowed(tmp_path, spec, expected):
    message = error_of(tmp_path, spec)
    assert "workload.prompts:" in message and expected in message


# ----------------------------------------------------------- entries, ignore_eos, identity


def test_written_entries_may_carry_max_tokens_and_ignore_eos_applies_to_every_entry(tmp_path):
    workload = workload_of(tmp_path, '["plain", {prompt: "capped", max_tokens: 12}]', "  ignore_eos: true\n")
    assert workload.prompt_payload() == [{"prompt": "plain", "ignore_eos": True},
                                         {"prompt": "capped", "max_tokens": 12, "ignore_eos": True}]
    assert Prompt("a", max_tokens=3) != "a" and Prompt("a", max_tokens=3) == Prompt("a", (), 3)
    assert "`max_tokens` must be a whole number" in error_of(tmp_path, '[{prompt: "x", max_tokens: 0}]')
    path = matrix_with(tmp_path, "seed", "  ignore_eos: yes please\n")
    with pytest.raises(MatrixError, match="workload.ignore_eos: must be true or false"):
        load_matrix(path)


def cell_fingerprint(workload: Workload):
    source = workload.prompt_source
    return fingerprint(prompts=workload.prompt_payload(), max_tokens=workload.max_tokens, concurrency=1, rate=None,
                       think=None, warmup_requests=1, runtime="ollama", runtime_version="0.12",
                       prompt_source=source.identity if source else None)


def test_fingerprints_differ_with_the_prompts_source_and_keep_their_hash_for_written_prompts(tmp_path):
    seed = workload_of(tmp_path, "seed")
    before = fingerprint(prompts=seed.prompt_payload(), max_tokens=256, concurrency=1, rate=None, think=None,
                         warmup_requests=1, runtime="ollama", runtime_version="0.12")
    assert cell_fingerprint(seed) == before and "prompt_source" not in before.fields  # old baselines still match
    synth = workload_of(tmp_path, "{synthetic: {input_tokens: 64, count: 10, seed: 1}}")
    other_seed = workload_of(tmp_path, "{synthetic: {input_tokens: 64, count: 10, seed: 2}}")
    eos = workload_of(tmp_path, "{synthetic: {input_tokens: 64, count: 10, seed: 1}}", "  ignore_eos: true\n")
    hashes = {cell_fingerprint(w).hash for w in (seed, synth, other_seed, eos)}
    assert len(hashes) == 4
    stored = {"run_id": "r1", "benchmark": {"details": {"fingerprint": cell_fingerprint(seed).model_dump()}}}
    why = incomparable(cell_fingerprint(synth), stored)
    assert why.startswith("run r1 differs: prompts differ, prompt_source written or built-in prompts -> synthetic")


def test_the_source_survives_cells_and_a_hook_returning_the_workload(tmp_path):
    path = matrix_with(tmp_path, "{synthetic: {input_tokens: 16, count: 2}}", "  concurrency: [1, 2]\n")
    cells = load_cells(path)
    assert [c.workload.prompt_source.identity for c in cells] == ["synthetic input 16 output workload count 2 seed 0"] * 2
    changed = with_workload(cells[0], cells[0].workload.model_copy(update={"duration": 10.0}), "a hook")
    assert changed.workload.prompt_source == cells[0].workload.prompt_source
    assert changed.workload.model_dump(mode="json")["prompts"] == cells[0].workload.prompt_payload()


def test_dataset_matrix_validates_from_any_working_directory(tmp_path, monkeypatch):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    path = matrix_with(tmp_path, "{dataset: p.jsonl}")
    monkeypatch.chdir("/")
    assert list(load_matrix(path).workload.prompts) == ["hello"]
