"""``gpubench status``: per phase (run), done, failed, skipped, claimed (holder, since, lease), left.

Written against the ``Store`` protocol, and run on each kind of store (SQLite, PostgreSQL, git).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_gpubench.commands.cli import main
from pytest_gpubench.commands.status import render, run_status
from pytest_gpubench.store.base import Store
from pytest_gpubench.store.opening import open_store

#: The tests' clock: the command reads the real one, so claims are made just before it.
NOW = time.time()
#: kind -> (the store's location for ``--store``, given the test's folder and request)
STORES: dict[str, Callable[[Path, pytest.FixtureRequest], str]] = {
    "sqlite": lambda folder, request: str(folder / "manifest.db"),
    "postgresql": lambda folder, request: request.getfixturevalue("postgres_url"),
    "git": lambda folder, request: f"git+file://{folder}/results.git",
}


@pytest.fixture(params=sorted(STORES))
def location(request, tmp_path) -> str:
    return STORES[request.param](tmp_path, request)


@pytest.fixture
def store(location) -> Iterator[Store]:
    """A store holding phase ``nightly`` with a cell in every state, and an older run."""
    opened = open_store(location)
    opened.start_run("older", ["pytest"], [])
    opened.finish_cell(opened.add_cell("older", "T4-vastai-qwen2:7b", gpu_type="T4", provider="vastai",
                                       model="qwen2:7b", matrix_file="m.yaml"), status="success")
    opened.start_run("nightly", ["pytest"], [])
    rows = {}
    for cell in ("a-success", "b-partial", "c-failed", "d-skipped", "e-running", "f-stale", "g-nolease",
                 "h-pending", "h-pending-rerun2"):
        rows[cell] = opened.add_cell("nightly", cell, gpu_type="RTX 4090", provider="local", model="qwen2:7b",
                                     matrix_file="m.yaml")
    for cell, status in (("a-success", "success"), ("b-partial", "partial"), ("c-failed", "failed"),
                         ("d-skipped", "skipped")):
        opened.claim_cell(rows[cell], "box-a", lease_seconds=60, now=NOW - 300)
        opened.finish_cell(rows[cell], status=status)
    assert opened.claim_cell(rows["e-running"], "box-a", lease_seconds=620, now=NOW - 20).won  # ample: the command reads the real clock
    assert opened.claim_cell(rows["f-stale"], "box-b", lease_seconds=60, now=NOW - 90).won
    assert opened.claim_cell(rows["g-nolease"], "box-c", now=NOW - 5).won
    yield opened
    opened.close()


def test_each_state_is_counted_and_each_claim_says_who_since_when_and_its_lease(store):
    status = run_status(store, "nightly", now=NOW)
    counts = (status.success, status.partial, status.failed, status.skipped, status.claimed, status.stale,
              status.left, status.total, status.done)
    assert counts == (1, 1, 1, 1, 3, 1, 2, 9, 2)
    claims = {c.cell: c for c in status.claims}
    assert (claims["e-running"].holder, claims["e-running"].lease_expires_at, claims["e-running"].stale) == (
        "box-a", NOW + 600, False)
    assert claims["f-stale"].stale and claims["f-stale"].holder == "box-b" and claims["f-stale"].since
    lines = render([status], now=NOW)
    assert lines[0] == ("nightly: 2 done (1 success, 1 partial), 1 failed, 1 skipped, 3 claimed (1 stale), "
                        "2 left; 9 cells")
    text = "\n".join(lines)
    assert f"claimed  e-running  by box-a since {claims['e-running'].since}, lease 10 min left" in text
    assert "claimed  f-stale    by box-b since" in text
    assert "lease expired 30 s ago: stale, will be taken over" in text
    assert "g-nolease  by box-c since" in text and "no lease (held until it finishes)" in text
    assert "h-pending" not in text  # cells only with --cells


def test_cells_lists_every_cell_with_its_state(store):
    text = "\n".join(render([run_status(store, "nightly", now=NOW, with_cells=True)], now=NOW))
    for word, cell in (("success", "a-success"), ("partial", "b-partial"), ("failed", "c-failed"),
                       ("skipped", "d-skipped"), ("left", "h-pending"), ("left", "h-pending-rerun2")):
        assert f"  {word:<7}  {cell}" in text
    assert text.count("  claimed  ") == 3  # running cells once, as claims


def test_the_command_shows_every_run_or_one_and_json(store, location, capsys):
    assert main(["status", "--store", location]) == 0
    out = capsys.readouterr().out
    assert out.index("nightly: ") < out.index("older: 1 done (1 success, 0 partial)")  # most recent first
    assert main(["status", "--store", location, "--phase", "last", "--cells"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nightly: ") and "older" not in out and "  left     h-pending" in out
    assert main(["status", "--store", location, "--run", "nightly", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    (run,) = answer["runs"]
    assert (run["run_id"], run["done"], run["claimed"], run["stale"], run["left"], run["total"]) == (
        "nightly", 2, 3, 1, 2, 9)
    assert {c["cell"] for c in run["claims"]} == {"e-running", "f-stale", "g-nolease"} and "cells" not in run


def test_an_unknown_run_or_a_missing_store_is_a_usage_problem(store, location, tmp_path, capsys):
    assert main(["status", "--store", location, "--run", "weekly"]) == 2
    assert "no run 'weekly'" in capsys.readouterr().err
    assert main(["status", "--store", str(tmp_path / "none.db")]) == 2
    assert "no manifest at" in capsys.readouterr().err
