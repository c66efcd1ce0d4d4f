"""The layout holds: no import cycle between the package's modules, only ``plugin/``
imports pytest, and imports point down the flow (docs/architecture.md).

Every import counts, at module level, inside a function or under ``if TYPE_CHECKING:``
(``tests/import_graph.py``, which ``bench/architecture.py`` prints from too). No import
against the flow is allowed, none is listed as debt.
"""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import (FLOW, PYTEST_SIDE, ROOT, against_the_flow, cycles, folder, folder_graph_text, graph,
                          imports_of)

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_no_import_cycle():
    edges, _ = graph()
    assert cycles(edges) == []


def test_only_the_plugin_folder_imports_pytest():
    _, tops = graph()
    outside = sorted(name for name, imported in tops.items()
                     if imported & set(PYTEST_SIDE) and not name.startswith(f"{ROOT}.plugin"))
    assert outside == []


def test_imports_point_down_the_flow():
    edges, _ = graph()
    assert against_the_flow(edges) == [], "an import against the flow (docs/architecture.md)"


def test_every_folder_is_in_the_flow():
    edges, _ = graph()
    folders = {name.split(".")[1] for name in edges if name.count(".") >= 2}
    assert sorted(folders - set(FLOW)) == [], "a new folder needs its place in FLOW (tests/import_graph.py)"


def test_every_kind_of_import_counts(tmp_path: Path):
    package = tmp_path / ROOT
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    for name in ("low/__init__.py", "high/__init__.py", "high/a.py", "high/b.py", "high/c.py"):
        (package / name).write_text("")
    (package / "low" / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..high.a import A\n"
        "def f():\n    from ..high import b\n"
        "import pytest_gpubench.high.c\n"
    )
    modules = {f"{ROOT}.low", f"{ROOT}.high", f"{ROOT}.high.a", f"{ROOT}.high.b", f"{ROOT}.high.c", f"{ROOT}.low.mod"}
    inside, tops = imports_of(package / "low" / "mod.py", modules, package)
    assert inside == {f"{ROOT}.high.a", f"{ROOT}.high.b", f"{ROOT}.high.c", f"{ROOT}.high"}
    assert "typing" in tops


def test_a_folder_s_init_is_in_that_folder():
    assert folder(f"{ROOT}.sandbox") == "sandbox"  # ``from ..sandbox import X`` imports sandbox/
    assert folder(f"{ROOT}.sandbox.catalog") == "sandbox"
    assert folder(f"{ROOT}.errors") == ""
    assert against_the_flow({f"{ROOT}.matrix.x": {f"{ROOT}.sandbox"}}) == ["matrix.x -> sandbox"]


def test_the_flow_check_finds_an_upward_import():
    edges = {f"{ROOT}.cloud.x": {f"{ROOT}.run.y"}, f"{ROOT}.run.y": {f"{ROOT}.cloud.x", f"{ROOT}.errors"},
             ROOT: {f"{ROOT}.commands.cli"}}
    assert against_the_flow(edges) == ["cloud.x -> run.y"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_documented_folder_graph_is_the_code_s():
    """docs/architecture.md's folder graph is generated: ``python bench/architecture.py --folders``."""
    edges, _ = graph()
    found = re.search(r"<!-- folder graph: python bench/architecture.py --folders -->\n```\n(.*?)\n```",
                      DOC.read_text(), re.S)
    assert found, "docs/architecture.md lost its folder graph block"
    assert found.group(1) == folder_graph_text(edges), "run python bench/architecture.py --folders and paste it"
