"""What every tier shares: fixtures used in more than one tier, and the tiers themselves.

The tests live in three folders (README, "Tests"): ``unit/`` (the package's logic in
this process), ``plugin/`` (pytest running the plugin: pytester or a pytest
subprocess, no sandbox) and ``e2e/`` (anything on the sandbox; its fixtures are in
``e2e/conftest.py``). Each item gets its folder's marker, so ``-m "not e2e"`` works
as ``pytest tests/unit tests/plugin`` does. Shared helpers live in plain modules next
to this file (e2e_helpers.py, polling.py, ...): this folder is on ``sys.path`` for
every tier (pytest's default ``prepend`` import mode puts a rootless conftest's folder there).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

HERE = Path(__file__).parent
#: Folder -> marker, in the order the tiers start: the long end-to-end tests first, so
#: that under ``-n auto`` no worker is left alone with one at the end of the run.
TIERS = {"e2e": "end-to-end: runs on the sandbox (its API, instances or stand-in programs)",
         "plugin": "pytest runs the plugin (pytester or a pytest subprocess), no sandbox",
         "unit": "the package's logic in this process"}


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")


def tier_of(item: pytest.Item) -> str | None:
    """The tier folder ``item`` lives in, if it is one of this suite's tests."""
    try:
        relative = Path(item.path).relative_to(HERE)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier; start the slow tests, e2e before the rest, first.

    xdist hands the first quarter of the tests out round robin and the rest on demand:
    long tests at the front are spread over the workers, short ones fill the end. The
    sort is stable, so a module's tests stay together and in their order.
    """
    rank = {tier: position for position, tier in enumerate(TIERS)}
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)

    def start_order(item: pytest.Item) -> tuple[int, int]:
        return (0 if item.get_closest_marker("slow") else 1, rank.get(tier_of(item), len(rank)))

    items.sort(key=start_order)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): an API that never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
