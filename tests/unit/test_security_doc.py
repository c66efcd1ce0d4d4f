"""docs/security.md names the tests that hold each of its rules: every one must exist.

A rule whose test was renamed or removed would otherwise point at nothing, and the
threat model would claim a guard the suite no longer has.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECURITY = REPO / "docs" / "security.md"
#: ``tests/...py`` alone, or ``tests/...py::test_name``; a parameter id in brackets is not part of the name.
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?(?:\[[^\]`]*\])?`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_threat_model_names_exists() -> None:
    references = REFERENCE.findall(SECURITY.read_text(encoding="utf-8"))
    assert len(references) >= 40, "docs/security.md should name the tests that hold its rules"
    missing = []
    for file, name in references:
        path = REPO / file
        if not path.is_file():
            missing.append(file)
        elif name and name not in _test_names(path):
            missing.append(f"{file}::{name}")
    assert missing == [], "docs/security.md names tests that do not exist"
