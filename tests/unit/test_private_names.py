"""Only the adapters touch the private names of pytest, pytest-xdist and pydantic.

plugin/internals.py holds every private name of pytest and pytest-xdist the plugin
touches, matrix/prototype.py pydantic's; each lists them in its ``PRIVATE_NAMES`` and
``tests/plugin/test_internals_contract.py`` pins them against the installed versions.
This scan (of the source, every import counted, ``TYPE_CHECKING`` ones too) catches:

* a listed name (``_setupstate``, ``_fixtureinfo``, ``item_index``, ``WorkerInteractor``,
  ``assigned_work``, ``__pydantic_fields_set__``, ...) used anywhere but its adapter, as an
  attribute, an imported name or a string (so ``getattr(x, "_fixtureinfo")`` and a class
  name compared as text count), and any ``__pydantic_*`` name outside prototype.py;
* an import of ``_pytest`` or of an ``xdist`` module anywhere but plugin/internals.py, and
  of pydantic's or pydantic-core's private modules anywhere;
* an attribute starting with ``_`` that the package defines nowhere (no def, class,
  assignment, argument or import of that name): a private name of someone else's, unless
  :data:`FOREIGN_ALLOWED` explains it.

What it misses: a foreign private name that the package happens to define too (the torch
stand-in defines ``_int_mm``, so ``torch._int_mm`` in remote/microbench_script.py passes),
and a private object reached without naming it (``vars(item)["_fixtureinfo"]`` counts as a
string; ``getattr(item, "_" + "x")`` does not).
"""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_gpubench.matrix import prototype
from pytest_gpubench.plugin import internals

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_gpubench"
PYTEST_ADAPTER = PACKAGE / "plugin" / "internals.py"
PYDANTIC_ADAPTER = PACKAGE / "matrix" / "prototype.py"
#: Private names of other libraries the package uses outside the adapters, and why.
FOREIGN_ALLOWED = {
    "_exit": "os._exit: documented, the way a forked or doomed process ends at once",
    "_SubParsersAction": "argparse: the type of add_subparsers()'s result, which has no public name (annotation)",
    "_transport": "asyncssh, in the sandbox's fault injection (sandbox/sshd.py): silencing a connection "
                  "without closing it has no public way; never in a real run",
}


def modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def names_used(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every attribute, imported name and string constant of ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.alias):
            found.append((getattr(node, "lineno", 0), node.name.rpartition(".")[2]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return found


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{line}"


def test_only_the_adapters_touch_the_private_names_they_list():
    owners = {name: PYTEST_ADAPTER for name in internals.PRIVATE_NAMES}
    owners.update({name: PYDANTIC_ADAPTER for name in prototype.PRIVATE_NAMES})
    found = []
    for path, tree in modules().items():
        for line, name in names_used(tree):
            owner = owners.get(name, PYDANTIC_ADAPTER if name.startswith("__pydantic_") else None)
            if owner is not None and owner != path:
                found.append(f"{where(path, line)}: {name} (go through {owner.relative_to(PACKAGE.parent)})")
    assert found == []


def test_only_the_adapter_imports_pytest_s_and_xdist_s_modules():
    found = []
    for path, tree in modules().items():
        for line, module in imported_modules(tree):
            top = module.split(".")[0]
            if (top in ("_pytest", "xdist") and path != PYTEST_ADAPTER) or module.startswith(
                    ("pydantic._", "pydantic_core._")):
                found.append(f"{where(path, line)}: import {module}")
    assert found == []


def defined_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name the package defines or binds somewhere: its own private names."""
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                own.add(node.attr)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
    return own


def foreign_privates(tree: ast.AST, own: set[str]) -> list[tuple[int, str]]:
    """(line, text) of each ``x._name`` in ``tree`` whose ``_name`` is not in ``own``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        name = node.attr
        if name.startswith("__") and name.endswith("__") and not name.startswith("__pydantic_"):
            continue  # Python's own (__dict__, __name__, ...)
        if name not in own and name not in FOREIGN_ALLOWED:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_other_module_touches_a_private_name_the_package_does_not_define():
    trees = modules()
    own = defined_names(trees)
    found = [f"{where(path, line)}: {text}" for path, tree in trees.items()
             if path not in (PYTEST_ADAPTER, PYDANTIC_ADAPTER) for line, text in foreign_privates(tree, own)]
    assert found == []


def test_the_scan_sees_what_it_is_meant_to_catch():
    """The rules above, on a module that breaks each of them."""
    bad = ast.parse("import _pytest.runner\nfrom xdist.remote import WorkerInteractor\n"
                    "item.session._setupstate.teardown_exact(None)\nx = getattr(item, '_fixtureinfo')\n"
                    "object.__setattr__(m, '__pydantic_fields_set__', s)\nconfig._inicache.clear()\n"
                    "class Own:\n    def f(self):\n        self._mine = other._mine\n")
    assert {name for _, name in names_used(bad)} >= {"_setupstate", "_fixtureinfo", "WorkerInteractor",
                                                      "__pydantic_fields_set__"}
    assert [module for _, module in imported_modules(bad)] == ["_pytest.runner", "xdist.remote"]
    assert [text for _, text in foreign_privates(bad, defined_names({PACKAGE: bad}))] == [
        "item.session._setupstate", "config._inicache"]
