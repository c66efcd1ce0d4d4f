"""The provider registry beyond its built-in clouds, and what a run records of its cloud
(cloud/registry.py, store/records.py's ``RunRecord.clouds``, run/cleanup.py's ``Through``):
issue 22 item 2. The toy provider's end-to-end tests are tests/e2e/test_toy_provider.py."""

from __future__ import annotations

import socket
import sqlite3

import pytest

from pytest_gpubench.cloud import registry
from pytest_gpubench.cloud.processes import ProcessIdentity
from pytest_gpubench.matrix.cells import DEFAULT_CLOUD, expand, parse_matrix
from pytest_gpubench.matrix.fields import ENDPOINT_CLOUD
from pytest_gpubench.matrix.fields import MARKETPLACE_CLOUDS
from pytest_gpubench.run.cleanup import Through, renting_clouds, survey
from pytest_gpubench.settings import Settings
from pytest_gpubench.store.records import OLD_RUN_CLOUD, RunInfo, RunRecord
from pytest_gpubench.store.sqlite_store import SqliteStore

DEAD = ProcessIdentity(pid=2 ** 22 + 7, host=socket.gethostname())


def test_a_built_in_cloud_never_reads_the_installed_entry_points(monkeypatch):
    """``pytest --help`` and a run on the built-in clouds scan no package metadata."""
    import importlib.metadata

    registry.installed.cache_clear()
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: pytest.fail("entry points were read"))
    cells = expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}]", "m.yaml"))
    registry.check_clouds(cells)
    assert registry.is_known("hosts") and registry.recorded_settings("shopper", Settings(api="http://a"))
    registry.build_provider("endpoint", Settings())
    registry.installed.cache_clear()


def test_the_defaults_the_lower_layers_spell_out_are_the_registrys():
    assert MARKETPLACE_CLOUDS == {DEFAULT_CLOUD, ENDPOINT_CLOUD}
    assert OLD_RUN_CLOUD == DEFAULT_CLOUD


def test_a_run_records_its_clouds_settings_never_a_secret():
    settings = Settings(api="https://alice:s3cret@shopper.example/x", api_token="tok-123", hosts="/lab/hosts.yaml")
    shopper = registry.recorded_settings("shopper", settings)
    assert shopper == {"api": "https://alice:***@shopper.example/x"}
    assert registry.recorded_settings("hosts", settings) == {"hosts": "/lab/hosts.yaml"}
    assert registry.recorded_settings("local", settings) == {} == registry.recorded_settings("endpoint", settings)
    assert "tok-123" not in repr([registry.recorded_settings(c, settings) for c in registry.PROVIDERS])


def test_an_older_run_reads_as_gpu_shopper_at_its_api_and_a_bad_record_as_nothing():
    assert RunRecord(run_id="r", api="http://a:1").clouds == {"shopper": {"api": "http://a:1"}}
    assert RunRecord(run_id="r").clouds == {}
    assert RunRecord(run_id="r", clouds='{"toy": {"dir": "/d"}}', api="http://a").clouds == {"toy": {"dir": "/d"}}
    for bad in ("not json", "[1, 2]", '{"toy": 3}'):
        assert RunRecord(run_id="r", clouds=bad).clouds == {}
    assert renting_clouds(RunInfo(run_id="r")) == ["shopper"]
    assert renting_clouds(RunInfo(run_id="r", clouds={"endpoint": {}, "hosts": {}})) == ["shopper"]
    assert renting_clouds(RunInfo(run_id="r", clouds={"endpoint": {}, "toy": {}})) == ["toy"]


def test_the_store_adds_each_cloud_a_run_rents_through_and_redacts_it(tmp_path):
    with SqliteStore.open(tmp_path / "m.db") as store:
        store.start_run("r1", [], [], owner=DEAD, api="http://a", clouds={"shopper": {"api": "http://u:pw@a"}})
        store.start_run("r1", [], [], owner=DEAD, clouds={"toy": {"dir": "/d"}})
        store.start_run("r1", [], [], clouds={"toy": {"dir": "/d"}})  # again: nothing new
        assert store.run("r1").clouds == {"shopper": {"api": "http://u:***@a"}, "toy": {"dir": "/d"}}
    stored = sqlite3.connect(tmp_path / "m.db").execute("SELECT clouds FROM runs").fetchone()[0]
    assert "pw" not in stored


def sessions_of(store: SqliteStore, run_id: str, clouds: dict | None, api: str | None = None) -> None:
    store.start_run(run_id, [], [], owner=DEAD, api=api, clouds=clouds)
    row = store.add_cell(run_id, "c", gpu_type="g", provider="p", model="m", matrix_file="f")
    store.record_session(row, session_id=f"{run_id}-s", consumer_id=f"gpubench-{run_id}-c-a1", offer_id="o",
                         price_per_hour=1.0)


def test_a_cleanup_pass_releases_only_the_runs_of_its_cloud_configured_as_they_recorded(tmp_path):
    """Through GPU Shopper at the configured API: its own runs (an older one too); through the toy
    cloud: the toy runs recorded with the same folder. Everything else is left alone, saying why;
    a recorded setting is compared, never used."""
    with SqliteStore.open(tmp_path / "m.db") as store:
        sessions_of(store, "old", None, api="http://api.example")
        sessions_of(store, "shop", {"shopper": {"api": "http://api.example"}}, api="http://api.example")
        sessions_of(store, "toy", {"toy": {"dir": "/clouds/a"}}, api="http://api.example")
        sessions_of(store, "toy-elsewhere", {"toy": {"dir": "/clouds/b"}}, api="http://api.example")
        sessions_of(store, "both", {"toy": {"dir": "/clouds/a"}, "shopper": {"api": "http://api.example"}})
        sessions_of(store, "moon", {"moon": {}}, api="http://api.example")

        def released(found) -> list[str]:
            return sorted(lo.run_id for lo in found.to_release)

        def alone(found) -> dict[str, str]:
            return {action.leftover.run_id: action.detail for action in found.left_alone}

        shopper = survey(store, api="http://api.example")
        assert released(shopper) == ["old", "shop"]
        assert alone(shopper)["toy"] == "run toy rented through the toy cloud (not installed here): " \
                                        "gpubench cleanup ends its sessions"
        assert "end its sessions on each cloud's console" in alone(shopper)["both"]

        toy = survey(store, api="http://api.example", through=Through("toy", {"dir": "/clouds/a"}))
        assert released(toy) == ["toy"]
        assert alone(toy)["toy-elsewhere"] == "run toy-elsewhere used the toy cloud with dir /clouds/b: configure it so"
        assert "rented through the shopper cloud" in alone(toy)["shop"]
        assert "moon cloud (not installed here)" in alone(toy)["moon"]


def test_the_add_a_provider_recipe_names_a_module_and_its_registration():
    """docs/architecture.md's "Add a provider" (bench/architecture.py counts it): the provider's module,
    its line in the registry and its docs row; the toy provider outside the package is one module and
    its entry point, and the package names it nowhere."""
    from pathlib import Path

    from import_graph import recipes

    repo = Path(__file__).parents[2]
    files = recipes()["Add a provider"]
    assert files == ["docs/providers.md", "pytest_gpubench/cloud/registry.py", "pytest_gpubench/cloud/runpod_provider.py"]
    assert all((repo / name).exists() for name in files if "runpod" not in name)
    toy = repo / "tests" / "data" / "toy_provider"
    assert sorted(p.name for p in toy.iterdir() if p.name != "__pycache__") == ["toy_cloud-0.dist-info", "toy_cloud.py"]
    assert "toy = toy_cloud:ToyCloud" in (toy / "toy_cloud-0.dist-info" / "entry_points.txt").read_text()
    assert not [p for p in (repo / "pytest_gpubench").rglob("*.py") if "toy_cloud" in p.read_text()]
