"""Two GPU boxes run their shares of one phase on the sandbox; `gpubench status` follows the phase."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from e2e_helpers import QUICK, REPO, manifest_rows, run_pytest


def status(tmp_path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "status",
                           "--store", str(tmp_path / "reports" / "manifest.db"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_two_runners_share_one_phase_run_and_status_shows_what_is_left(tmp_path, standalone_sandbox):
    runners = tmp_path / "runners.yaml"
    runners.write_text(f"""
phases:
  nightly: {{matrix: [{QUICK}], gpus: [RTX 4090, RTX 3090], reruns: 2}}
runners:
  box-a: {{phase: nightly, gpus: [RTX 4090], models: [qwen2:7b]}}
  box-b: {{phase: nightly, gpus: [RTX 3090]}}
""")
    # 1 s benchmarks: the test checks which runner runs which cells, not what they measure.
    common = ("--gpubench-api", standalone_sandbox, "--gpubench-time-scale", "0.02", "--gpubench-duration", "1s",
              "--gpubench-runners", str(runners))
    first = run_pytest(tmp_path, str(QUICK), *common, "--gpubench-runner", "box-a")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "runner box-a takes RTX 4090, qwen2:7b: 2 of 6 cells of phase nightly" in first.stdout
    rows = {row["id"]: row for row in manifest_rows(tmp_path)}
    phase = {f"nightly/{cell}{rerun}" for cell in ("RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:1.5b",
                                                   "RTX_3090-vastai-qwen2:7b") for rerun in ("", "-rerun2")}
    assert set(rows) == phase  # every cell of the phase registered; the A100 cell is outside it
    assert {rows[f"nightly/RTX_4090-vastai-qwen2:7b{r}"]["status"] for r in ("", "-rerun2")} == {"success"}
    assert sum(row["status"] == "pending" for row in rows.values()) == 4
    # The two runs of one cell shared one rented session.
    assert len({rows[f"nightly/RTX_4090-vastai-qwen2:7b{r}"]["session_id"] for r in ("", "-rerun2")}) == 1

    # The second box runs under xdist: its controller registers, its workers take the share.
    second = run_pytest(tmp_path, str(QUICK), *common, "--gpubench-runner", "box-b", "-n", "2")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    rows = {row["id"]: row for row in manifest_rows(tmp_path)}
    assert set(rows) == phase and sum(row["status"] == "success" for row in rows.values()) == 4

    text = status(tmp_path, "--phase", "nightly", "--cells")
    assert text.startswith("nightly: 4 done (4 success, 0 partial), 0 failed, 0 skipped, 0 claimed, 2 left; 6 cells")
    assert "  left     RTX_4090-vastai-qwen2:1.5b-rerun2" in text
    (run,) = json.loads(status(tmp_path, "--json"))["runs"]
    assert (run["run_id"], run["done"], run["left"], run["total"]) == ("nightly", 4, 2, 6)

    # The phase again under the same run id (day 2, no --gpubench-run-id): nothing runs, and it says so.
    again = run_pytest(tmp_path, str(QUICK), *common, "--gpubench-runner", "box-a")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "2 claimed" in again.stdout and " passed" not in again.stdout.splitlines()[-1]
    assert ("every cell runner box-a takes in phase nightly already ended in run nightly, before this "
            "controller started: nothing runs") in again.stdout
    assert "--gpubench-run-id nightly-" in again.stdout
