"""Waiting on events in tests: poll with a generous deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Call ``predicate`` until it returns something truthy and return that; fail
    with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
