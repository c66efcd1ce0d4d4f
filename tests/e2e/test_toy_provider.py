"""A provider defined outside the package: one module plus its registration (issue 22 item 2).

``tests/data/toy_provider`` holds ``toy_cloud.py`` (``cloud: toy``: pods and rentals in a
folder's JSON files, a RunPod-like shape nothing like GPU Shopper's API, the pods being
sandbox machines with real SSH on loopback) and a ``toy_cloud-0.dist-info`` whose
``entry_points.txt`` registers it in ``pytest_gpubench.providers``: with that folder on
``sys.path`` (or ``PYTHONPATH``), ``importlib.metadata`` finds it as it finds an installed
distribution's. Here it passes the exported contract (``run/provider_contract.py``), a matrix
naming it runs a cell end to end and records the cloud, and ``gpubench cleanup`` builds it
from that record. Nothing in the package names it.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils
from e2e_helpers import manifest_rows, run_pytest

from pytest_gpubench.aio import run as run_async
from pytest_gpubench.cloud import registry
from pytest_gpubench.cloud.provider import Constraints, consumer_id
from pytest_gpubench.commands.cli import main as gpubench
from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.run.provider_contract import ProviderUnderTest, check_provider
from pytest_gpubench.sandbox.server import HostPlan, SandboxHostsThread
from pytest_gpubench.settings import Settings

TOY = Path(__file__).parents[1] / "data" / "toy_provider"
MATRIX = """\
cloud: toy
workload: {duration: 3s, max_tokens: 32, warmup_requests: 1}
matrix:
  - {gpu: RTX 4090, provider: toyland, model: 'qwen2:1.5b'}
"""


@pytest.fixture
def toy_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy's distribution on ``sys.path`` of this process, the registry's reading of the
    entry points made again with it (and again after, without it)."""
    monkeypatch.syspath_prepend(str(TOY))
    registry.installed.cache_clear()
    yield
    registry.installed.cache_clear()


@pytest.fixture
def toy_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A toy cloud folder with one pod: a sandbox machine (one RTX 4090) over SSH; ``TOY_CLOUD_DIR`` names it."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("pod1")])
    machines.start()
    folder = tmp_path / "toy"
    folder.mkdir()
    (machine,) = machines.hosts.machines.values()
    pods = [{"podId": "pod-1", "gpuName": "RTX 4090", "gpuCount": 1, "memoryInGb": 24, "costPerHr": 0.5,
             "sshHost": "127.0.0.1", "sshPort": machine.ssh_port, "sshUser": "root",
             "sshKeyFile": str(machines.hosts.key_file)}]
    (folder / "pods.json").write_text(json.dumps({"pods": pods}))
    monkeypatch.setenv("TOY_CLOUD_DIR", str(folder))
    try:
        yield folder
    finally:
        machines.stop()


def rentals(folder: Path) -> dict[str, dict]:
    return json.loads((folder / "rentals.json").read_text())["rentals"]


def test_the_toy_is_found_by_its_entry_point_only_when_asked(toy_on_path):
    assert "toy" not in registry.PROVIDERS
    assert registry.known_clouds()[-1] == "toy" and registry.is_known("toy")
    assert type(registry.build_provider("toy", Settings())).__module__ == "toy_cloud"
    (cell,) = expand(parse_matrix(MATRIX, "gpubench_toy.yaml"))
    assert (cell.cloud, cell.provider) == ("toy", "toyland")  # its own marketplace, not GPU Shopper's
    registry.check_clouds([cell])
    (moon,) = expand(parse_matrix(MATRIX.replace("cloud: toy", "cloud: moon"), "gpubench_moon.yaml"))
    with pytest.raises(MatrixError, match=r"unknown cloud 'moon'; known clouds: shopper, .*, toy \("):
        registry.check_clouds([moon])


def test_a_row_of_gpu_shoppers_cloud_still_names_one_of_its_marketplaces():
    with pytest.raises(MatrixError, match=r"unknown provider 'toyland'; known providers: vastai"):
        parse_matrix(MATRIX.replace("cloud: toy\n", ""), "gpubench_toy.yaml")


def test_the_toy_passes_the_exported_provider_contract_and_gpubench_offers_lists_its_pods(
        toy_on_path, toy_cloud, capsys):
    subject = ProviderUnderTest(registry.build_provider("toy", Settings()),
                                Constraints("RTX 4090", "toyland", vram_gb=8), timeout=60)
    run_async(check_provider(subject), 300)
    assert {r["desiredStatus"] for r in rentals(toy_cloud).values()} == {"EXITED"}
    capsys.readouterr()
    assert gpubench(["offers", "--cloud", "toy"]) == 0
    out = capsys.readouterr().out
    assert "pod-1" in out and "toyland" in out and "at the toy cloud" in out, out
    assert gpubench(["offers", "--cloud", "moon"]) == 2
    assert "unknown cloud 'moon'; known clouds: shopper, endpoint, hosts, local, toy" in capsys.readouterr().err


def test_a_matrix_on_the_toy_cloud_runs_a_cell_and_cleanup_builds_the_toy_from_the_record(
        toy_on_path, toy_cloud, tmp_path, capsys):
    matrix = tmp_path / "gpubench_toy.yaml"
    matrix.write_text(textwrap.dedent(MATRIX))
    path = os.pathsep.join(filter(None, [str(TOY), os.environ.get("PYTHONPATH")]))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "known_hosts"),
                      extra_env={"PYTHONPATH": path, "TOY_CLOUD_DIR": str(toy_cloud)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (row,) = manifest_rows(tmp_path)
    assert (row["status"], row["provider"]) == ("success", "toyland")
    store = tmp_path / "reports" / "manifest.db"
    (run,) = sqlite_utils.Database(store)["runs"].rows
    assert json.loads(run["clouds"]) == {"toy": {"dir": str(toy_cloud)}}
    assert {r["desiredStatus"] for r in rentals(toy_cloud).values()} == {"EXITED"}  # released in teardown

    # A session of that run only the toy cloud knows (its process died between create and record):
    # cleanup builds the toy provider from the run's record, finds the session by its consumer id, ends it.
    leftover = run_async(registry.build_provider("toy", Settings()).create(
        run_async(registry.build_provider("toy", Settings()).offers(), 30)[0],
        consumer_id(run["run_id"], row["cell_id"], 2), 1), 30)
    assert rentals(toy_cloud)[leftover.session.id]["desiredStatus"] == "RUNNING"
    capsys.readouterr()
    assert gpubench(["cleanup", "--store", str(store), "--api", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out
    assert leftover.session.id in out and "1 released" in out, out
    assert rentals(toy_cloud)[leftover.session.id]["desiredStatus"] == "EXITED"
