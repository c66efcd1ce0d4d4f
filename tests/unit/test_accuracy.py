"""Issue 23 item 5, accuracy beside speed: the built-in problems, the exact scorer, the matrix's
``accuracy:`` field, the load generator's exact matching and the sandbox model's known share."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.figures import FIGURES, FigureSource
from pytest_gpubench.matrix.accuracy import BUILTIN_COUNT, INSTRUCTION, Problem, builtin_problems, score
from pytest_gpubench.matrix.adjust import with_workload
from pytest_gpubench.matrix.cells import load_cells, load_matrix
from pytest_gpubench.measure.benchmark import LOADGEN_BOOTSTRAP, BenchmarkPlan, loadgen_input
from pytest_gpubench.remote.loadgen import Exact, final_answer
from pytest_gpubench.report.model import ModelTable, ResultRow
from pytest_gpubench.report.tables import model_table
from pytest_gpubench.sandbox import DEFAULT_CATALOG
from pytest_gpubench.sandbox.catalog import CatalogError, load_catalog
from pytest_gpubench.sandbox.ollama_common import answers_right, plan_output, solve_builtin

ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"


# ------------------------------------------------------------------ the built-in problems


def test_the_builtin_problems_are_the_same_on_every_call_and_each_prefix_is_the_first_n():
    problems = builtin_problems()
    assert len(problems) == BUILTIN_COUNT == len(set(p.text for p in problems))
    assert problems == builtin_problems() and builtin_problems(10) == problems[:10]
    # Pinned: the set is fixed by a seed string, not by the process or the machine; a change
    # to it changes every stored accuracy's meaning, so it must be deliberate.
    assert problems[0] == Problem("A shop sells tickets at 8 dollars each. Aisha buys 26 tickets. How many "
                                  f"dollars does Aisha pay? {INSTRUCTION}", 208)
    assert sum(p.answer for p in problems) == sum(p.answer for p in builtin_problems())
    assert all(p.text.endswith(INSTRUCTION) and isinstance(p.answer, int) and p.answer > 0 for p in problems)
    shapes = {p.text.split(" ")[1] for p in problems}  # each of the five shapes appears
    assert len({"shop", "train", "tank"} & shapes) == 3
    assert problems[0].payload() == {"prompt": problems[0].text, "answer": "208"}


def test_the_sandbox_model_works_out_every_builtin_problem_and_nothing_else():
    # The stand-in reads the generator's five shapes: a change to one side fails here.
    assert all(solve_builtin(p.text) == p.answer for p in builtin_problems(500))
    assert solve_builtin("What is 15 + 27? Answer with just the number.") is None


# ------------------------------------------------------------------ the exact scorer


@pytest.mark.parametrize(("reply", "found"), [
    ("The answer is 12. (Not 13)", "12"),        # the marked answer wins over a later number
    ("I think 12... no wait, 13", "13"),          # no marker: the last number
    ("Step 1: 8 x 26 = 208\nAnswer: 208", "208"),
    ("**Answer:** 1,234", "1234"),                # markdown and thousands commas
    ("Answer: 7\nLet me check.\nAnswer: 8", "8"),  # the last marker
    ("#### 72", "72"),
    ("answer = $-5", "-5"),
    ("Answer: 12.0", "12"),
    ("about 12.50 dollars", "12.5"),
    ("version 1.2.3, so 9", "9"),
    ("the answer is not 12 but 13", "13"),        # "answer is" without a number is no marker
    ("No idea.", None),
    ("", None),
])
def test_the_final_answer_of_a_reply(reply, found):
    assert final_answer(reply) == found


def test_exact_scoring_is_exact_and_a_reply_without_a_number_is_unanswered():
    assert Exact("12").matches("The answer is 12. (Not 13)") is True
    assert Exact(12).matches("Answer: 120") is False  # exact, not a substring
    assert Exact("1234").matches("answer: 1,234") is True and Exact("12").matches("Answer: 12.5") is False
    assert Exact("12").matches("I cannot tell.") is None


def test_the_score_counts_every_problem_once_and_failures_as_wrong(tmp_path):
    spec = load_matrix_of_accuracy("{builtin: 6}", tmp_path)

    def record(index, matched=None, error=None, incomplete=False):
        return SimpleNamespace(prompt_index=index, matched=matched, error=error, incomplete=incomplete)

    records = [record(0, True), record(1, False), record(2, None), record(3, True, error="HTTP 500"),
               record(4, True, incomplete=True), record(0, False)]  # 5 never answered; 0 twice: the first counts
    assert score(spec, records) == {"source": "builtin (6 problems)", "problems": 6, "correct": 1, "wrong": 1,
                                    "unanswered": 1, "failed": 3, "accuracy": round(1 / 6, 6)}
    assert score(spec, [])["failed"] == 6 and score(spec, [])["accuracy"] == 0.0


def test_the_accuracy_figure_reads_the_details_and_is_empty_without_a_pass():
    figure = FIGURES["accuracy"]
    assert figure.value(FigureSource({}, {"accuracy": {"accuracy": 0.8, "problems": 50}})) == 0.8
    assert figure.value(FigureSource({}, {})) is None


# ------------------------------------------------------------------ the matrix field


def matrix_path(tmp_path, accuracy: str, row: str = ROW):
    path = tmp_path / "gpubench_a.yaml"
    path.write_text(f"workload:\n  accuracy: {accuracy}\n{row}")
    return path


def load_matrix_of_accuracy(accuracy: str, tmp_path):
    return load_matrix(matrix_path(tmp_path, accuracy)).workload.accuracy


def error_of(tmp_path, accuracy: str) -> str:
    with pytest.raises(MatrixError) as caught:
        load_matrix(matrix_path(tmp_path, accuracy))
    return str(caught.value)


def test_accuracy_is_off_by_default_and_builtin_or_a_dataset_when_asked(tmp_path):
    (tmp_path / "gpubench_off.yaml").write_text(ROW)
    assert load_matrix(tmp_path / "gpubench_off.yaml").workload.accuracy is None
    builtin = load_matrix_of_accuracy("builtin", tmp_path)
    assert builtin.source == "builtin" and builtin.problems == builtin_problems()
    assert load_matrix_of_accuracy("{builtin: 5}", tmp_path).problems == builtin_problems(5)
    (tmp_path / "mine.jsonl").write_text('{"prompt": "2+2? Answer: N", "answer": 4}\n'
                                         '{"prompt": "Ten minus 13?", "answer": "-3"}\n')
    mine = load_matrix_of_accuracy("{dataset: mine.jsonl}", tmp_path)  # relative to the matrix file
    assert mine.problems == (Problem("2+2? Answer: N", 4), Problem("Ten minus 13?", -3))
    assert mine.source.startswith("dataset mine.jsonl (sha256:")


def test_a_row_sets_or_drops_the_accuracy_pass_and_a_hook_keeps_it(tmp_path):
    path = tmp_path / "gpubench_rows.yaml"
    path.write_text("workload: {accuracy: {builtin: 3}}\nmatrix:\n"
                    "  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"
                    "  - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {accuracy: null}}\n"
                    "  - {gpu: A100, provider: vastai, model: qwen2:7b, workload: {accuracy: builtin}}\n")
    cells = load_cells(path)
    assert [len(c.workload.accuracy.problems) if c.workload.accuracy else None for c in cells] == [3, None, 50]
    kept = with_workload(cells[0], cells[0].workload.model_copy(update={"max_tokens": 64}), "a hook")
    assert kept.workload.accuracy == cells[0].workload.accuracy and kept.workload.max_tokens == 64
    assert cells[0].workload.model_dump(mode="json")["accuracy"] == {"source": "builtin (3 problems)",
                                                                     "problems": 3}


@pytest.mark.parametrize(("content", "accuracy", "expected"), [
    (None, "yes", "must be `builtin`, {builtin: N} (the first N built-in problems) or {dataset: FILE}"),
    (None, "bultin", "did you mean 'builtin'?"),
    (None, "{builtin: 0}", "a whole number from 1 to 1000; got 0"),
    (None, "{datset: a.jsonl}", "did you mean 'dataset'?"),
    (None, "{dataset: nowhere.jsonl}", "nowhere.jsonl: cannot read it"),
    ('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 2\n', "{dataset: d.jsonl}",
     "d.jsonl line 2: invalid JSON"),
    ('{"prompt": "a", "answer": 1}\n{"prompt": "b"}\n', "{dataset: d.jsonl}",
     "d.jsonl line 2: field `answer` is missing"),
    ('{"prompt": "a", "answer": "twelve"}\n', "{dataset: d.jsonl}",
     'd.jsonl line 1: field `answer` must be a whole number (such as 42 or "42"); got "twelve"'),
    ('{"prompt": "a", "answer": 1.5}\n', "{dataset: d.jsonl}", "d.jsonl line 1: field `answer` must be a whole"),
    ('{"prompt": "", "answer": 1}\n', "{dataset: d.jsonl}", "d.jsonl line 1: field `prompt` must be non-empty"),
    ('[\n {"prompt": "a", "answer": 1},\n 7\n]', "{dataset: d.jsonl}",
     "d.jsonl line 3: a record must be a JSON object"),
    ("\n", "{dataset: d.jsonl}", "d.jsonl: no problems in it"),
])
def test_accuracy_errors_name_the_file_line_and_field(tmp_path, content, accuracy, expected):
    if content is not None:
        (tmp_path / "d.jsonl").write_text(content)
    message = error_of(tmp_path, accuracy)
    assert "gpubench_a.yaml: workload.accuracy:" in message and "(line 2)" in message, message
    assert expected in message, message


# ------------------------------------------------------------------ the sandbox's model


def test_the_sandbox_model_answers_its_share_right_and_keeps_its_token_counts():
    problems = builtin_problems(200)
    for share in (0.0, 0.6, 1.0):
        replies = ["".join(plan_output(p.text, 48, model="qwen2:7b", accuracy=share).tokens) for p in problems]
        right = [final_answer(r) == str(p.answer) for p, r in zip(problems, replies, strict=True)]
        # Exactly the deterministic rule, and every wrong reply still gives a (wrong) number.
        assert right == [answers_right(p.text, "qwen2:7b", share) for p in problems]
        assert all(final_answer(r) is not None for r in replies)
        assert abs(sum(right) / len(problems) - share) < 0.1
    for p in problems[:20]:
        right, wrong = (plan_output(p.text, 48, model="m", accuracy=a) for a in (1.0, 0.0))
        assert len(right.tokens) == len(wrong.tokens) and right.done_reason == wrong.done_reason
        # Only the number differs: the reply's length, and so its timing, is the model's as before.
        assert right.tokens[:-1] == wrong.tokens[:-1] and right.tokens[-4:-1] == ("\n", "Answer", ":")
        assert right.tokens[-1] == f" {p.answer}" != wrong.tokens[-1]
    other = "Explain the CAP theorem."
    assert plan_output(other, 48, model="m", accuracy=0.0) == plan_output(other, 48, model="m", accuracy=1.0)


def test_the_catalog_gives_each_model_a_share_from_0_to_1(tmp_path):
    catalog = load_catalog()
    assert catalog.models["qwen2:7b"].accuracy == 0.8 and catalog.models["qwen2:1.5b"].accuracy == 0.6
    assert catalog.models["deepseek-r1:14b"].accuracy == 1.0  # unset: every problem right
    text = DEFAULT_CATALOG.read_text().replace("accuracy: 0.8", "accuracy: 1.5")
    bad = tmp_path / "catalog.yaml"
    bad.write_text(text)
    with pytest.raises(CatalogError, match=r"models.*qwen2:7b.*accuracy"):
        load_catalog(bad)


# ------------------------------------------------------------------ the load generator


class Replies(http.server.BaseHTTPRequestHandler):
    """Ollama's stream shape; the reply is ``ANSWERS[prompt]``, in two token chunks."""

    protocol_version = "HTTP/1.1"
    prompts: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
        self.prompts.append(prompt)
        reply = {"p0": "Working: 3 + 4 =", "p1": "Answer: 7", "p2": "hmm", "p3": "Answer: 12"}[prompt]
        half = len(reply) // 2
        lines = [{"response": reply[:half], "done": False}, {"response": reply[half:], "done": False},
                 {"response": "", "done": True, "eval_count": 2}]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_load_generator_asks_each_problem_once_and_scores_it_exactly():
    prompts: list[str] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (Replies,), {"prompts": prompts}))
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        problems = [{"prompt": f"p{i}", "answer": "7"} for i in range(4)]
        plan = BenchmarkPlan(model="m", duration=60, max_tokens=8, prompts=problems, warmup_requests=0,
                             progress_interval=60, checkpoint_every=100, checkpoint_path="", concurrency=2,
                             requests=len(problems))
        done = subprocess.run([sys.executable, "-c", LOADGEN_BOOTSTRAP],
                              input=loadgen_input(plan.config(f"http://127.0.0.1:{httpd.server_address[1]}")),
                              capture_output=True, text=True, timeout=60)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    records = sorted((e for e in events if e["event"] == "request"), key=lambda r: r["prompt_index"])
    # Each problem once (the limit, not the 60 s deadline, ended the run), scored exactly:
    # "3 + 4 =" ends on 4 (wrong), "hmm" has no number (unanswered), 12 is not 7.
    assert sorted(prompts) == ["p0", "p1", "p2", "p3"] and events[-1]["duration_seconds"] < 30
    assert [r["matched"] for r in records] == [False, True, None, False]


def test_the_report_shows_accuracy_beside_speed_where_a_cell_asked_its_problems():
    def row(gpu: str, accuracy: float | None) -> ResultRow:
        return ResultRow(run_id="r", cell_id=f"{gpu}-vastai-m", benchmark_id=gpu, gpu=gpu, provider="vastai",
                         model="m", status="success", output_tokens_per_second=100.0, decode_tokens_per_second=50.0,
                         ttft_p50_ms=100.0, price_per_hour=1.0, cost_per_million_tokens=2.78, requests=10, errors=0,
                         figures={"accuracy": accuracy})

    asked, not_asked = row("RTX 4090", 0.8), row("T4", None)
    table = model_table(ModelTable(model="m", rows=[asked, not_asked], fastest=asked, cheapest=asked))
    column = table.header.index("Accuracy")
    assert [str(r[column]) for r in table.rows] == ["80.0%", "-"]
    alone = model_table(ModelTable(model="m", rows=[not_asked], fastest=not_asked, cheapest=not_asked))
    assert "Accuracy" not in alone.header  # no cell asked: no column of dashes


def test_the_docs_example_collects_with_the_problems_it_says(tmp_path):
    docs = (Path(__file__).parents[2] / "docs" / "workloads.md").read_text(encoding="utf-8")
    section = docs.split("## Accuracy", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "gpubench_docs.yaml").write_text(example)
    cells = load_cells(tmp_path / "gpubench_docs.yaml")
    assert [len(c.workload.accuracy.problems) if c.workload.accuracy else None for c in cells] == [50, 20, None]
