"""The package's import graph and shape, read from the source alone (nothing is imported or run).

One implementation for the two that need it: the tests check the layout, the store protocol's
size and the "Add a ..." recipes with it (``tests/unit/test_import_graph.py``,
``test_store_contract.py``, ``test_provider_registry.py``, ``test_runtime_facts.py``);
``bench/architecture.py`` prints the figures and the folder graph that docs/architecture.md shows.

Every import counts, wherever its statement is: at module level, inside a function (a
lazy import still ties the two modules together) and under ``if TYPE_CHECKING:`` (a
type a lower layer names belongs to that layer, or below it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_gpubench"
ROOT = PACKAGE.name
#: Imports only the plugin folder may make.
PYTEST_SIDE = ("pytest", "_pytest", "xdist", "pluggy", "pytest_timeout")
#: The flow, bottom-up ("" is the top-level modules): a folder imports its own modules
#: and those of folders before it in this list, never after (docs/architecture.md).
FLOW = ("", "matrix", "cloud", "remote", "runtimes", "measure", "store", "sandbox", "run", "report", "plugin",
        "commands")


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``pytest_gpubench.run.record`` for ``pytest_gpubench/run/record.py`` (a package: its folder)."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = PACKAGE) -> tuple[set[str], set[str]]:
    """(package modules imported, top-level names of everything imported) by ``path``, a
    module of the package at ``root``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, tops = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
            if target and target not in (name, ROOT):
                inside.add(target)
    return inside, tops


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(package modules each module imports, top-level names each imports), by module name."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges, tops = {}, {}
    for name, path in paths.items():
        edges[name], tops[name] = imports_of(path, set(paths))
    return edges, tops


def folder(module: str) -> str:
    """The folder of a module under the package ("" for a top-level module). A folder's
    ``__init__`` (``pytest_gpubench.sandbox``) is in that folder: ``from ..sandbox import X``
    imports sandbox/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOW[1:]) else ""


def against_the_flow(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` (package prefix dropped) for each import of a folder later in :data:`FLOW`.

    The package's ``__init__`` is left out: the public face names things of every folder,
    each imported on first use."""
    found = []
    for importer, imported in sorted(edges.items()):
        if importer == ROOT:
            continue
        for target in sorted(imported):
            if FLOW.index(folder(target)) > FLOW.index(folder(importer)):
                found.append(f"{importer.split('.', 1)[1]} -> {target.split('.', 1)[1]}")
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def folder_graph(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each folder of :data:`FLOW` and the other folders its modules import, in flow order."""
    found: dict[str, set[str]] = {name: set() for name in FLOW}
    for importer, imported in edges.items():
        if importer == ROOT:
            continue
        for target in imported:
            if folder(target) != folder(importer):
                found[folder(importer)].add(folder(target))
    return {name: sorted(found[name], key=FLOW.index) for name in FLOW}


def folder_graph_text(edges: dict[str, set[str]]) -> str:
    """:func:`folder_graph` as docs/architecture.md shows it: one line per folder in flow
    order with what it imports (``.`` is the top-level modules), so that each line names
    only folders on the lines above it."""
    def shown(name: str) -> str:
        return f"{name}/" if name else "."

    graph_ = folder_graph(edges)
    width = max(len(shown(name)) for name in FLOW)
    lines = [f"{shown(name):<{width}}  -> {', '.join(shown(t) for t in graph_[name]) or '(nothing)'}"
             for name in FLOW]
    return "\n".join(line.rstrip() for line in lines)


def store_methods() -> list[str]:
    """The public methods and properties of every ``Protocol`` class named ``Store`` in store/, with
    those of the package's protocols it extends (``GpuLeaseBook``), that have no body of their own
    (only a docstring or ``...``): what a new store implements. One defined again lower down (a
    default ``Store`` gives a method of ``GpuLeaseBook``) counts as that definition says."""
    classes = {node.name: node for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}

    def abstract(item: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        body = [stmt for stmt in item.body
                if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))]
        return all(isinstance(stmt, ast.Pass) for stmt in body)

    def methods(node: ast.ClassDef) -> dict[str, bool]:
        found: dict[str, bool] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                found.update(methods(classes[base.id]))
        found.update({item.name: abstract(item) for item in node.body
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_")})
        return found

    names = []
    for path in sorted((PACKAGE / "store").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "Store":
                names += [name for name, implemented_by_store in methods(node).items() if implemented_by_store]
    return names


def recipes() -> dict[str, list[str]]:
    """The files each "Add a ..." section of docs/architecture.md names (backticked paths in its list)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"^#+ (Add an? [^\n]+)\n(.*?)(?=^#+ |\Z)", text, re.M | re.S):
        files = re.findall(r"^\s*(?:[-*]|\d+\.)\s.*?`([\w./-]+\.(?:py|toml|md|yaml|cfg))`", match.group(2), re.M)
        found[match.group(1).strip()] = sorted(set(files))
    return found
