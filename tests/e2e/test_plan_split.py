"""``gpubench plan -n N`` with reuse groups split over more sessions, and the plan table's
wrapping of long offer ids, against the sandbox's known catalog."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_helpers import SANDBOX_TOKEN, pytest_env

from pytest_gpubench.commands.plan import WRAP_AT, make_plan, render, wrap_text
from pytest_gpubench.cloud.reuse_split import DEFAULT_STAGE_SECONDS
from pytest_gpubench.settings import OPTIONS

REPO = Path(__file__).resolve().parents[2]
SETUP = sum(DEFAULT_STAGE_SECONDS.values())  # 179 s on a real cloud's clock
PRICE = 0.110  # the catalog's cheapest eligible RTX 4090 on vastai (vastai-18430205)

#: One reuse group of four cells, ten minutes each: worth two sessions when two workers are there.
FOUR = """\
workload: {duration: 600, max_tokens: 64, warmup_requests: 1}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b, deepseek-r1:14b, llama3:8b]}
"""


@pytest.fixture(autouse=True)
def _no_gpubench_env(monkeypatch):
    for name in [opt.env for opt in OPTIONS if opt.env] + ["GPUBENCH_API_TOKEN"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUBENCH_API_TOKEN", SANDBOX_TOKEN)  # only the test sandboxes' token


def plan_of(sandbox, path: Path, tmp_path: Path, **kwargs):
    return make_plan([str(path)], api=sandbox.url, manifest=tmp_path / "none" / "manifest.db", **kwargs)


def write(tmp_path: Path, text: str, name: str = "gpubench_split.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_two_workers_split_the_group_and_the_plan_prices_both_choices(sandbox, api, tmp_path):
    path = write(tmp_path, FOUR)
    alone = plan_of(sandbox, path, tmp_path)  # no -n: one session, no split section
    assert alone.split is None and alone.totals.sessions == 1
    plan = plan_of(sandbox, path, tmp_path, workers=2)
    sessions = {s.reuse_group: s for s in plan.sessions}
    assert set(sessions) == {"RTX_4090-vastai/1", "RTX_4090-vastai/2"}
    assert sorted(len(s.cells) for s in sessions.values()) == [2, 2]
    assert all(s.offer_id == "vastai-18430205" for s in sessions.values())
    # Each sub-group's cells run together, its first rents, the next reuses.
    for session in sessions.values():
        cells = [c for c in plan.cells if c.session == session.session]
        assert [c.cell for c in cells] == session.cells and [c.rents_session for c in cells] == [True, False]
    # What it costs: one more setup (every model is pulled once either way), at the offer's price.
    assert plan.totals.gpu_hours - alone.totals.gpu_hours == pytest.approx(SETUP / 3600)
    assert plan.totals.cost_usd - alone.totals.cost_usd == pytest.approx(PRICE * SETUP / 3600)
    # What it gains: two workers each run a sub-group.
    assert plan.totals.wall_seconds_workers == pytest.approx(max(s.seconds for s in sessions.values()))
    assert plan.totals.wall_seconds == pytest.approx(alone.totals.wall_seconds)  # 1 worker splits nothing
    split = plan.split
    assert (split.workers, split.sessions_per_group, split.split_cost) == (2, None, 0.20)
    assert (split.unsplit_sessions, split.unsplit_cost_usd) == (1, pytest.approx(alone.totals.cost_usd))
    assert split.unsplit_wall_seconds_workers == pytest.approx(alone.totals.wall_seconds)
    assert plan.totals.wall_seconds_workers < split.unsplit_wall_seconds_workers * 0.6
    (group,) = split.groups
    assert (group.group, group.cells, group.sessions, group.why) == ("RTX_4090-vastai", 4, 2,
                                                                     "no idle worker left (-n 2)")
    assert sessions_count(api) == 0

    lines = render(plan)
    assert "reuse groups with -n 2 (--gpubench-sessions-per-group auto, --gpubench-split-cost 20%):" in lines
    assert any(line.split()[:4] == ["RTX_4090-vastai", "4", "2", f"+{group.extra_share * 100:.1f}%"]
               for line in lines), lines
    choice = next(line for line in lines if line.startswith("split over "))
    assert choice.startswith(f"split over 2 sessions: ${plan.totals.cost_usd:.4f}, about ")
    assert choice.endswith(" with -n 2")
    other = next(line for line in lines if line.startswith("one session per group: "))
    assert f"1 session(s), ${alone.totals.cost_usd:.4f} (${PRICE * SETUP / 3600:.4f} less)" in other


def test_the_limits_are_the_runs_options(sandbox, tmp_path):
    path = write(tmp_path, FOUR)
    plan = plan_of(sandbox, path, tmp_path, workers=4, options=["--gpubench-sessions-per-group", "1"])
    assert plan.totals.sessions == 1 and plan.split.sessions_per_group == 1
    assert plan.split.groups[0].why.startswith("at the limit of 1 session(s) per group")
    assert "split: none, one session per reuse group (with -n 4, see why above)" in render(plan)
    # Three sessions would add two setups (358 s) to about 2700 s: more than 10%.
    plan = plan_of(sandbox, path, tmp_path, workers=4, options=["--gpubench-split-cost", "10%"])
    assert plan.totals.sessions == 2 and "more than the 10% accepted" in plan.split.groups[0].why
    plan = plan_of(sandbox, path, tmp_path, workers=4)
    assert plan.totals.sessions == 4 and plan.split.groups[0].why == "one session per cell already"
    # With as many groups as workers, nothing is split.
    both = write(tmp_path, FOUR + "  - {gpu: RTX 3090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}\n",
                 name="gpubench_both.yaml")
    plan = plan_of(sandbox, both, tmp_path, workers=2)
    assert plan.totals.sessions == 2 and {g.sessions for g in plan.split.groups} == {1}


def sessions_count(api) -> int:
    return api.get("/api/v1/sessions").json()["count"]


def test_long_offer_ids_wrap_inside_their_column(sandbox, tmp_path):
    path = write(tmp_path, """\
        matrix:
          - gpu: RTX 4090
            provider: tensordock
            models: [qwen2:7b, qwen2:1.5b]
            offer: {min_availability_confidence: {tensordock: 0.2}}
        """)
    plan = plan_of(sandbox, path, tmp_path)
    offer = plan.cells[0].offer_id
    assert len(offer) > 2 * WRAP_AT  # the catalog's TensorDock ids are long
    lines = render(plan)
    header = lines[0]
    column = header.index("offer")
    # The table is no wider than its columns at the wrap width; the id reads whole down its column.
    table = lines[:lines.index("")]
    assert max(len(line) for line in table) < len(header) + 20
    pieces = [line[column:column + WRAP_AT].strip() for line in table[1:]]
    assert "".join(pieces[:3]) == offer and all(len(p) <= WRAP_AT for p in pieces)
    assert table[1].startswith("RTX_4090-tensordock-qwen2:7b ") and table[2].strip() == pieces[1]
    assert table[4].startswith("RTX_4090-tensordock-qwen2:1.5b ")


def test_wrap_text_breaks_after_dashes_and_cuts_what_has_none():
    assert wrap_text("vastai-18430205", 26) == ["vastai-18430205"]
    assert wrap_text("tensordock-436845df-96ff-4808-894f-5e34f3961502-geforcertx4090-pcie-24gb", 26) == [
        "tensordock-436845df-96ff-", "4808-894f-5e34f3961502-", "geforcertx4090-pcie-24gb"]
    assert wrap_text("a" * 30, 12) == ["a" * 12, "a" * 12, "a" * 6]
    assert wrap_text("x-" + "b" * 14 + "-c", 8) == ["x-", "b" * 8, "b" * 6 + "-c"]


def test_command_takes_the_split_options(sandbox, tmp_path):
    path = write(tmp_path, FOUR)
    env = pytest_env()
    base = [sys.executable, "-m", "pytest_gpubench.commands.cli", "plan", str(path), "--api", sandbox.url,
            "--store", str(tmp_path / "none.db"), "-n", "4"]
    done = subprocess.run([*base, "--sessions-per-group", "2"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "split over 2 sessions: $" in done.stdout and "one session per group: 1 session(s)" in done.stdout
    bad = subprocess.run([*base, "--split-cost", "lots"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--gpubench-split-cost: 'lots' must be a percentage such as 25 or 25%" in bad.stderr
