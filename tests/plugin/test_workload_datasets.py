"""Issue 11 item 4: a matrix whose prompts come from a dataset, collected as users meet it. (pytester)"""

import json

import pytest

MATRIX = """
workload:
  duration: 5s
  prompts: {dataset: data/share.json, output_tokens: dataset, limit: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
"""


@pytest.fixture
def project(pytester, closed_port, monkeypatch):
    pytester.mkdir("matrix")
    pytester.mkdir("matrix/data")
    (pytester.path / "matrix" / "gpubench_share.yaml").write_text(MATRIX)
    conversations = [{"conversations": [{"from": "human", "value": f"Question {i}?"},
                                        {"from": "gpt", "value": "an answer " * i}]} for i in range(1, 5)]
    (pytester.path / "matrix" / "data" / "share.json").write_text(json.dumps(conversations, indent=1))
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_API_BASE", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    return pytester


def test_a_dataset_matrix_collects_from_any_directory(project):
    # The dataset's path is relative to the matrix file, not to where pytest runs.
    result = project.runpytest("matrix", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["matrix/gpubench_share.yaml::RTX_4090-vastai-qwen2:7b", "1 test collected*"])
    assert result.ret == 0


def test_a_broken_dataset_fails_collection_naming_file_line_and_field(project):
    share = project.path / "matrix" / "data" / "share.json"
    share.write_text('[\n {"conversations": [{"from": "human", "value": "hi"}]},\n {"turns": []}\n]')
    result = project.runpytest("matrix", "--collect-only", "-q")
    assert result.ret == 2
    out = result.stdout.str()
    assert "gpubench_share.yaml: workload.prompts: dataset " in out
    assert "share.json line 3: field `prompt` is missing (the record's keys: turns)" in out
    assert "Traceback" not in out and "pydantic" not in out
