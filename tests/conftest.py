"""What every tier shares: fixtures used in more than one tier, and the tiers themselves.

The tests live in four folders (README, "Tests"): ``unit/`` (the package's logic in
this process), ``plugin/`` (pytest running the plugin: pytester or a pytest
subprocess, no sandbox), ``e2e/`` (anything on the sandbox; its fixtures are in
``e2e/conftest.py``) and ``gpu/`` (``cloud: local`` on a real NVIDIA GPU; skipped
without one, see ``gpu/conftest.py``). Each item gets its folder's marker, so
``-m "not e2e"`` works as ``pytest tests/unit tests/plugin tests/gpu`` does. Shared helpers live in plain modules next
to this file (e2e_helpers.py, polling.py, ...): this folder is on ``sys.path`` for
every tier (under pytest's default ``prepend`` import mode, the folder of a conftest.py that is
in no package goes on ``sys.path``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore  # noqa: F401 - imported before any in-process pytester run: see below
import pytest

# httpcore is imported above, before any test runs, so that it is in every pytester snapshot.
# httpx imports it on first use (a transport's __init__) and caches the map from httpcore's
# exceptions to its own at the first request. When that first use fell inside an in-process
# pytester run, pytester dropped httpcore from sys.modules afterwards while httpx stayed: the
# next transport imported a new httpcore whose ConnectError the cached map did not know, and a
# raw httpcore.ConnectError escaped ShopperClient (test_runners_plugin.py under -n 2).

# A real PostgreSQL server for the store's tests (postgres_server, postgres_url).
pytest_plugins = ["postgres_server"]

HERE = Path(__file__).parent
#: Where the suite keeps compiled bytecode when the machine says not to write it (:func:`pytest_configure`).
BYTECODE_CACHE = HERE.parent / ".pytest_cache" / "bytecode"

#: Pytest plugins kept out of the pytest processes the tests start (hundreds: every pytest
#: run on the sandbox, and its xdist workers), for the CPU they cost in each. Third-party ones an
#: environment may autoload that no test here uses: on this 2-core machine a pytest process
#: collecting a matrix took 1.67 s of CPU with hypothesis's, anyio's and pytest-benchmark's
#: plugins loaded and 0.48 s without them (blocking one that is not installed is harmless).
#: And pytest's own ``unraisableexception``, whose end of session runs five full garbage
#: collections to find unraisable exceptions: 0.27 s of CPU in a one-cell sandbox run, in every
#: process. No test reads those warnings from a child's output; this process keeps the plugin.
CHILD_BLOCKED_PLUGINS = ("hypothesispytest", "anyio", "benchmark", "unraisableexception")
#: The tier folders, each its marker (registered in pyproject.toml), in the order they
#: are collected: the long end-to-end tests first, so that under ``-n auto`` no worker
#: is left alone with one at the end of the run (the GPU tier's, where it runs, longest).
TIERS = ("gpu", "e2e", "plugin", "unit")


def tier_of(item: pytest.Item) -> str | None:
    """The tier folder ``item`` lives in, if it is one of this suite's tests."""
    try:
        relative = Path(item.path).relative_to(HERE)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, and collect the e2e tier first (the sort is stable:
    a module's tests stay together, in their order)."""
    rank = {tier: position for position, tier in enumerate(TIERS)}
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)
    items.sort(key=lambda item: rank.get(tier_of(item), len(rank)))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``-n auto`` without a ``--dist`` of the caller's: xdist's ``worksteal`` schedule.

    ``load`` hands out fixed runs of tests by count: the ~45 slow e2e tests, a few
    percent of the suite and two thirds of its time, end up in one worker's share
    while the other finishes early and idles (824 s against 505 s of work per worker,
    simulated with measured durations; 826 s measured). ``worksteal`` splits the
    collection in halves and lets an idle worker take half of the other's queue, so
    with the long e2e tests collected first both workers finish together.
    """
    chosen = config.getoption("distload") or any(arg == "--dist" or arg.startswith("--dist=")
                                                  for arg in config.invocation_params.args)
    if config.getoption("dist") != "load" or chosen:
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: four workers more than the cores this process may use.

    The e2e tests spend more than half their time waiting on the sandbox's clock
    (provisioning, installs, benchmark windows): with one worker per core the two
    cores of the CI machine were 44% busy and the suite took 504 s; with three
    workers 389 s. With issue 11's runtimes (1,626 tests) three workers kept the cores
    55% busy for 551 s, four took 474 s. With issue 12's hosts, microbenchmarks and
    multi-GPU cells (1,793 tests) four workers took 582 s with the cores 66% busy, six 504 s.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` and an explicit ``-n N`` still win.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 4


def pytest_configure(config: pytest.Config) -> None:
    """Compiled bytecode kept, in one cache, even where this machine says not to write it.

    Some machines (this one and, likely, this project's CI) set ``PYTHONDONTWRITEBYTECODE`` for
    every process. Then each of the suite's hundreds of Python processes compiled every module it
    imported from source, and pytest rewrote the assertions of every test module and of the
    plugin's modules anew in each: collecting the suite took 9.3 CPU s per xdist worker instead of
    2.8, and compiling took a third of the CPU of the processes the tests start. Set here, before
    ``-n`` starts its workers, so that they and every process the tests start share one cache
    (``PYTHONPYCACHEPREFIX``) in ``.pytest_cache/bytecode``, kept from run to run; nothing is
    written beside the sources.
    """
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTEST_XDIST_WORKER"):
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = str(BYTECODE_CACHE)


@pytest.fixture(scope="session", autouse=True)
def _child_processes_environment() -> Iterator[None]:
    """The environment of the processes the tests start (pytest runs, their xdist workers, the
    sandbox, the ``gpubench`` commands), set for them, not for this one: :data:`CHILD_BLOCKED_PLUGINS`
    blocked in every pytest process.

    Set here, not when this file is imported: the controller of ``-n`` imports it before it
    starts its workers, which read ``PYTEST_ADDOPTS`` too. Workers without anyio's plugin (which
    imports anyio at start) failed four e2e tests under ``-n 6``: anyio's ``EndOfStream`` escaped
    httpcore's ``except anyio.EndOfStream``, as when anyio is imported twice (likely: first inside
    a pytester test, whose ``sys.modules`` snapshot then drops it). The workers stay as they were.
    """
    with pytest.MonkeyPatch.context() as patch:
        before = os.environ.get("PYTEST_ADDOPTS")
        patch.setenv("PYTEST_ADDOPTS", " ".join(
            [before or "", *(f"-p no:{name}" for name in CHILD_BLOCKED_PLUGINS)]).strip())
        yield


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): an API that never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium of the test's own (``chromium.ChromiumProcess``), ended in teardown. Without
    one the test skips, or fails where GPUBENCH_REQUIRE_CHROMIUM=1 says it must run (CI installs it)."""
    from chromium import ChromiumProcess, find_chromium  # aiohttp: only for the tests that drive a browser

    executable = find_chromium()
    if executable is None:
        if os.environ.get("GPUBENCH_REQUIRE_CHROMIUM") == "1":
            pytest.fail("GPUBENCH_REQUIRE_CHROMIUM=1 but there is no chromium on this machine")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    process = ChromiumProcess(executable, tmp_path / "chromium-profile")
    yield process
    process.stop()
