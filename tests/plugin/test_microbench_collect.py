"""Microbench cells through pytest's collection: their ids beside the model cells, selected by
``-k microbench`` and ``--gpubench-model microbench``; an unknown kind stops collection with the
file, the field and the allowed values."""

from __future__ import annotations

MATRIX = """
matrix:
  - {gpu: RTX 4090, providers: [vastai, tensordock], model: 'qwen2:7b', microbench: [memory_bandwidth, matmul]}
"""


def test_microbench_cells_are_collected_and_selected_like_any_cell(pytester, monkeypatch):
    pytester.makefile(".yaml", gpubench_micro=MATRIX)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    result = pytester.runpytest("--collect-only", "-q")
    collected = {line for line in result.stdout.lines if line.startswith("gpubench_micro.yaml::")}
    assert collected == {f"gpubench_micro.yaml::RTX_4090-{provider}-{model}"
                         for provider in ("vastai", "tensordock") for model in ("qwen2:7b", "microbench")}
    result = pytester.runpytest("--collect-only", "-q", "-k", "microbench and vastai")
    result.stdout.fnmatch_lines(["gpubench_micro.yaml::RTX_4090-vastai-microbench", "*1/4 tests collected*"])
    result = pytester.runpytest("--collect-only", "-q", "--gpubench-model", "microbench")
    result.stdout.fnmatch_lines(["*2/4 tests collected (2 deselected)*"])


def test_an_unknown_kind_stops_collection_with_the_allowed_values(pytester, monkeypatch):
    pytester.makefile(".yaml", gpubench_micro=MATRIX.replace("memory_bandwidth", "bandwidth"))
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*gpubench_micro.yaml: matrix[[]0[]].microbench.kinds*unknown kind 'bandwidth'*"
                                 "allowed: memory_bandwidth, matmul*"])
    assert result.ret != 0
