"""The runtime registry (``runtime_facts.py``): each runtime's facts declared once, in its module,
read by the matrix, ``cloud/`` and the sandbox; third-party runtimes read from entry points only
when a name is not built in."""

from __future__ import annotations

import importlib.metadata

import pytest

from pytest_gpubench import runtime_facts
from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import parse_matrix
from pytest_gpubench.matrix.fields import runtime_name
from pytest_gpubench.matrix.launch import LaunchSpec, launch_problem, resolved
from pytest_gpubench.runtime_facts import BUILT_IN, ImageServer, RuntimeFacts, facts_of

ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n"


@pytest.fixture
def no_distribution_read(monkeypatch):
    """Reading any distribution's entry points fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("entry points read for a built-in runtime")

    monkeypatch.setattr(runtime_facts, "_registered", {})
    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)


def test_a_built_in_runtime_is_checked_and_described_without_reading_any_distribution(no_distribution_read):
    for name in BUILT_IN:
        assert runtime_name(name.upper()) == name
        assert runtime_facts.is_runtime(name) and facts_of(name).name == name
    assert parse_matrix(f"runtime: vllm\n{ROW}", "m.yaml")


def test_every_built_in_runtime_is_declared_in_its_own_module_under_its_name():
    for name, where in BUILT_IN.items():
        facts = facts_of(name)
        assert isinstance(facts, RuntimeFacts) and facts.name == facts.runtime.name == name
        assert where == f"{facts.runtime.__module__}:RUNTIME" and hasattr(facts.runtime, "for_cell")


def test_the_facts_other_folders_read_are_the_ones_they_had_before_the_declarations():
    per_cell = {name for name in BUILT_IN if runtime_facts.server_per_cell(name)}
    assert per_cell == {"vllm", "sglang", "tgi", "llamacpp"}
    assert not runtime_facts.server_per_cell("") and not runtime_facts.server_per_cell("microbench")
    assert runtime_facts.image_runtimes() == ["vllm", "tgi"]
    assert facts_of("vllm").image == ImageServer("llm_vllm", "vllm/vllm-openai:latest", 8000)
    assert facts_of("tgi").image == ImageServer("llm_tgi", "ghcr.io/huggingface/text-generation-inference:latest", 80)
    entrypoint = LaunchSpec(mode="entrypoint")
    assert resolved(entrypoint, "tgi").api_port == 80 and resolved(entrypoint, "vllm").image.startswith("vllm/")
    assert "(vllm, tgi)" in launch_problem(entrypoint, "ollama", None)
    assert [facts_of(name).tensor_parallel_flag for name in ("vllm", "sglang", "tgi", "llamacpp")] == [
        "--tensor-parallel-size", "--tp-size", "--num-shard", None]
    launchers = {f.sandbox.program: f.sandbox.stand_in for f in runtime_facts.all_facts()
                 if f.sandbox is not None and f.sandbox.kind == "launcher"}
    assert launchers == {"vllm": "vllm", "llama-server": "llama-server",
                         "text-generation-launcher": "text-generation-launcher"}


class _Point:
    def __init__(self, name: str, value: object) -> None:
        self.name, self.value, self._value = name, f"elsewhere:{name}", value

    def load(self) -> object:
        return self._value


def test_a_registered_runtime_is_read_from_its_entry_point_and_a_bad_one_says_why(monkeypatch):
    toy = RuntimeFacts(name="toy", runtime=object, server_per_cell=True)
    points = [_Point("toy", toy), _Point("broken", "not facts"), _Point("vllm", "shadowing a built-in")]
    asked: list[str] = []

    def entry_points(group: str):
        asked.append(group)
        return points

    monkeypatch.setattr(runtime_facts, "_registered", {})
    monkeypatch.setattr(runtime_facts, "_loaded", {})
    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert runtime_facts.runtime_names() == (*BUILT_IN, "broken", "toy")  # a built-in's name cannot be taken
    assert facts_of("toy") is toy and runtime_facts.server_per_cell("toy")
    assert asked == ["pytest_gpubench.runtimes"]  # read once while sys.path stays the same
    assert parse_matrix(f"runtime: TOY\n{ROW}", "m.yaml")
    with pytest.raises(TypeError, match=r"elsewhere:broken \(entry point pytest_gpubench.runtimes: broken\) is not"):
        facts_of("broken")
    with pytest.raises(MatrixError, match=r"unknown runtime 'tyo' \(did you mean 'toy'\?\); known runtimes: "
                                          r"ollama, vllm, sglang, tgi, llamacpp, openai, worker, broken, toy"):
        parse_matrix(f"runtime: tyo\n{ROW}", "m.yaml")
    with pytest.raises(runtime_facts.UnknownRuntime, match="unknown runtime 'nonesuch'; known runtimes: ollama"):
        facts_of("nonesuch")
