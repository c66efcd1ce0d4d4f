"""The package's shape in figures: what issue 22 ("each concept in one room") measures.

    python bench/architecture.py             # the figures
    python bench/architecture.py --folders   # the folder graph docs/architecture.md shows

Prints, from the source alone (nothing is imported or run):

* modules in ``pytest_gpubench/`` besides the ``__init__`` files, their lines, and how many
  are under 40 lines;
* imports against the flow of docs/architecture.md (a folder importing one later in
  ``FLOW``) and module cycles, counting every import: at module level, inside a function
  and under ``if TYPE_CHECKING:`` (``tests/import_graph.py``, the implementation
  ``tests/unit/test_import_graph.py`` checks with);
* the methods a new store implements: the ``Store`` protocol's public methods and properties
  without a body of their own (a docstring or ``...`` only); those with one are shared rules a
  store inherits;
* the files each "add a ..." recipe of docs/architecture.md names, once it has them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]  # the import graph's one implementation, shared with its test

from import_graph import PACKAGE, against_the_flow, cycles, folder_graph_text, graph, module_name  # noqa: E402

SMALL = 40


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
    text = (REPO / "docs" / "architecture.md").read_text()
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"^#+ (Add an? [^\n]+)\n(.*?)(?=^#+ |\Z)", text, re.M | re.S):
        files = re.findall(r"^\s*(?:[-*]|\d+\.)\s.*?`([\w./-]+\.(?:py|toml|md|yaml|cfg))`", match.group(2), re.M)
        found[match.group(1).strip()] = sorted(set(files))
    return found


def main() -> int:
    edges, _ = graph()
    if sys.argv[1:] == ["--folders"]:
        print(folder_graph_text(edges))
        return 0
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = {name: path for name, path in paths.items() if path.name != "__init__.py"}
    lines = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    small = sorted(name for name, count in lines.items() if count < SMALL)
    print(f"modules: {len(modules)} besides the __init__ files, {sum(lines.values())} lines; "
          f"{len(small)} under {SMALL} lines")
    against = against_the_flow(edges)
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
