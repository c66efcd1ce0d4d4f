"""The test suite's own layout: every test module in a tier, no two with one name, and
the bounds on its time (README, "Tests")."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "plugin", "e2e", "gpu")


def test_every_test_module_is_in_a_tier_and_no_two_share_a_name():
    modules = sorted(TESTS.rglob("test_*.py"))
    outside = [str(path.relative_to(TESTS)) for path in modules if path.parent.name not in TIERS
               or path.parent.parent != TESTS]
    assert outside == []
    # Under pytest's default "prepend" import mode a module is imported by its file name:
    # a second test_x.py in another tier would fail to import.
    twice = [name for name, count in Counter(path.name for path in modules).items() if count > 1]
    assert twice == []
    assert not any((TESTS / tier / "__init__.py").exists() for tier in TIERS)


def test_each_tier_has_its_marker_and_the_suite_a_time_bound():
    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = {line.split(":", 1)[0] for line in ini["markers"]}
    assert set(TIERS) <= markers
    assert ini["timeout"] < ini["session_timeout"] <= 3600
    assert "addopts" not in ini  # the README's `python -m pytest -n auto` stays the whole command
