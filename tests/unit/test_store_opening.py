"""store/opening.py: the one door to a store, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.errors import UsageProblem
from pytest_gpubench.store.base import Store
from pytest_gpubench.store.opening import open_store, store_exists


def test_a_path_opens_a_sqlite_store_created_on_first_use(tmp_path):
    where = tmp_path / "reports" / "manifest.db"
    assert not store_exists(where)
    with open_store(where) as store:
        assert isinstance(store, Store)
        store.start_run("r1", ["pytest"], [])
        assert store.location == str(where)
    assert store_exists(where)
    with open_store(str(where)) as again:
        assert again.run_ids() == ["r1"]


@pytest.mark.parametrize("url", ["mysql://bench@db/gpubench", "sqlite:///x.db", "s3://bucket/m.db"])
def test_a_url_is_refused_with_what_is_supported_and_nothing_is_created(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    for look in (store_exists, open_store):
        for location in (url, Path(url)):  # a Path makes it scheme:/...: still a URL
            with pytest.raises(UsageProblem, match=r"^store [a-z0-9]+://\.\.\.: not a store this version knows; a store is a SQLite file path"):
                look(location)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_says_a_url_is_not_supported_rather_than_missing(tmp_path, capsys):
    from pytest_gpubench.commands.cli import main

    assert main(["report", "--store", "mysql://bench@db/gpubench", "--reports", str(tmp_path)]) != 0
    assert "not a store this version knows" in capsys.readouterr().err


@pytest.mark.parametrize(("location", "kind"), [
    ("reports/manifest.db", "sqlite"), ("C:/reports/m.db", "sqlite"), ("postgresql://u@h/db", "postgresql"),
    ("postgres://u@h:5433/db", "postgresql"), (Path("postgresql://u@h/db"), "postgresql"),
    ("git+file:///srv/results.git", "git"), ("git+ssh://git@example.com/results.git", "git")])
def test_the_location_names_the_kind_of_store(location, kind):
    from pytest_gpubench.store.opening import store_kind

    assert store_kind(location) == kind


def test_a_password_in_a_url_is_never_printed():
    from pytest_gpubench.store.opening import redact

    assert redact("postgresql://bench:s3cret@db:5432/gpubench") == "postgresql://bench:***@db:5432/gpubench"
    assert redact("postgresql://bench@db/gpubench") == "postgresql://bench@db/gpubench"
    assert redact("reports/manifest.db") == "reports/manifest.db"
