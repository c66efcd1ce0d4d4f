"""The runtime registry (``runtime_facts.py``): each runtime's facts declared once, in its module,
read by the matrix, ``cloud/`` and the sandbox; third-party runtimes read from entry points only
when a name is not built in."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest
from import_graph import recipes

from pytest_gpubench import runtime_facts
from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import parse_matrix
from pytest_gpubench.matrix.fields import runtime_name
from pytest_gpubench.matrix.launch import LaunchSpec, launch_problem, resolved
from pytest_gpubench.runtime_facts import BUILT_IN, ImageServer, RuntimeFacts, facts_of

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pytest_gpubench"
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


def test_no_module_but_the_registry_lists_runtime_names():
    """A second list of runtime names (``RUNTIME_NAMES``, ``SERVER_PER_CELL``, ``IMAGE_RUNTIMES`` once) would
    be a file a new runtime must touch: no literal outside ``runtime_facts.py`` holds two of them, but for
    tables of something else that shares their words."""
    others = {  # what shares the words, and why it is no list of runtimes
        "cloud/ssh_wait.py": "GPU Shopper's heavy-image patterns",
        "remote/loadgen.py": "the load generator's API protocols",
        "sandbox/entrypoint.py": "image patterns and the stand-in launcher each image runs",
        "sandbox/faults.py": "the instance's programs a fault may omit",
        "sandbox/openai_launchers.py": "the stand-in launchers' own programs",
    }
    listing = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "runtime_facts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                words = {item.value for item in items if isinstance(item, ast.Constant)} & set(BUILT_IN)
                if len(words) >= 2:
                    listing.add(where)
    assert listing == set(others)


def test_the_add_a_runtime_recipe_names_the_files_a_built_in_runtime_touches():
    """docs/architecture.md's "Add a runtime" (bench/architecture.py counts it): the runtime's module, its
    line in the registry and its docs; the toy runtime outside the package touches none of the package's."""
    files = recipes()["Add a runtime"]
    assert files == ["docs/runtimes.md", "pytest_gpubench/runtime_facts.py", "pytest_gpubench/runtimes/trtllm.py"]
    assert all((REPO / name).exists() for name in files if "trtllm" not in name)
    # Each built-in runtime is exactly such a module and such a line.
    for name, where in BUILT_IN.items():
        module = where.partition(":")[0]
        assert (REPO / (module.replace(".", "/") + ".py")).exists() and module.startswith("pytest_gpubench.runtimes.")
    toy = REPO / "tests" / "data" / "toy_runtime"
    assert sorted(p.name for p in toy.iterdir() if p.name != "__pycache__") == ["toy_runtime-0.dist-info",
                                                                                "toy_runtime.py"]
    assert "toy = toy_runtime:RUNTIME" in (toy / "toy_runtime-0.dist-info" / "entry_points.txt").read_text()
