"""The layout holds: no import cycle between the package's modules, only
``plugin/`` imports pytest, and imports point down the flow (docs/architecture.md).

Every import counts, at module level or inside a function: a lazy import that
closes a cycle still ties the two modules together. Imports under ``if
TYPE_CHECKING:`` do not: they name types for checkers and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_gpubench"
ROOT = "pytest_gpubench"
#: Imports only the plugin folder may make.
PYTEST_SIDE = ("pytest", "_pytest", "xdist", "pluggy", "pytest_timeout")
#: The flow, top-down ("" is the top-level modules): a folder imports its own
#: modules and those of folders before it in this list, never after.
FLOW = ("", "matrix", "cloud", "remote", "runtimes", "measure", "store", "report", "sandbox", "run", "plugin", "commands")
#: Imports against the flow that are still there, to be removed, never added to.
LAYERING_DEBT: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(package modules imported, top-level names of everything imported) by ``path``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, tops = set(), set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # ``from pkg import module`` imports the module; ``from module import name`` the module.
            targets = [f"{origin}.{alias.name}" for alias in node.names] + [origin]
        else:
            continue
        for target in targets:
            tops.add(target.split(".")[0])
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target != ROOT:
                inside.add(target)
    return inside, tops


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in _runtime_nodes_of(child))
            continue
        yield from _runtime_nodes_of(node)


def _runtime_nodes_of(node: ast.AST):
    yield node
    yield from _runtime_nodes(node)


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges, tops = {}, {}
    for name, path in paths.items():
        edges[name], tops[name] = imports_of(path, set(paths))
    return edges, tops


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    edges, _ = graph()
    assert cycles(edges) == []


def test_only_the_plugin_folder_imports_pytest():
    _, tops = graph()
    outside = sorted(name for name, imported in tops.items()
                     if imported & set(PYTEST_SIDE) and not name.startswith(f"{ROOT}.plugin"))
    assert outside == []


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def against_the_flow(edges: dict[str, set[str]]) -> set[str]:
    """``a -> b`` for each import of a folder later in :data:`FLOW` (package prefix dropped)."""
    found = set()
    for importer, imported in edges.items():
        if importer == ROOT:
            continue  # the public face (__init__) names things of every folder, on first use
        for target in imported:
            if FLOW.index(folder(target)) > FLOW.index(folder(importer)):
                found.add(f"{importer.split('.', 1)[1]} -> {target.split('.', 1)[1]}")
    return found


def test_imports_point_down_the_flow():
    edges, _ = graph()
    found = against_the_flow(edges)
    assert sorted(found - LAYERING_DEBT) == [], "an import against the flow (docs/architecture.md)"
    assert sorted(LAYERING_DEBT - found) == [], "paid off: remove it from LAYERING_DEBT"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
