"""A pytest run on the sandbox whose store is a git repository (docs/git-mode.md)."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import QUICK, run_pytest

from pytest_gpubench.store.git_repo import run_git


@pytest.mark.slow
def test_a_run_on_the_git_store_leaves_its_results_in_the_repository(tmp_path, standalone_sandbox):
    cache = tmp_path / "xdg"
    done = run_pytest(tmp_path, str(QUICK), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02",
                      "-k", "4090", "--gpubench-duration", "2",
                      "--gpubench-store", f"git+file://{tmp_path}/results.git",
                      extra_env={"XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"store git+file://{tmp_path}/results.git" in done.stdout
    repo = tmp_path / "checkout"
    run_git("clone", "-q", str(tmp_path / "results.git"), str(repo))
    (todo,) = (repo / "data" / "phase").glob("*.txt")
    assert todo.read_text() == ""
    assert not list((repo / "data" / "runs" / "claims").rglob("*.json"))
    results = {path.stem: json.loads(path.read_text()) for path in (repo / "data" / "runs" / todo.stem).glob("*.json")}
    assert sorted(results) == ["RTX_4090-vastai-qwen2_1.5b", "RTX_4090-vastai-qwen2_7b"]
    for found in results.values():
        assert found["cell"]["status"] == "success" and found["result"]["results"]["avg_tokens_per_second"] > 0
    # Every store the run opened was closed with the process: no clone is left behind.
    assert not [path for path in cache.rglob("clones/*") if path.is_dir()]
