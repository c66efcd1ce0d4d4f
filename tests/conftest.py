"""Fixtures shared by the sandbox tests: one emulated GPU Shopper per test module."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pytest_gpubench.sandbox import SandboxThread

DEFAULT_TIME_SCALE = 0.01


@pytest.fixture(scope="module")
def sandbox(request: pytest.FixtureRequest) -> Iterator[SandboxThread]:
    """A sandbox on a free loopback port for this module's tests, at the module's
    ``TIME_SCALE`` (default 0.01: a 5-minute wait takes 3 s)."""
    with SandboxThread(time_scale=getattr(request.module, "TIME_SCALE", DEFAULT_TIME_SCALE)) as running:
        yield running


@pytest.fixture(scope="module")
def api(sandbox: SandboxThread) -> Iterator[httpx.Client]:
    """An HTTP client for :func:`sandbox`."""
    with httpx.Client(base_url=sandbox.url, timeout=30) as client:
        yield client
