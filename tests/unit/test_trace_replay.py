"""Trace replay (issue 23 item 4): the trace reader, the workload field and the load generator's schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import expand, load_matrix
from pytest_gpubench.matrix.synthetic import count_tokens
from pytest_gpubench.matrix.trace import load_trace
from pytest_gpubench.remote.loadgen import TraceSchedule

MOONCAKE = [
    {"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
    {"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]},
    {"timestamp": 27482, "input_length": 13, "output_length": 4, "hash_ids": [46]},
]


def write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_a_mooncake_trace_becomes_synthetic_prompts_at_its_times_sped_up(tmp_path):
    trace = load_trace({"file": "t.jsonl", "speedup": 2}, base_dir=write(tmp_path / "t.jsonl", MOONCAKE).parent)
    assert trace.offsets == pytest.approx([0.0, 10.535 / 2, 27.482 / 2])
    assert trace.window == pytest.approx(27.482 / 2)
    assert [r.max_tokens for r in trace.requests] == [52, 26, 4]
    # The synthetic text's token rule: within one token of the trace's length (exact for 13).
    assert [abs(count_tokens(r.text) - r.input_tokens) <= 1 for r in trace.requests] == [True] * 3
    assert count_tokens(trace.requests[2].text) == 13
    payload = trace.requests[0].payload(ignore_eos=True)
    assert payload == {"prompt": trace.requests[0].text, "max_tokens": 52, "ignore_eos": True}
    again = load_trace({"file": str(tmp_path / "t.jsonl"), "speedup": 2}, base_dir=Path("/"))
    assert [r.text for r in again.requests] == [r.text for r in trace.requests]  # the same prompts every time
    assert again.source.identity == trace.source.identity and "speedup 2" in trace.source.identity


def test_limit_duration_seconds_and_other_spellings(tmp_path):
    records = [{"time": 1.0, "input_tokens": 10, "output_tokens": 3}, {"time": 1.5, "ContextTokens": 20,
               "GeneratedTokens": 5}, {"arrival_time": 4.0, "input_length": 30}]
    write(tmp_path / "s.jsonl", records)
    trace = load_trace({"file": "s.jsonl", "time_unit": "s"}, tmp_path)
    assert trace.offsets == [0.0, 0.5, 3.0] and [r.max_tokens for r in trace.requests] == [3, 5, None]
    assert load_trace({"file": "s.jsonl", "time_unit": "s", "limit": 2}, tmp_path).offsets == [0.0, 0.5]
    cut = load_trace({"file": "s.jsonl", "time_unit": "s", "duration": 1}, tmp_path)
    assert cut.offsets == [0.0, 0.5] and cut.window == 0.5


def test_a_conversation_record_is_sent_as_recorded(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    write(tmp_path / "m.jsonl", [{"timestamp": 5, "messages": messages, "output_length": 9, "extra": 1}])
    request = load_trace("m.jsonl", tmp_path).requests[0]
    assert request.payload() == {"prompt": "Be brief.\n\nWhy?", "max_tokens": 9, "messages": messages}


@pytest.mark.parametrize("lines, spec, message", [
    (['{"timestamp": 0, "input_length": 5}', '{"timestamp": 10, "input_length": 5', ""], {},
     "line 2: invalid JSON"),
    (['{"timestamp": 100, "input_length": 5}', '{"timestamp": 50, "input_length": 5}'], {},
     "line 2: field `timestamp` goes backwards"),
    (['{"input_length": 5}'], {}, "line 1: field `timestamp` is missing"),
    (['{"timestamp": -1, "input_length": 5}'], {}, "line 1: field `timestamp` must be a number of at least 0"),
    (['{"timestamp": "soon", "input_length": 5}'], {}, "field `timestamp` must be a number"),
    (['{"timestamp": 0, "output_length": 5}'], {}, "line 1: field `input_length` is missing"),
    (['{"timestamp": 0, "input_length": 0}'], {}, "line 1: field `input_length` must be a whole number"),
    (['{"timestamp": 0, "input_length": 4, "output_length": 2.5}'], {}, "field `output_length` must be a whole"),
    (['{"timestamp": 0, "messages": []}'], {}, "field `messages` must be a non-empty list"),
    (['{"timestamp": 0, "messages": [{"role": "user"}]}'], {}, "field `messages[0]` must be"),
    (['[1, 2]'], {}, "line 1: a record must be a JSON object"),
    ([""], {}, "no records in it"),
    (['{"timestamp": 0, "input_length": 5}'], {"speedup": 0}, "`speedup` must be a number above 0"),
    (['{"timestamp": 0, "input_length": 5}'], {"limit": 0}, "`limit` must be a whole number"),
    (['{"timestamp": 0, "input_length": 5}'], {"time_unit": "us"}, "`time_unit` must be ms"),
    (['{"timestamp": 0, "input_length": 5}'], {"speed": 2}, "unknown option 'speed'; allowed: file, speedup"),
])
def test_bad_traces_name_the_file_line_and_field(tmp_path, lines, spec, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError) as caught:
        load_trace({"file": "bad.jsonl", **spec}, tmp_path)
    assert message in str(caught.value)
    if "line" in message or "records" in message:
        assert str(path) in str(caught.value)


def matrix(tmp_path: Path, workload: str, row: str = "") -> Path:
    write(tmp_path / "trace.jsonl", MOONCAKE)
    path = tmp_path / "m.yaml"
    path.write_text(f"workload:\n{workload}\nmatrix:\n  - {{gpu: RTX 4090, model: 'qwen2:7b', provider: vastai{row}}}\n")
    return path


def test_the_workload_reads_the_trace_relative_to_the_matrix_at_collection(tmp_path):
    cell, = expand(load_matrix(matrix(tmp_path, "  trace: {file: trace.jsonl, speedup: 4, limit: 2}")))
    workload = cell.workload
    assert workload.trace.offsets == pytest.approx([0.0, 10.535 / 4])
    assert [p["max_tokens"] for p in workload.prompt_payload()] == [52, 26]
    assert workload.prompts_label == "trace trace.jsonl (2 requests, speedup 4)"
    assert workload.prompt_source.identity.startswith("trace sha256:")
    assert workload.model_dump(mode="json")["trace"] == {"label": workload.prompts_label, "requests": 2,
                                                         "speedup": 4.0, "window_s": 2.63375}


@pytest.mark.parametrize("workload, row, message", [
    ("  trace: {file: trace.jsonl}\n  concurrency: [1, 4]", "", "`trace:` and `concurrency: [1, 4]` cannot be combined"),
    ("  trace: {file: trace.jsonl}", ", workload: {rate: 2}", "`trace:` and `rate: 2` cannot be combined"),
    ("  trace: {file: missing.jsonl}", "", "missing.jsonl: cannot read it"),
    ("  trace: {file: trace.jsonl, speedup: -1}", "", "`speedup` must be a number above 0"),
    ("  trace: {file: trace.jsonl}\n  prompts: quality", "", "`prompts:` and `trace:` cannot be combined"),
])
def test_a_bad_trace_workload_is_a_matrix_error(tmp_path, workload, row, message):
    with pytest.raises(MatrixError) as caught:
        expand(load_matrix(matrix(tmp_path, workload, row)))
    assert message in str(caught.value) and "trace" in str(caught.value)


class FakeRun:
    """What TraceSchedule asks of the load generator: requests in flight, a backoff, a launch."""

    def __init__(self):
        self.in_flight, self.sent = 0, []

    def held(self, now):
        return False

    def launch(self, warmup, scheduled, prompt=None):
        self.in_flight += 1
        self.sent.append((scheduled, prompt))


def test_the_schedule_sends_what_is_due_in_order_up_to_the_cap():
    schedule, run = TraceSchedule([0.0, 0.1, 0.1, 0.5], cap=2, start=100.0), FakeRun()
    assert schedule.wake(run) == 100.0
    schedule.launch(run, 100.05)
    assert run.sent == [(100.0, 0)] and schedule.wake(run) == pytest.approx(100.1)
    schedule.launch(run, 100.2)  # two are due, one slot is free: the other waits, keeping its time
    assert run.sent[-1] == (pytest.approx(100.1), 1) and schedule.wake(run) is None
    run.in_flight = 0
    schedule.launch(run, 100.3)
    assert run.sent[-1] == (pytest.approx(100.1), 2) and not schedule.exhausted(100.3)
    assert schedule.unsent() == 1
    schedule.launch(run, 100.6)
    assert run.sent[-1] == (pytest.approx(100.5), 3) and schedule.exhausted(100.6) and schedule.unsent() == 0


def test_the_docs_example_collects_with_the_sample_trace(tmp_path):
    """docs/workloads.md "Trace replay": its matrix collects (beside the repository's sample trace),
    and its two example records read."""
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs" / "workloads.md").read_text()
    section = text[text.index("## Trace replay"):]
    example = section[section.index("```yaml\n") + 8:section.index("```", section.index("```yaml\n") + 8)]
    records = section[section.index("```json\n") + 8:section.index("```", section.index("```json\n") + 8)]
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "sample_trace.jsonl").write_bytes(
        (repo / "matrix" / "traces" / "sample_trace.jsonl").read_bytes())
    (tmp_path / "m.yaml").write_text(example)
    cell, = expand(load_matrix(tmp_path / "m.yaml"))
    assert cell.cell_id == "RTX_4090-vastai-qwen2:7b" and cell.workload.trace.speedup == 2
    assert len(cell.workload.trace.requests) == 12
    (tmp_path / "r.jsonl").write_text(records)
    first, second = load_trace("r.jsonl", tmp_path).requests
    assert (first.input_tokens, first.max_tokens, second.messages[0]["content"]) == (655, 52, "Be brief.")
    assert second.offset == pytest.approx(30.120 - 27.482)
