"""What every tier shares: fixtures used in more than one tier, and the tiers themselves.

The tests live in three folders (README, "Tests"): ``unit/`` (the package's logic in
this process), ``plugin/`` (pytest running the plugin: pytester or a pytest
subprocess, no sandbox) and ``e2e/`` (anything on the sandbox; its fixtures are in
``e2e/conftest.py``). Each item gets its folder's marker, so ``-m "not e2e"`` works
as ``pytest tests/unit tests/plugin`` does. Shared helpers live in plain modules next
to this file (e2e_helpers.py, polling.py, ...): this folder is on ``sys.path`` for
every tier (under pytest's default ``prepend`` import mode, the folder of a conftest.py that is
in no package goes on ``sys.path``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

HERE = Path(__file__).parent
#: The tier folders, each its marker (registered in pyproject.toml), in the order they
#: are collected: the long end-to-end tests first, so that under ``-n auto`` no worker
#: is left alone with one at the end of the run.
TIERS = ("e2e", "plugin", "unit")


def tier_of(item: pytest.Item) -> str | None:
    """The tier folder ``item`` lives in, if it is one of this suite's tests."""
    try:
        relative = Path(item.path).relative_to(HERE)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, and collect the e2e tier first.

    Under ``-n auto`` xdist's ``load`` schedule hands each worker a contiguous quarter
    of its share of the collection first and the rest on demand, so the long e2e tests
    start early on both workers and the short unit tests fill the end. (Putting every
    ``slow`` test first is worse: they all land in the first worker's first chunk.)
    The sort is stable: a module's tests stay together, in their order.
    """
    rank = {tier: position for position, tier in enumerate(TIERS)}
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)
    items.sort(key=lambda item: rank.get(tier_of(item), len(rank)))


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): an API that never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
