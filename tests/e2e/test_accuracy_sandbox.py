"""Issue 23 item 5 end to end on the sandbox: accuracy beside speed, scored exactly against a
stand-in model that answers a known share of the built-in problems right."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import sqlite_utils
from e2e_helpers import only_result, run_pytest

from pytest_gpubench.matrix.accuracy import builtin_problems
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.ollama_common import answers_right

PROBLEMS = 10
MATRIX = f"""
workload: {{duration: 2s, max_tokens: 24, warmup_requests: 1, accuracy: {{builtin: {PROBLEMS}}}}}
matrix:
  - {{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}}
"""


@pytest.mark.slow
def test_the_stored_accuracy_is_the_models_known_share_and_its_requests_are_not_measured(
        tmp_path, standalone_sandbox):
    matrix = tmp_path / "gpubench_accuracy.yaml"
    matrix.write_text(MATRIX)
    junit = tmp_path / "junit.xml"
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "--junitxml", str(junit))
    assert done.returncode == 0, done.stdout[-4000:]
    result, details = only_result(tmp_path)

    # The catalog says qwen2:7b answers 80% right; which ones is the stand-in's rule, per problem.
    share = load_catalog().models["qwen2:7b"].accuracy
    right = sum(answers_right(p.text, "qwen2:7b", share) for p in builtin_problems(PROBLEMS))
    assert 0 < right < PROBLEMS  # some wrong: a scorer that counted every reply right would fail here
    assert details["accuracy"] == {
        "source": f"builtin ({PROBLEMS} problems)", "problems": PROBLEMS, "correct": right,
        "wrong": PROBLEMS - right, "unanswered": 0, "failed": 0, "accuracy": round(right / PROBLEMS, 6),
        "max_tokens": 24, "concurrency": 4}
    case = next(ET.parse(junit).getroot().iter("testcase"))
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(properties["gpubench_accuracy"]) == round(right / PROBLEMS, 4)

    # The problems were no measured request: the stored requests are the measured run's (and its
    # warm-up) alone, none of them a problem (each problem's reply is scored: matched set), and
    # the throughput is theirs.
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    benchmark_id = next(db["benchmark_manifest"].rows)["benchmark_id"]
    requests = list(db.query("select * from requests where benchmark_id = ?", [benchmark_id]))
    measured = [r for r in requests if not r["warmup"]]
    assert all(r["matched"] is None for r in requests)
    assert len(measured) == result["results"]["total_requests"] > 0
    assert result["results"]["total_tokens"] == sum(r["output_tokens"] for r in measured if r["error"] is None)
    assert details["metrics"]["output_throughput_tps"] == pytest.approx(
        result["results"]["total_tokens"] / result["results"]["duration_seconds"], rel=0.01)
