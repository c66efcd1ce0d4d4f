"""store/opening.py: the one door to a store, and what it refuses."""

from __future__ import annotations

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


@pytest.mark.parametrize("url", ["postgresql://bench@db/gpubench", "sqlite:///x.db", "s3://bucket/m.db"])
def test_a_url_is_refused_with_what_is_supported_and_nothing_is_created(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    assert not store_exists(url)
    with pytest.raises(UsageProblem, match=r"only a SQLite file path is supported"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []
