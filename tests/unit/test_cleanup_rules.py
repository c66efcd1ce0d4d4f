"""Cleanup's rules on what a store row says (run/cleanup.py), without any API: issue 21 item 2's
"the same API" and the lines that show a row's URL."""

from __future__ import annotations

import pytest

from pytest_gpubench.run.cleanup import same_api, shown_url


@pytest.mark.parametrize(("a", "b"), [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080/"),
    ("HTTP://Shopper.Example/api", "http://shopper.example/api/"),
    ("https://shopper.example", "https://shopper.example:443"),
    ("http://shopper.example", "http://shopper.example:80"),
    ("https://alice:***@shopper.example", "https://alice:s3cret@shopper.example"),  # stored redacted
    (None, "http://anything"),
])
def test_the_same_api(a, b):
    assert same_api(a, b) and same_api(b, a)


@pytest.mark.parametrize(("a", "b"), [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8081"),
    ("http://shopper.example", "https://shopper.example"),
    ("http://shopper.example/a", "http://shopper.example/b"),
    ("http://shopper.example", "http://shopper.example.evil.test"),
    ("http://shopper.example@evil.test", "http://shopper.example"),
])
def test_another_api(a, b):
    assert not same_api(a, b)


def test_a_rows_url_is_shown_redacted_on_one_line():
    assert shown_url("http://bob:pw@host:9/x\x1b[2J\n") == "http://bob:***@host:9/x[2J"
