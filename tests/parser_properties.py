"""What the property-based tests of the parsers that take outside input share (issue 21).

Every parser of a file, an API answer or a stream that someone else writes must end in
one of two ways on any input: a clean result, or one of the project's own errors in one
line that names the file or field. Never another exception type, a traceback or a hang.

The settings are fixed so that CI is deterministic (``derandomize``: the same examples on
every run, no example database) and the whole set stays fast: a modest number of examples
each, and a deadline per example. The deadline is generous because this runs on a shared
2-core machine; a real hang is caught by :func:`within`, which interrupts the example.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from hypothesis import HealthCheck, settings

#: The settings of every parser property: deterministic, no database, a deadline per example.
PARSER_SETTINGS = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=False,
)

#: Seconds one parse may take before it counts as a hang.
HANG_SECONDS = 10.0


class Hang(AssertionError):
    """A parse that did not return within :data:`HANG_SECONDS`."""


@contextmanager
def within(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Fail with :class:`Hang` when the block runs longer than ``seconds`` (SIGALRM: the
    main thread, as pytest runs tests; a loop in Python code is interrupted). A RecursionError
    out of the block fails as a short AssertionError: formatting its thousand-frame traceback
    crashed pytest-xdist's worker (INTERNALERROR) instead of reporting the failure."""
    def expired(signum: int, frame: object) -> None:
        raise Hang(f"the parser did not return within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except RecursionError as exc:
        raise AssertionError(f"RecursionError out of the parser: {exc}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_line(message: str, *names: str) -> None:
    """An error a person reads: one line, naming each of ``names`` (the file, the field)."""
    assert message.strip(), "an empty error message"
    assert "\n" not in message and "\r" not in message, f"more than one line: {message!r}"
    assert "Traceback" not in message, message
    for name in names:
        assert name in message, f"{name!r} is not named in {message!r}"
