"""A runtime defined outside the package: one module plus its registration (issue 22 item 2).

``tests/data/toy_runtime`` holds ``toy_runtime.py`` (``runtime: toy``, declared entirely there:
launch template, version command, how the sandbox imitates it) and a ``toy_runtime-0.dist-info``
whose ``entry_points.txt`` registers it in ``pytest_gpubench.runtimes``: with that folder on
``sys.path`` (or ``PYTHONPATH``), ``importlib.metadata`` finds it as it finds an installed
distribution's. Here it passes the exported contract (``run/runtime_contract.py``) on a sandbox
session, and a matrix naming it runs a cell end to end. Nothing in the package names it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from e2e_helpers import assert_every_session_released, run_pytest
from sandbox_session import connect, new_session

from pytest_gpubench import runtime_facts
from pytest_gpubench.aio import LoopThread
from pytest_gpubench.run.runtime_contract import RuntimeUnderTest, check_runtime, contract_cell
from pytest_gpubench.runtimes.registry import runtime_for

TOY = Path(__file__).parents[1] / "data" / "toy_runtime"
TIME_SCALE = 0.02  # the in-process sandbox's clock, shared with the pytest run below
TOY_MATRIX = """
runtime: toy
workload: {duration: 5s, max_tokens: 32, concurrency: 2}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}
"""


@pytest.fixture
def toy_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy's distribution on ``sys.path`` of this process (the in-process sandbox writes its
    launcher on the instances it builds meanwhile); gone again after the test."""
    monkeypatch.syspath_prepend(str(TOY))
    yield


def test_the_toy_is_found_by_its_entry_point(toy_on_path):
    assert "toy" not in runtime_facts.BUILT_IN
    assert runtime_facts.runtime_names()[-1] == "toy" and runtime_facts.facts_of("toy").runtime.__module__ == "toy_runtime"
    assert runtime_facts.server_per_cell("toy") and runtime_facts.facts_of("toy").sandbox.stand_in == "vllm"
    assert contract_cell("toy").runtime == "toy"


def test_the_toy_passes_the_exported_runtime_contract(toy_on_path, api: httpx.Client):
    session, key = new_session(api)  # built with the toy on the path: its instance has toy-serve
    loop = LoopThread("toy-contract")
    try:
        conn = loop.run(connect(session, key), 60)
        subject = RuntimeUnderTest("toy", lambda: runtime_for(contract_cell("toy"), conn), conn)
        loop.run(check_runtime(subject), 600)
        loop.run(conn.close(), 15)
    finally:
        loop.close()
        api.post(f"/api/v1/sessions/{session['id']}/done")


@pytest.mark.slow
def test_a_matrix_naming_the_toy_runs_a_cell_end_to_end(toy_on_path, sandbox, tmp_path):
    matrix = tmp_path / "gpubench_toy.yaml"
    matrix.write_text(TOY_MATRIX)
    path = os.pathsep.join(filter(None, [str(TOY), os.environ.get("PYTHONPATH")]))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", sandbox.url, "--gpubench-time-scale", str(TIME_SCALE),
                      "--rootdir", str(tmp_path), "-rs", extra_env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stdout[-3000:]
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (row,) = list(db["benchmark_manifest"].rows)
    assert row["status"] == "success", row
    benchmark = next(db.query("select * from benchmarks where id = ?", [row["benchmark_id"]]))
    result, details = json.loads(benchmark["result_json"]), json.loads(benchmark["details_json"])
    # The sandbox's vLLM stand-in answered as toy-serve: its version, the cell's runtime the toy.
    assert (result["model"]["runtime"], result["model"]["runtime_version"]) == ("toy", "0.10.1.1")
    assert details["runtime"]["started_here"] is True and details["metrics"]["errors"] == 0
    assert benchmark["output_tokens_per_second"] > 0
    assert_every_session_released(sandbox.url)


def test_a_matrix_naming_a_runtime_no_one_registered_lists_the_registered_ones(toy_on_path):
    from pytest_gpubench.errors import MatrixError
    from pytest_gpubench.matrix.cells import parse_matrix

    with pytest.raises(MatrixError) as info:
        parse_matrix("runtime: tyo\nmatrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n", "m.yaml")
    assert ("unknown runtime 'tyo' (did you mean 'toy'?); known runtimes: ollama, vllm, sglang, tgi, llamacpp, "
            "openai, worker, toy") in str(info.value)
