"""Contract of the adapters to private names: plugin/internals.py (pytest's and
pytest-xdist's) and matrix/prototype.py (pydantic's).

Each private name the adapters touch is driven here with the installed pytest,
pytest-xdist and pydantic, as the plugin uses it: the scheduler through xdist's
``Scheduling`` protocol, as xdist's ``DSession`` does; an item answered without running,
and a put-aside item run after an xdist worker's loop, in real pytest runs; a matrix
file's items sharing one fixture closure; instances built without validation. When a
release changes what an adapter relies on, these fail and say what changed;
pyproject.toml bounds the versions they passed with, and the last tests check that the
installed versions sit inside those bounds.
"""

from __future__ import annotations

import pickle
from functools import cached_property
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pydantic
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from pytest_gpubench.errors import InternalsChanged
from pytest_gpubench.matrix import prototype
from pytest_gpubench.plugin import internals
from pytest_gpubench.plugin.internals import ASSIGNED_WORK, CellGroupScheduling, with_group

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
    """The scheduler's ``assigned_work``: the crashed item is counted done, the rest requeued."""
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


# ------------------------------------------------ pytest: an item answered without running

UNRUN_CONFTEST = """
import pytest
from pytest_gpubench.plugin.internals import teardown_for

EVENTS = []


@pytest.fixture(scope="module")
def shared():
    EVENTS.append("up")
    yield
    EVENTS.append("down")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.name == "test_answered":  # as a cell claimed elsewhere: answered, never run
        teardown_for(item, nextitem)
        return True
    return None
"""


def test_an_item_answered_without_running_leaves_nothing_the_next_item_does_not_share(pytester):
    """``Session._setupstate.teardown_exact``: the module fixture the first item kept for the
    answered one is torn down before the next file's item, whose setup would otherwise
    fail ("previous item was not torn down properly")."""
    pytester.makeconftest(UNRUN_CONFTEST)
    pytester.makepyfile(test_a="def test_first(shared):\n    pass\n\n\ndef test_answered(shared):\n    pass\n",
                        test_b="from conftest import EVENTS\n\n\ndef test_next():\n"
                               "    assert EVENTS == ['up', 'down']\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_without_the_setup_state_the_run_stops_saying_why():
    item = SimpleNamespace(session=SimpleNamespace())
    with pytest.raises(InternalsChanged, match="_setupstate.teardown_exact"):
        internals.teardown_for(item, None)


# ------------------------------------------------ pytest: one fixture closure for a matrix file's items

def test_a_function_s_fixture_closure_serves_another_item_of_the_same_function(pytester):
    """``Function._fixtureinfo``: what ``Function.from_parent(..., fixtureinfo=...)`` takes."""
    (item,) = pytester.getitems("import pytest\n\n\n@pytest.fixture\ndef f(tmp_path):\n    return 1\n\n\n"
                                "def test_one(f):\n    pass\n")
    closure = internals.fixture_closure(item)
    assert closure is not None, "pytest's Function no longer has _fixtureinfo"
    assert list(closure.names_closure) == item.fixturenames
    twin = pytest.Function.from_parent(item.parent, name="test_twin", callobj=item.obj, fixtureinfo=closure)
    assert twin.fixturenames == item.fixturenames and internals.fixture_closure(twin) is closure


def test_without_a_fixture_closure_each_item_computes_its_own():
    assert internals.fixture_closure(SimpleNamespace()) is None


# ------------------------------------------------ pytest-xdist: an item run after the worker's loop

LATER_CONFTEST = """
import pytest
from pytest_gpubench.plugin.internals import report_as, teardown_for

LATER = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.name == "test_later" and not LATER:  # put aside, as a cell another controller holds
        LATER.append(item)
        teardown_for(item, nextitem)
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    result = yield
    for item in LATER:
        report_as(session.config, session, item)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
    return result
"""


def test_an_item_run_after_an_xdist_worker_s_loop_reports_as_itself(pytester):
    """``WorkerInteractor.item_index``: without it, xdist's worker asserts that the report is
    of the item its loop ran last, and the worker dies."""
    pytester.makeconftest(LATER_CONFTEST)
    pytester.makepyfile(test_x="def test_later():\n    pass\n\n\ndef test_now():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "1", "-v", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*PASSED test_x.py::test_later*"])
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_worker_without_the_report_index_stops_saying_why_and_elsewhere_nothing_is_done():
    plugins = SimpleNamespace(get_plugins=lambda: [object()])
    worker = SimpleNamespace(workerinput={"workerid": "gw0"}, pluginmanager=plugins)
    with pytest.raises(InternalsChanged, match="WorkerInteractor.item_index"):
        internals.report_as(worker, SimpleNamespace(items=[]), None)
    internals.report_as(SimpleNamespace(pluginmanager=plugins), SimpleNamespace(items=[]), None)


# ------------------------------------------------ pydantic: instances built without validation

class Part(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    tags: tuple[str, ...] = ()
    note: str | None = None

    @cached_property
    def label(self) -> str:
        return f"{self.name}:{self.size}"


@pytest.mark.parametrize("build", [prototype.written, prototype.constructed], ids=["slots", "model_construct"])
def test_an_instance_built_without_validation_is_the_validated_one(build):
    """``__pydantic_fields_set__``, ``__pydantic_extra__``, ``__pydantic_private__``: the
    slots ``model_construct`` writes, written as it writes them, for every use a cell sees."""
    assert prototype.WRITES_SLOTS, f"pydantic {pydantic.VERSION}'s BaseModel has other slots: {BaseModel.__slots__}"
    fields_set = {"name", "size"}
    built = build(Part, {"name": "a", "size": 1, "tags": (), "note": None}, fields_set)
    validated = Part(name="a", size=1)
    assert built == validated and hash(built) == hash(validated)
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump() == validated.model_dump() and built.model_dump_json() == validated.model_dump_json()
    assert built.label == "a:1" and repr(built) == repr(validated)
    assert pickle.loads(pickle.dumps(built)) == validated
    assert built.model_copy(update={"note": "x"}).model_fields_set == {"name", "size", "note"}
    assert built.model_fields_set == {"name", "size"}  # the copy took its own set
    with pytest.raises(ValidationError):
        built.size = 2  # frozen, as validated


def test_cached_values_given_are_kept_and_the_fields_set_is_shared():
    values = {"name": "a", "size": 1, "tags": (), "note": None}
    fields_set = {"name", "size"}
    first = prototype.written(Part, {**values, "label": "given"}, fields_set)
    second = prototype.written(Part, dict(values), fields_set)
    assert first.label == "given" and second.label == "a:1"
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__ is fields_set


def test_a_model_with_private_attributes_is_refused():
    """``__private_attributes__``: such a model needs its ``__pydantic_private__`` filled."""
    class Secretive(BaseModel):
        model_config = ConfigDict(frozen=True)
        x: int = 0
        _cache: int = PrivateAttr(default=0)

    assert Secretive.__private_attributes__, "pydantic no longer lists private attributes there"
    with pytest.raises(TypeError, match="private"):
        prototype.Prototype(Secretive, {}, varying=("x",))


# ------------------------------------------------ every name, and the versions checked

def test_every_private_name_an_adapter_touches_is_driven_here():
    """A name added to an adapter's ``PRIVATE_NAMES`` needs its contract test in this module
    (this checks that the module names it)."""
    source = Path(__file__).read_text()
    missing = [name for name in [*internals.PRIVATE_NAMES, *prototype.PRIVATE_NAMES] if name not in source]
    assert missing == []


@pytest.mark.parametrize("package", ["pytest", "pytest-xdist", "pydantic"])
def test_the_installed_version_is_within_the_bounds_the_adapters_were_checked_with(package):
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == package]
    assert spec.specifier and any(s.operator == "<" for s in spec.specifier), f"bound {package} from above"
    assert Version(version(package)) in spec.specifier


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
