"""Contract of the one adapter to pytest-xdist's internals (plugin/xdist_scheduler.py).

Drives :class:`CellGroupScheduling` through xdist's ``Scheduling`` protocol, as
xdist's ``DSession`` does, with the installed xdist. When an xdist release changes
what the adapter relies on, these fail and say what changed; pyproject.toml bounds
the versions they passed with.
"""

from __future__ import annotations

from importlib.metadata import version
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from pytest_gpubench.plugin.xdist_scheduler import ASSIGNED_WORK, CellGroupScheduling, with_group

GROUPED = ["gpubench_a.yaml::RTX_4090-vastai-qwen2:7b", "gpubench_a.yaml::RTX_4090-vastai-qwen2:1.5b",
           "gpubench_b.yaml::RTX_4090-vastai-llama3:8b"]
ALONE = ["gpubench_a.yaml::H100-vastai-qwen2:7b", "tests/test_mine.py::test_plain"]


class Worker:
    """What a scheduler uses of xdist's WorkerController: its id, what it was sent, shutting down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.workerinput = {"workerid": name}
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_runtest_all(self) -> None:  # pragma: no cover - only the "each" scheduler sends all
        raise AssertionError("a group scheduler sends chosen items")

    def shutdown(self) -> None:
        self.shutting_down = True


@pytest.fixture
def scheduler(pytester: pytest.Pytester) -> tuple[CellGroupScheduling, list[Worker], list[str]]:
    config = pytester.parseconfig("-p", "xdist", "--tx", "2*popen", "--dist", "loadgroup")
    collection = [GROUPED[0], ALONE[0], GROUPED[1], ALONE[1], GROUPED[2]]
    groups = {nodeid: "RTX_4090-vastai" for nodeid in GROUPED}
    sched = CellGroupScheduling(config, groups_of=lambda node: groups)
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        sched.add_node(worker)
    for worker in workers:
        sched.add_node_collection(worker, collection)
    assert sched.collection_is_completed
    sched.schedule()
    return sched, workers, collection


def sent_ids(worker: Worker, collection: list[str]) -> list[str]:
    return [collection[i] for i in worker.sent]


def test_a_group_the_workers_reported_goes_to_one_worker(scheduler):
    sched, workers, collection = scheduler
    holders = [w for w in workers if set(GROUPED) & set(sent_ids(w, collection))]
    assert len(holders) == 1, [sent_ids(w, collection) for w in workers]
    assert set(GROUPED) <= set(sent_ids(holders[0], collection))


def test_a_crashed_cell_is_not_run_again_and_the_rest_of_its_group_goes_on(scheduler):
    sched, workers, collection = scheduler
    (holder,) = [w for w in workers if set(GROUPED) & set(sent_ids(w, collection))]
    order = [i for i in holder.sent if collection[i] in GROUPED]
    sched.mark_test_complete(holder, order[0])  # the first cell passed; the second was running
    crashed = sched.remove_node(holder)
    assert crashed == with_group(collection[order[1]], "RTX_4090-vastai"), (
        f"xdist's scheduler no longer exposes the crashed worker's work as {ASSIGNED_WORK}")
    # xdist starts a worker in the crashed one's place; it collects and is scheduled.
    replacement = Worker("gw2")
    sched.add_node(replacement)
    sched.add_node_collection(replacement, collection)
    sched.schedule()
    again = sent_ids(replacement, collection)
    assert collection[order[2]] in again, "the rest of the crashed worker's group must go on elsewhere"
    assert collection[order[1]] not in again and collection[order[0]] not in again, (
        "xdist requeued a crashed or finished cell: the crashed cell would run twice")


def test_ids_xdist_already_named_after_their_group_stay_as_they_are():
    assert with_group("m.yaml::c", "G") == "m.yaml::c@G"
    assert with_group("m.yaml::c@G", "G") == "m.yaml::c@G"
    assert with_group("t.py::test[a@b]", "G") == "t.py::test[a@b]@G"  # an @ in a parameter is no group
    assert with_group("m.yaml::c", None) == "m.yaml::c"


def test_the_installed_xdist_is_within_the_bounds_this_contract_was_checked_with():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(r) for r in project["dependencies"] if r.startswith("pytest-xdist")]
    assert spec.specifier and any(s.operator == "<" for s in spec.specifier), "bound xdist from above"
    assert Version(version("pytest-xdist")) in spec.specifier


# ------------------------------------------------ the dist mode, through public hooks only

DIST_REPORTER = """
def pytest_configure(config):
    print("DIST", config.getoption("dist"))
"""
MATRIX = """
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
"""


@pytest.mark.parametrize(("args", "dist"), [
    (["gpubench_x.yaml", "-n", "2"], "loadgroup"),  # -n alone in a run with cells: groups kept
    (["gpubench_x.yaml", "-n", "2", "--dist", "load"], "load"),  # the user's choice stands
    (["gpubench_x.yaml", "-n", "2", "--dist", "worksteal"], "worksteal"),
    (["test_plain.py", "-n", "2"], "load"),  # another project's run: xdist's default
    (["gpubench_x.yaml"], "no"),
])
def test_n_without_dist_keeps_groups_and_a_chosen_dist_is_left_alone(pytester, args, dist, monkeypatch):
    pytester.makeconftest(DIST_REPORTER)
    pytester.makefile(".yaml", gpubench_x=MATRIX)
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "manifest.db"))
    result = pytester.runpytest_subprocess(*args, "--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([f"DIST {dist}"])


def test_a_dist_that_spreads_groups_is_said_in_the_header(pytester, monkeypatch):
    pytester.makefile(".yaml", gpubench_x=MATRIX)
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "manifest.db"))
    header = pytester.runpytest_subprocess("gpubench_x.yaml", "-n", "2", "--dist", "load", "-k", "nothing",
                                           "--gpubench-sandbox", "-p", "no:cacheprovider")
    header.stdout.fnmatch_lines(["gpubench: --dist load does not keep a reuse group on one worker*"])
