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

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]  # the shape's one implementation, shared with the tests

from import_graph import (PACKAGE, against_the_flow, cycles, folder_graph_text, graph, module_name,  # noqa: E402
                          recipes, store_methods)

SMALL = 40


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
