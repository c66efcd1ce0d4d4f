"""The package's shape in figures: what issue 22 ("each concept in one room") measures.

    python bench/architecture.py

Prints, from the source alone (nothing is imported or run):

* modules in ``pytest_gpubench/`` besides the ``__init__`` files, their lines, and how many
  are under 40 lines;
* imports against the flow of docs/architecture.md (a folder importing one later in
  ``FLOW``) and module cycles, counting every import: at module level, inside a function
  and under ``if TYPE_CHECKING:``;
* the methods a new store implements (the ``Store`` protocol's public methods and properties);
* the files each "add a ..." recipe of docs/architecture.md names, once it has them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pytest_gpubench"
ROOT = PACKAGE.name
#: The flow, top-down ("" is the top-level modules), as tests/unit/test_import_graph.py has it.
FLOW = ("", "matrix", "cloud", "remote", "runtimes", "measure", "store", "report", "sandbox", "run", "plugin", "commands")
SMALL = 40


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every package module ``path`` imports, wherever the import statement is."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" for alias in node.names] + [origin]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, ROOT):
                found.add(target)
    return found


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def upward(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for importer, imported in sorted(edges.items()):
        if importer == ROOT or folder(importer) not in FLOW:
            continue
        for target in sorted(imported):
            if folder(target) in FLOW and FLOW.index(folder(target)) > FLOW.index(folder(importer)):
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


def store_methods() -> list[str]:
    """The public methods and properties of every ``Protocol`` class named ``Store`` in store/,
    with those of the package's protocols it extends (``GpuLeaseBook``): what a new store implements."""
    classes = {node.name: node for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}

    def methods(node: ast.ClassDef) -> list[str]:
        inherited = [name for base in node.bases if isinstance(base, ast.Name) and base.id in classes
                     for name in methods(classes[base.id])]
        return inherited + [item.name for item in node.body
                            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_")]

    names = []
    for path in sorted((PACKAGE / "store").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "Store":
                names += methods(node)
    return names


def recipes() -> dict[str, list[str]]:
    """The files each "Add a ..." section of docs/architecture.md names (backticked paths in its list)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"^#+ (Add an? [^\n]+)\n(.*?)(?=^#+ |\Z)", text, re.M | re.S):
        files = re.findall(r"^\s*(?:[-*]|\d+\.)\s.*?`([\w./-]+\.(?:py|toml|md|yaml|cfg))`", match.group(2), re.M)
        found[match.group(1).strip()] = sorted(set(files))
    return found


def main() -> int:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = {name: path for name, path in paths.items() if path.name != "__init__.py"}
    lines = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    small = sorted(name for name, count in lines.items() if count < SMALL)
    print(f"modules: {len(modules)} besides the __init__ files, {sum(lines.values())} lines; "
          f"{len(small)} under {SMALL} lines")
    edges = {name: imports_of(path, set(paths)) for name, path in paths.items()}
    against = upward(edges)
    print(f"imports against the flow (every import counted): {len(against)}")
    for line in against:
        print(f"  {line}")
    found = cycles(edges)
    print(f"module cycles: {len(found)}" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    methods = store_methods()
    print(f"Store protocol: {len(methods)} methods a new store implements")
    written = recipes()
    if not written:
        print("recipes: docs/architecture.md has no \"Add a ...\" section yet")
    for title, files in written.items():
        print(f"recipe \"{title}\": {len(files)} files: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
