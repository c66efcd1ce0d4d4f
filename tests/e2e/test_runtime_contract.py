"""The ``Runtime`` contract (runtimes/base.py), run against every registered implementation.

The checks are the package's, exported for third-party runtimes (``run/runtime_contract.py``);
each test here runs one of them. Each built-in runtime (``runtime_facts.BUILT_IN``) gets its own
running session of the in-process sandbox (``sandbox``/``api`` in conftest.py) and a real SSH
connection to it; every check builds fresh runtimes for a cell whose matrix names the
implementation, the way the ``gpu_runtime`` fixture does, and drives one part of the protocol
for real: install or locate, serve, health, prepare the model, warm up, the endpoint the load
generator measures through, unload, remove and stop. A new runtime is tested here without a
line added (tests/e2e/test_toy_runtime.py: one registered from outside the package).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sandbox_session import connect, new_session

from pytest_gpubench.aio import LoopThread
from pytest_gpubench.errors import Stage, StageError
from pytest_gpubench.matrix.cells import Cell
from pytest_gpubench.matrix.fields import ENDPOINT_RUNTIME
from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.run import runtime_contract as contract
from pytest_gpubench.run.runtime_contract import RuntimeUnderTest, contract_cell
from pytest_gpubench.runtime_facts import BUILT_IN, DEFAULT_RUNTIME, facts_of, runtime_names
from pytest_gpubench.runtimes.registry import runtime_for

MODEL = contract.CONTRACT_MODEL


#: What a runtime needs beside its name in the matrix (container workers: seed 004's presets file).
RUNTIME_EXTRAS = {"worker": f"presets: {Path(__file__).parents[1] / 'data' / 'worker' / 'model_presets.yaml'}"}


def cell_for(runtime_name: str) -> Cell:
    """A cell whose matrix names ``runtime_name``, as a user's file would."""
    return contract_cell(runtime_name, MODEL, RUNTIME_EXTRAS.get(runtime_name, ""))


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """One event loop for the module: the SSH connection lives on it across tests."""
    thread = LoopThread("runtime-contract")
    yield thread
    thread.close()


#: Runtimes that start a server on an instance. ``openai`` measures a server already up elsewhere
#: (nothing to install, stop or unload): tests/e2e/test_endpoint_runtime.py holds it to what applies.
ON_AN_INSTANCE = sorted(name for name in BUILT_IN if name != ENDPOINT_RUNTIME)


@pytest.fixture(scope="module", params=ON_AN_INSTANCE)
def instance(request: pytest.FixtureRequest, api: httpx.Client, loop: LoopThread) -> Iterator[tuple[str, Connection]]:
    """A running sandbox session per implementation, and an SSH connection to it."""
    session, key = new_session(api)
    conn = loop.run(connect(session, key), 60)
    yield request.param, conn
    loop.run(conn.close(), 15)
    api.post(f"/api/v1/sessions/{session['id']}/done")


@pytest.fixture
def subject(instance: tuple[str, Connection]) -> RuntimeUnderTest:
    """The implementation under test: fresh runtimes of it, as the registry builds them for a cell."""
    name, conn = instance
    return RuntimeUnderTest(name, lambda: runtime_for(cell_for(name), conn), conn, MODEL)


@pytest.fixture
def check(subject: RuntimeUnderTest, loop: LoopThread):
    """Run the contract's check of that name on the implementation under test, with a generous bound."""
    def check(name: str) -> None:
        loop.run(contract.CHECKS[name](subject), 600)

    return check


# --------------------------------------------------------------------- the registry


def test_every_built_in_runtime_declares_itself_in_its_module():
    assert runtime_names()[: len(BUILT_IN)] == tuple(BUILT_IN) and DEFAULT_RUNTIME == "ollama"
    for name, where in BUILT_IN.items():
        facts = facts_of(name)
        assert facts.name == facts.runtime.name == name
        assert where.startswith(f"{facts.runtime.__module__}:")
    assert cell_for("ollama").runtime == "ollama"


def test_a_cell_naming_no_registered_runtime_fails_at_install():
    cell = cell_for(DEFAULT_RUNTIME).model_copy(update={"runtime": "nonesuch"})
    with pytest.raises(StageError) as info:
        runtime_for(cell, conn=None)
    assert info.value.stage is Stage.RUNTIME_SETUP
    assert str(info.value) == f"unknown runtime 'nonesuch'; known runtimes: {', '.join(runtime_names())}"


# --------------------------------------------------------------------- the contract


def test_it_is_the_runtime_the_cell_names(check):
    check("it_is_the_runtime_the_cell_names")


def test_install_or_locate_then_serve_then_health(check):
    check("install_or_locate_then_serve_then_health")


def test_prepare_the_model_and_describe_it(check):
    check("prepare_the_model_and_describe_it")


def test_a_model_the_runtime_cannot_prepare_fails_at_model_pull(check):
    check("a_model_the_runtime_cannot_prepare_fails_at_model_pull")


def test_warm_up_loads_the_model_and_keeps_its_cold_start(check):
    check("warm_up_loads_the_model_and_keeps_its_cold_start")


def test_the_load_generator_measures_through_the_endpoint(check):
    check("the_load_generator_measures_through_the_endpoint")


def test_unload_frees_the_gpu_and_remove_the_disk(check):
    check("unload_frees_the_gpu_and_remove_the_disk")


def test_stop_then_the_health_check_restarts_the_server_once(check):
    check("stop_then_the_health_check_restarts_the_server_once")


def test_the_next_cell_on_a_session_takes_over_the_server_an_earlier_one_started(check):
    check("the_next_cell_on_a_session_takes_over_the_server_an_earlier_one_started")


def test_the_project_runs_every_check_of_the_exported_contract():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(contract.CHECKS) <= tested
