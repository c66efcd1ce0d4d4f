"""Pay once per GPU: cells of one GPU and provider share a session (session_pool.py)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
import sqlite_utils
from e2e_helpers import SANDBOX_AUTH, PytestRun, assert_every_session_released, run_pytest, sandbox_sessions
from polling import wait_for

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.store.progress import read_progress
from pytest_gpubench.remote.sysinfo import parse_df
from pytest_gpubench.cloud.reuse_split import disk_gb_for, estimated_cell_seconds, order_for_reuse

ORDER_MATRIX = """
workload: {duration: 60}
matrix:
  - {gpu: RTX 3090, provider: vastai, models: [qwen2:7b]}
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
  - {gpu: RTX 3090, provider: tensordock, models: [qwen2:7b], reuse: cell}
  - {gpu: RTX 3090, provider: vastai, models: [deepseek-r1:14b]}
  - {gpu: H100, provider: vastai, models: [qwen2:7b], workload: {duration: 600}}
"""


def test_matrix_reuse_key_defaults_to_group_and_rows_may_opt_out():
    cells = {c.cell_id: c for c in expand(parse_matrix(ORDER_MATRIX, "gpubench_o.yaml"))}
    assert cells["RTX_4090-vastai-qwen2:7b"].session_group == "RTX_4090-vastai"
    assert cells["RTX_3090-tensordock-qwen2:7b"].session_group is None  # reuse: cell
    whole = expand(parse_matrix("reuse: cell\n" + ORDER_MATRIX, "gpubench_o.yaml"))
    assert {c.session_group for c in whole} == {None}
    with pytest.raises(MatrixError) as bad:
        parse_matrix("reuse: always\n" + ORDER_MATRIX, "gpubench_o.yaml")
    assert "reuse" in str(bad.value) and "'group'" in str(bad.value) and "'cell'" in str(bad.value)


def test_order_puts_each_group_together_longest_first_and_singles_stay_alone():
    cells = expand(parse_matrix(ORDER_MATRIX, "gpubench_o.yaml"))
    order = [cells[i].cell_id for i in order_for_reuse(cells)]
    assert order == [
        "H100-vastai-qwen2:7b",  # 600 s: the longest group starts first
        "RTX_3090-vastai-qwen2:7b", "RTX_3090-vastai-deepseek-r1:14b",  # 2 x 60 s + pulls, together
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:1.5b",
        "RTX_3090-tensordock-qwen2:7b",  # reuse: cell, one of its own
    ]
    # Stable: the same input gives the same order (every xdist worker must agree).
    assert order_for_reuse(cells) == order_for_reuse(list(cells))
    assert order_for_reuse([None, cells[0], None]) == [1, 0, 2]
    assert estimated_cell_seconds(cells[0], runs=3) == pytest.approx(8.0 * 8 + 180)


def test_disk_is_sized_for_the_largest_model_and_df_is_parsed():
    cells = expand(parse_matrix("""
matrix: [{gpu: H100, provider: vastai, models: [qwen2:7b, deepseek-r1:70b]}]
""", "gpubench_d.yaml"))
    assert disk_gb_for(cells[:1]) == 50  # the provider default is already enough
    assert disk_gb_for(cells) == 15 + 48 + 5
    df = ("Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
          "overlay           52428800 15728640  36700160      30% /\n")
    assert parse_df(df) == (52428800 * 1024, 36700160 * 1024)
    assert parse_df("") == (None, None) and parse_df("df: /x: No such file or directory") == (None, None)


# ------------------------------------------------------------------ end to end
# The matrices below benchmark for 1 s without a warmup: these tests check who rents, reuses
# and releases which session, figures that do not depend on how long a cell measures (each
# second saved is paid once per cell, about 30 cells in this module).

GROUP_MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:1.5b, qwen2:7b, deepseek-r1:14b]}
  - {gpu: RTX 3090, provider: vastai, models: [qwen2:1.5b]}
"""


def run_matrix(tmp_path, url: str, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
    matrix = tmp_path / "gpubench_reuse.yaml"
    matrix.write_text(text)
    return run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-rs", *extra)


def rows_by_cell(tmp_path) -> dict[str, dict]:
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    return {row["cell_id"]: row for row in db["benchmark_manifest"].rows}


def attempts_of(tmp_path) -> list[dict]:
    return list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["attempts"].rows)


def statuses(row: dict) -> list[str]:
    """The STATUS words of a cell's progress file, in order."""
    return [line.label for line in read_progress(row["progress_file"]) if line.kind == "STATUS"]


@pytest.mark.slow
def test_one_session_serves_every_model_of_its_group(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, GROUP_MATRIX)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 passed" in done.stdout
    rows = rows_by_cell(tmp_path)
    group = [rows[f"RTX_4090-vastai-{m}"] for m in ("qwen2:1.5b", "qwen2:7b", "deepseek-r1:14b")]
    assert len({row["session_id"] for row in group}) == 1
    assert [row["session_turn"] for row in group] == [1, 2, 3]
    assert {row["session_owner"] for row in group} == {"RTX_4090-vastai-qwen2:1.5b"}
    assert all(row["status"] == "success" and row["session_status"] == "stopped" for row in group)
    # Two sessions in all (one per GPU), both released; the 4090's was asked for 50 GB of disk.
    sessions = sandbox_sessions(url)
    assert sorted(s["gpu_type"] for s in sessions) == ["RTX 3090", "RTX 4090"]
    assert_every_session_released(url)
    # The bill: one attempt for the group, and the cells' shares add up to it.
    (attempt,) = [a for a in attempts_of(tmp_path) if a["session_id"] == group[0]["session_id"]]
    shares = sum(row["cost_usd"] for row in group)
    assert shares == pytest.approx(attempt["cost_usd"], rel=0.1)
    # Later cells neither rented nor installed anything: they found Ollama and pulled their model.
    later = statuses(group[1])
    assert "SESSION_REUSED" in later and "SESSION_KEPT" in later and "PROVISIONING" not in later
    assert "installed_now=false" in "\n".join(line.raw for line in read_progress(group[1]["progress_file"]))
    assert "SESSION_RELEASE" in statuses(group[2]) and "SESSION_RELEASE" not in statuses(group[0])
    # System detection: recorded once per session, by the cell that connected first.
    systems = {row["session_id"]: row for row in
               sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["systems"].rows}
    assert len(systems) == 2 and systems[group[0]["session_id"]]["manifest_id"] == group[0]["id"]
    assert {row["source"] for row in systems.values()} == {"nvidia-smi-xml"}


@pytest.mark.slow
def test_reuse_cell_rents_one_session_per_cell(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, GROUP_MATRIX, "-k", "4090 and qwen2", "--gpubench-reuse", "cell")
    assert done.returncode == 0, done.stdout[-3000:]
    rows = rows_by_cell(tmp_path)
    assert len({row["session_id"] for row in rows.values()}) == 2 == len(sandbox_sessions(url))
    assert all(row["session_turn"] is None for row in rows.values())
    assert_every_session_released(url)


FAILING_MIDDLE = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
models:
  nosuchmodel:7b: {vram_gb: 6}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:1.5b, nosuchmodel:7b, qwen2:7b]}
"""


@pytest.mark.slow
def test_a_cell_failing_on_its_own_leaves_the_session_to_the_rest_of_its_group(
        tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, FAILING_MIDDLE)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "2 passed" in done.stdout and "1 failed" in done.stdout
    rows = rows_by_cell(tmp_path)
    bad = rows["RTX_4090-vastai-nosuchmodel:7b"]
    assert (bad["status"], bad["failure_stage"]) == ("failed", "model_pull")
    assert rows["RTX_4090-vastai-qwen2:7b"]["status"] == "success"
    assert len({row["session_id"] for row in rows.values()}) == 1 == len(sandbox_sessions(url))
    assert rows["RTX_4090-vastai-qwen2:7b"]["session_turn"] == 3
    assert_every_session_released(url)


@pytest.mark.slow
def test_an_instance_lost_mid_group_ends_only_its_cell_and_the_rest_rent_anew(
        tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_reuse.yaml"
    # Long enough to be killed mid-benchmark, with a warmup as a user's run has.
    matrix.write_text(GROUP_MATRIX.replace("duration: 1s, max_tokens: 16, warmup_requests: 0",
                                           "duration: 4s, max_tokens: 32, warmup_requests: 1"))
    run = PytestRun(tmp_path, url, "--rootdir", str(tmp_path), "-k", "4090", target=matrix)
    # Kill the instance while the group's second cell measures.
    progress = tmp_path / "reports" / "progress"

    def second_cell_measuring():
        logs = [p for p in progress.rglob("*qwen2_7b.log") if "PROGRESS: requests=" in p.read_text()]
        return logs and [s for s in sandbox_sessions(url) if s["status"] == "running"]

    (session,) = wait_for(second_cell_measuring, 180, "the second cell's benchmark")
    httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
               json={"fault": "kill_instance", "session_id": session["id"]}
               ).raise_for_status()
    output = run.finish()
    rows = rows_by_cell(tmp_path)
    first, second_row, third = (rows[f"RTX_4090-vastai-{m}"] for m in ("qwen2:1.5b", "qwen2:7b", "deepseek-r1:14b"))
    assert first["status"] == "success", output[-3000:]
    assert second_row["status"] in ("partial", "failed") and second_row["failure_stage"] == "benchmark"
    assert "the API reports session" in second_row["error_message"]
    # The third cell rented a new session and ran.
    assert third["status"] == "success" and third["session_id"] != session["id"], output[-3000:]
    assert third["session_turn"] is None or third["session_turn"] == 1
    assert len(sandbox_sessions(url)) == 2
    assert_every_session_released(url)


SWEEP_MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s, concurrency: [1, 4]}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:1.5b]}
"""


@pytest.mark.slow
def test_a_concurrency_sweep_shares_the_session_and_restarts_ollama_for_its_parallelism(
        tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, SWEEP_MATRIX)
    assert done.returncode == 0, done.stdout[-3000:]
    rows = rows_by_cell(tmp_path)
    assert len({row["session_id"] for row in rows.values()}) == 1 == len(sandbox_sessions(url))
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    c4 = rows["RTX_4090-vastai-qwen2:1.5b-c4"]
    details = json.loads(db.execute("select details_json from benchmarks where id = ?",
                                    [c4["benchmark_id"]]).fetchone()[0])
    assert details["runtime"]["num_parallel"] == 4  # restarted for this cell's concurrency


@pytest.mark.slow
def test_groups_stay_on_one_worker_under_xdist(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, GROUP_MATRIX, "-n", "2")
    assert done.returncode == 0, done.stdout[-3000:]
    rows = rows_by_cell(tmp_path)
    group = [row for cell_id, row in rows.items() if cell_id.startswith("RTX_4090")]
    assert len({row["worker"] for row in group}) == 1
    assert len({row["session_id"] for row in group}) == 1
    assert len(sandbox_sessions(url)) == 2
    assert_every_session_released(url)


SPLIT_MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:1.5b, qwen2:7b, deepseek-r1:14b, llama3:8b]}
"""


#: pytest 9.2 keeps node ids in ``_id``, so xdist's ``nodeid@group`` renaming no longer takes:
#: this conftest undoes the renaming on pytest 9.0, to check that the groups the workers
#: report to the controller's scheduler are enough.
IDS_AS_ON_PYTEST_9_2 = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if "@" in getattr(item, "_nodeid", ""):
            item._nodeid = item._nodeid.split("@", 1)[0]
"""


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["chosen-by-the-plugin", "loadgroup-xdist-renames", "loadgroup-pytest-9.2"])
def test_with_idle_workers_a_group_is_split_over_sessions_that_each_serve_their_cells(
        tmp_path, standalone_sandbox, dist):  # noqa: F811
    url = standalone_sandbox
    if dist == "loadgroup-pytest-9.2":
        (tmp_path / "conftest.py").write_text(IDS_AS_ON_PYTEST_9_2)
    given = [] if dist == "chosen-by-the-plugin" else ["--dist", "loadgroup"]
    # One group, two workers: without the split one worker would idle (see test above).
    done = run_matrix(tmp_path, url, SPLIT_MATRIX, "-n", "2", *given, "--gpubench-sessions-per-group", "2",
                      "--gpubench-split-cost", "50")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 passed" in done.stdout
    rows = rows_by_cell(tmp_path)
    by_group: dict[str, list[dict]] = {}
    for row in sorted(rows.values(), key=lambda r: r["session_turn"] or 0):
        by_group.setdefault(row["reuse_group"], []).append(row)
    assert set(by_group) == {"RTX_4090-vastai/1", "RTX_4090-vastai/2"}, rows
    # Two sessions, one per sub-group, each on its own worker; within one, cells reuse it.
    assert len({row["session_id"] for row in rows.values()}) == 2 == len(sandbox_sessions(url))
    assert len({row["worker"] for row in rows.values()}) == 2
    for members in by_group.values():
        assert len(members) == 2 and len({row["session_id"] for row in members}) == 1
        assert len({row["worker"] for row in members}) == 1
        assert [row["session_turn"] for row in members] == [1, 2]
        assert "SESSION_REUSED" in statuses(members[1]) and "PROVISIONING" not in statuses(members[1])
    assert all(row["status"] == "success" for row in rows.values())
    # Each session's bill is its attempt, and its cells' shares add up to it.
    for members in by_group.values():
        (attempt,) = [a for a in attempts_of(tmp_path) if a["session_id"] == members[0]["session_id"]]
        assert sum(row["cost_usd"] for row in members) == pytest.approx(attempt["cost_usd"], rel=0.1)
    assert_every_session_released(url)


DISK_MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
matrix:
  - {gpu: RTX 3090, provider: vastai, models: [qwen2:7b, deepseek-r1:14b, deepseek-r1:32b, llama3:8b]}
"""


@pytest.mark.slow
def test_earlier_models_are_removed_when_the_next_would_not_fit_the_disk(tmp_path, standalone_sandbox):  # noqa: F811
    # A 50 GB disk (15 + 24 + 5 is less) with 15 GB of system holds the first three
    # models (33 GB) but then has about 4 GB free: llama3:8b (8 GB) needs the oldest gone.
    url = standalone_sandbox
    done = run_matrix(tmp_path, url, DISK_MATRIX)
    assert done.returncode == 0, done.stdout[-3000:]
    rows = rows_by_cell(tmp_path)
    assert all(row["status"] == "success" for row in rows.values()), done.stdout[-3000:]
    order = ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b", "llama3:8b"]
    removed = [line.fields for model in order for line in read_progress(rows[f"RTX_3090-vastai-{model}"]
                                                                          ["progress_file"])
               if line.label == "MODEL_REMOVED"]
    assert removed and removed[0]["model"] == "qwen2:7b", removed  # oldest first
    assert all(float(r["free_gb"]) < float(r["needed_gb"]) for r in removed)
    assert "llama3:8b" not in [r["model"] for r in removed]
    assert len({row["session_id"] for row in rows.values()}) == 1 == len(sandbox_sessions(url))
