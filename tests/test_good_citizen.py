"""The plugin in other people's pytest runs: --help, option names, no phantom runs, load cost.

Each test runs pytest on a project of its own (``pytester``, in a subprocess where
the plugin's load matters) with the plugin installed as it is for every user.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from e2e_helpers import REPO


@pytest.mark.slow
def test_fixtures_over_the_repository_tests_lists_them_without_an_internal_error():
    """No test module re-imports another's fixture: pytest would see one fixture twice."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "tests/", "-p", "no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "INTERNALERROR" not in done.stdout + done.stderr
    assert "standalone_sandbox" in done.stdout  # the shared fixtures are listed, from conftest.py
    assert "tests/conftest.py" in done.stdout


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py and helpers in plain modules: a test module
    imported by another is collected twice over, its fixtures defined twice."""
    offenders = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name} imports {name}" for name in names if name.split(".")[-1].startswith("test_")]
    assert offenders == []
