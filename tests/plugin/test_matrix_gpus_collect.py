"""Multi-GPU cells through pytest's own collection: their ids, ``-k`` and ``--gpubench-gpu`` selection."""

from __future__ import annotations


def test_pytest_collects_multi_gpu_cells_and_k_and_gpu_select_them(pytester, monkeypatch):
    pytester.makefile(".yaml", gpubench_gpus="""
runtime: vllm
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, gpus: 2}
  - {gpu: H200 NVL, provider: vastai, model: qwen2:7b, gpus: 8}
""")
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_MANIFEST", str(pytester.path / "reports" / "manifest.db"))
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-runtime_vllm",
        "gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-x2-runtime_vllm",
        "gpubench_gpus.yaml::H200_NVL-vastai-qwen2:7b-x8-runtime_vllm",
    ])
    result = pytester.runpytest("--collect-only", "-q", "-k", "x2")
    result.stdout.fnmatch_lines(["gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-x2-runtime_vllm",
                                 "*1/3 tests collected*"])
    result = pytester.runpytest("--collect-only", "-q", "--gpubench-gpu", "RTX4090")
    result.stdout.fnmatch_lines(["*RTX_4090-vastai-qwen2:7b-runtime_vllm", "*RTX_4090-vastai-qwen2:7b-x2-runtime_vllm",
                                 "*2/3 tests collected*"])
