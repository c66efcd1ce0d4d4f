"""The one error tree: every error the package raises on purpose is defined in
errors.py and drawn in its docstring (the sandbox, an emulated outside world, keeps
its own)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pytest_gpubench import errors

PACKAGE = Path(errors.__file__).parent
ELSEWHERE = ("sandbox",)  # the emulated cloud and its stand-ins: their errors are theirs


def test_no_error_class_is_defined_outside_errors_py():
    exception_names = {name for name, value in vars(errors).items()
                       if inspect.isclass(value) and issubclass(value, BaseException)}
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "errors.py" or relative.parts[0] in ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue  # a private class is control flow inside its module, not an error users meet
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if bases & (exception_names | {"Exception", "BaseException", "ValueError", "RuntimeError"}):
                found.append(f"{relative}: {node.name}")
    assert found == []


def test_every_error_is_drawn_in_the_tree_with_its_parent():
    tree = errors.__doc__
    for name, value in vars(errors).items():
        if inspect.isclass(value) and issubclass(value, errors.GpubenchError) and value is not errors.GpubenchError:
            assert f"── {name} " in tree, f"{name} is missing from errors.py's docstring"
            parent = next(base for base in value.__mro__[1:] if issubclass(base, errors.GpubenchError))
            # Drawn below its parent: the parent's line comes first.
            assert tree.index(f" {parent.__name__} ") < tree.index(f"── {name} ")


def test_every_stage_error_knows_its_stage():
    assert errors.BudgetRefused("cap").stage is errors.Stage.PROVISION
    assert errors.HostKeyChanged("h", 22, "SHA256:x").stage is errors.Stage.SSH_CONNECT
    assert errors.ThresholdMissed("slow").stage is errors.Stage.RESULTS
    assert errors.ResultsInvalid("NaN", Path("raw.json")).stage is errors.Stage.RESULTS
    assert errors.InstanceLost(errors.Stage.BENCHMARK, "gone").hint == errors.LOST_HINT
