"""A run on the sandbox recording into PostgreSQL (``--gpubench-store postgresql://...``):
two xdist workers, two cells, everything through the store; then ``gpubench report`` from it."""

from __future__ import annotations

import pytest
from e2e_helpers import QUICK, run_pytest

from pytest_gpubench.commands.cli import main
from pytest_gpubench.store.opening import open_store


@pytest.mark.slow
def test_a_sandbox_run_records_into_postgresql(tmp_path, postgres_url):
    # The sandbox's clock at 0.01, not the flag's 0.02: this test times nothing.
    done = run_pytest(tmp_path, str(QUICK), "-k", "4090", "-n", "2", "--gpubench-sandbox",
                      "--gpubench-time-scale", "0.01",
                      "--gpubench-duration", "3", "--gpubench-store", postgres_url)
    assert done.returncode == 0, done.stdout[-3000:]
    with open_store(postgres_url) as store:
        (run_id,) = store.run_ids()
        cells = store.cells(run_id)
        assert len(cells) == 2 and {cell.status for cell in cells} == {"success"}
        assert {cell.session_status for cell in cells} == {"stopped"}
        assert store.unreleased_sessions() == []
        results = store.results(run_id)
        assert len(results) == 2 and all(store.requests(result.id) for result in results)
        assert store.run(run_id).status is not None
    assert not (tmp_path / "reports" / "manifest.db").exists()  # the store is PostgreSQL, not the file
    assert f"store {postgres_url}" in done.stdout
    assert main(["report", "--store", postgres_url, "--reports", str(tmp_path / "out")]) == 0
    assert "RTX 4090" in (tmp_path / "out" / "BENCHMARK_REPORT.md").read_text()
