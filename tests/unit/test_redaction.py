"""Credentials in store URLs: hidden in every message (``redact``) and in the stored ``runs.argv``
(the git store's ``Remote`` keeps them out of git's URL: tests/unit/test_git_store.py)."""

from __future__ import annotations

import json

import pytest

from pytest_gpubench.errors import redact
from pytest_gpubench.store.manifest import run_row


@pytest.mark.parametrize(("location", "shown"), [
    # user:password: the user stays, the password goes, whatever characters it holds.
    ("postgresql://bench:s3cret@db:5432/gpubench", "postgresql://bench:***@db:5432/gpubench"),
    ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p:ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p%40s%2Fs@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p?ss#x@h/db", "postgresql://u:***@h/db"),
    ("git+https://user:ghp_TOKEN@github.com/o/r.git", "git+https://user:***@github.com/o/r.git"),
    # A lone user name: a token on http(s) and git URLs, an account name for PostgreSQL and ssh.
    ("git+https://ghp_TOKEN@github.com/o/r.git", "git+https://***@github.com/o/r.git"),
    ("git+http://glpat-TOKEN@gitlab.local/r.git", "git+http://***@gitlab.local/r.git"),
    ("https://ghp_TOKEN@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("postgresql://bench@db/gpubench", "postgresql://bench@db/gpubench"),
    ("postgres://bench@db/gpubench", "postgres://bench@db/gpubench"),
    ("git+ssh://git@github.com/o/r.git", "git+ssh://git@github.com/o/r.git"),
    # Secret query parameters, any case; the others stay.
    ("postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?password=***"),
    ("postgresql://h/db?sslmode=require&PASSWORD=s3cret&x=1", "postgresql://h/db?sslmode=require&PASSWORD=***&x=1"),
    ("postgresql://h/db?sslpassword=s3cret", "postgresql://h/db?sslpassword=***"),
    ("git+https://h/r.git?Token=s3cret#main", "git+https://h/r.git?Token=***#main"),
    ("postgresql://u:s3cret@h/db?password=s3cret", "postgresql://u:***@h/db?password=***"),
    # Nothing secret: unchanged.
    ("reports/manifest.db", "reports/manifest.db"),
    ("/srv/a@b:c/manifest.db", "/srv/a@b:c/manifest.db"),
    ("git+file:///srv/results.git", "git+file:///srv/results.git"),
    ("git+https://h/o/r@v2.git", "git+https://h/o/r@v2.git"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),
    ("http://[::1", "http://[::1"),
    # URLs inside a message or an option.
    ("--gpubench-store=postgresql://u:s3cret@db/g", "--gpubench-store=postgresql://u:***@db/g"),
    ("fatal: unable to access 'https://ghp_TOKEN@h/r.git/': 403", "fatal: unable to access 'https://***@h/r.git/': 403"),
    ("from postgresql://a:x@h/d to postgresql://b:y@h/d", "from postgresql://a:***@h/d to postgresql://b:***@h/d"),
])
def test_redact_hides_every_credential_form(location, shown):
    assert redact(location) == shown


@pytest.mark.parametrize("argv", [
    ["matrix/", "--gpubench-store=postgresql://u:s3cret@db/g"],
    ["matrix/", "--gpubench-store", "postgresql://u:s3cret@db/g"],
    ["matrix/", "--gpubench-store", "git+https://s3cret@github.com/o/r.git"],
    ["matrix/", "--gpubench-store", "postgresql://u@db/g?password=s3cret"],
])
def test_the_stored_argv_holds_no_password(argv):
    row = run_row("run-1", argv, [], owner=None, api=None, sandbox=None)
    stored = json.loads(row["argv"])
    assert "s3cret" not in row["argv"] and len(stored) == len(argv) and stored[0] == "matrix/"
    assert "***" in stored[-1]
