"""Splitting a reuse group over more sessions when -n workers would idle (reuse_split.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from pytest_gpubench.plugin.xdist import GROUPS_INPUT, GroupsChannel, WorkerGroups
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.plugin.run_hooks import arrange_reuse_groups
from pytest_gpubench.cloud.reuse_split import SplitPolicy, reservation_seconds, split_groups
from pytest_gpubench.run.session_pool import SessionPool
from pytest_gpubench.settings import DEFAULT_SPLIT_COST, Settings, resolve
from pytest_gpubench.plugin.stash import CELL_KEY, GROUP_KEY, RECORD_KEY, REUSE_GROUPS_KEY, SETTINGS_KEY

# Pulls are waits on the run's clock: at time scale 0 only the benchmarks count, which
# keeps the arithmetic readable (setup 0 too, so every split pays off unless a rule says no).
FOUR = """
models:
  m600:1b: {vram_gb: 1}
  m300:1b: {vram_gb: 1}
  m200:1b: {vram_gb: 1}
  m100:1b: {vram_gb: 1}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: m600:1b, workload: {duration: 600}}
  - {gpu: RTX 4090, provider: vastai, model: m300:1b, workload: {duration: 300}}
  - {gpu: RTX 4090, provider: vastai, model: m200:1b, workload: {duration: 200}}
  - {gpu: RTX 4090, provider: vastai, model: m100:1b, workload: {duration: 100}}
"""


def cells_of(text: str, name: str = "gpubench_split.yaml"):
    return expand(parse_matrix(text, name))


def groups(cells) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for cell in cells:
        found.setdefault(str(cell.session_group), []).append(cell.model)
    return found


def scaled0(**kwargs) -> SplitPolicy:
    return SplitPolicy(time_scale=0.0, **kwargs)


def test_no_split_without_idle_workers():
    cells = cells_of(FOUR)
    # One worker (no -n, or another --dist): nothing runs beside the group; no decision at all.
    same, decisions = split_groups(cells, scaled0(workers=1))
    assert same == cells and decisions == []
    # Two groups on two workers: both busy, neither is split.
    two = cells_of(FOUR + FOUR.split("matrix:\n")[1].replace("RTX 4090", "RTX 3090"))
    same, decisions = split_groups(two, scaled0(workers=2))
    assert {c.session_group for c in same} == {"RTX_4090-vastai", "RTX_3090-vastai"}
    assert [(d.sessions, d.why) for d in decisions] == [(1, "no idle worker left (-n 2)")] * 2


FIVE = """
models: {m500:1b: {vram_gb: 1}, m400:1b: {vram_gb: 1}, m300:1b: {vram_gb: 1}, m200:1b: {vram_gb: 1},
         m100:1b: {vram_gb: 1}}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: m100:1b, workload: {duration: 100}}
  - {gpu: RTX 4090, provider: vastai, model: m200:1b, workload: {duration: 200}}
  - {gpu: RTX 4090, provider: vastai, model: m300:1b, workload: {duration: 300}}
  - {gpu: RTX 4090, provider: vastai, model: m400:1b, workload: {duration: 400}}
  - {gpu: RTX 4090, provider: vastai, model: m500:1b, workload: {duration: 500}}
"""


def test_a_group_is_balanced_longest_first_and_the_same_in_any_order():
    cells = cells_of(FIVE)
    split, (decision,) = split_groups(cells, scaled0(workers=2))
    # Longest first, each to the least loaded: 500 | 400, 300 -> B, 200 -> A, 100 -> B... 800 | 700.
    assert groups(split) == {"RTX_4090-vastai/1": ["m100:1b", "m200:1b", "m500:1b"],
                             "RTX_4090-vastai/2": ["m300:1b", "m400:1b"]}  # cells keep their order
    assert (decision.sessions, decision.seconds, decision.longest_seconds) == (2, 1500, 800)
    assert decision.why == "no idle worker left (-n 2)"
    split3, (decision,) = split_groups(cells, scaled0(workers=3))
    assert groups(split3) == {"RTX_4090-vastai/1": ["m500:1b"], "RTX_4090-vastai/2": ["m100:1b", "m400:1b"],
                              "RTX_4090-vastai/3": ["m200:1b", "m300:1b"]}
    assert decision.longest_seconds == 500
    # Deterministic: every worker and the controller see the cells in their own order.
    for seed in range(5):
        shuffled = list(cells)
        random.Random(seed).shuffle(shuffled)
        again, _ = split_groups(shuffled, scaled0(workers=3))
        assert {c.model: c.session_group for c in again} == {c.model: c.session_group for c in split3}
    # Splitting what is split already gives the same answer (session_part is recomputed).
    assert split_groups(split3, scaled0(workers=3))[0] == split3
    assert split_groups(split3, scaled0(workers=1))[0] == cells


def test_the_sessions_per_group_limit_is_respected():
    cells = cells_of(FIVE)
    split, (decision,) = split_groups(cells, scaled0(workers=8, limit=2))
    assert set(groups(split)) == {"RTX_4090-vastai/1", "RTX_4090-vastai/2"}
    assert decision.why == "at the limit of 2 session(s) per group (--gpubench-sessions-per-group)"
    split, (decision,) = split_groups(cells, scaled0(workers=8, limit=1))
    assert set(groups(split)) == {"RTX_4090-vastai"} and decision.sessions == 1
    # Without a limit: 3 sessions (500 s each); a fourth cannot beat the 500 s cell.
    split, (decision,) = split_groups(cells, scaled0(workers=8))
    assert len(groups(split)) == 3 and decision.why == "4 sessions would save 0 s of wall time for 0 s more GPU time"


SEED_LIKE = """
workload: {duration: 300}
matrix:
  - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, deepseek-r1:14b, deepseek-r1:32b]}
"""


def test_the_extra_cost_accepted_is_respected():
    # Real clock: each new session costs 179 s of setup. On one session the group takes
    # 179 + pulls (64 + 96 + 192) + 3 x 300 = 1431 s; two sessions add 179 s (12.5%), three 358 s (25%).
    cells = cells_of(SEED_LIKE)
    assert DEFAULT_SPLIT_COST == 0.20
    split, (decision,) = split_groups(cells, SplitPolicy(workers=8))
    assert decision.sessions == 2 and decision.seconds == pytest.approx(1431)
    assert decision.extra_share == pytest.approx(179 / 1431)
    assert decision.why == ("3 sessions would add 25% to its GPU time, more than the 20% accepted "
                            "(--gpubench-split-cost)")
    assert groups(split) == {"RTX_4090-vastai/1": ["deepseek-r1:32b"],
                             "RTX_4090-vastai/2": ["qwen2:7b", "deepseek-r1:14b"]}
    assert split_groups(cells, SplitPolicy(workers=8, max_extra_share=0.30))[1][0].sessions == 3
    _, (decision,) = split_groups(cells, SplitPolicy(workers=8, max_extra_share=0.10))
    assert decision.sessions == 1 and "more than the 10% accepted" in decision.why
    # The sandbox's clock makes setups cheap: every cell gets its session.
    assert split_groups(cells, SplitPolicy(workers=8, time_scale=0.02))[1][0].sessions == 3


def test_a_split_must_save_more_wall_time_than_it_adds():
    cells = cells_of("""
models: {big:1b: {vram_gb: 1}, small:1b: {vram_gb: 1}}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: big:1b, workload: {duration: 1000}}
  - {gpu: RTX 4090, provider: vastai, model: small:1b, workload: {duration: 10}}
""")
    split, (decision,) = split_groups(cells, SplitPolicy(workers=4))  # 179 s of setup to save 18 s
    assert decision.sessions == 1 and {c.session_group for c in split} == {"RTX_4090-vastai"}
    assert decision.why == "2 sessions would save 18 s of wall time for 179 s more GPU time"


def test_only_the_groups_that_set_the_wall_time_are_split():
    cells = cells_of(FOUR + """
  - {gpu: RTX 3090, provider: vastai, models: [m100:1b, m200:1b]}
""")
    split, decisions = split_groups(cells, scaled0(workers=8))
    by_group = {d.group: d for d in decisions}
    assert by_group["RTX_4090-vastai"].sessions == 2  # 600 | 300 + 200 + 100: its longest part is 600 s
    # 300 s is shorter than the 600 s the 4090 group's longest cell takes: splitting it costs, saves nothing.
    assert by_group["RTX_3090-vastai"].sessions == 1
    assert by_group["RTX_3090-vastai"].why == ("splitting it would not end the run sooner: "
                                               "RTX_4090-vastai sets the wall time")
    # Two groups that tie are split together, or not at all.
    twins = cells_of(FOUR + FOUR.split("matrix:\n")[1].replace("RTX 4090", "RTX 3090"))
    assert [d.sessions for d in split_groups(twins, scaled0(workers=3))[1]] == [1, 1]
    assert [d.sessions for d in split_groups(twins, scaled0(workers=4))[1]] == [2, 2]
    # A cell alone that takes longest sets the wall time: nothing to gain.
    lone = cells_of(FOUR + "  - {gpu: H100, provider: vastai, model: m100:1b, workload: {duration: 5000}}\n")
    split, (decision,) = split_groups(lone, scaled0(workers=8))
    assert decision.sessions == 1 and decision.why.startswith("a cell alone sets the wall time")


def test_reuse_cell_and_non_matrix_items_are_left_alone():
    cells = cells_of("reuse: cell\n" + FOUR)
    split, decisions = split_groups([None, *cells], scaled0(workers=8))
    assert split == [None, *cells] and decisions == []


def test_settings_take_the_limit_and_the_accepted_cost():
    settings = resolve({"sessions_per_group": "auto"}, {"GPUBENCH_SPLIT_COST": "12.5%"}, lambda key: None)
    assert (settings.sessions_per_group, settings.split_cost) == (None, 0.125)
    settings = resolve({}, {}, lambda key: {"gpubench_sessions_per_group": "2"}.get(key))
    assert (settings.sessions_per_group, settings.split_cost) == (2, DEFAULT_SPLIT_COST)
    policy = SplitPolicy.from_settings(settings, 4)
    assert (policy.workers, policy.limit, policy.max_extra_share) == (4, 2, DEFAULT_SPLIT_COST)
    for bad, says in (({"sessions_per_group": "0"}, "must be auto or a whole number"),
                      ({"split_cost": "lots"}, "must be a percentage such as 25 or 25%"),
                      ({"split_cost": "-5%"}, "must be a percentage from 0 to 1000")):
        with pytest.raises(Exception, match=says):
            resolve(bad, {}, lambda key: None)


class _Item:
    """What arrange_reuse_groups reads and writes of a pytest item: its stash and markers."""

    def __init__(self, key: str, cell) -> None:
        self.stash = pytest.Stash()
        self.stash[CELL_KEY], self.stash[RECORD_KEY] = cell, key
        self.markers: list = []

    def add_marker(self, marker) -> None:
        self.markers.append(marker)


def test_collection_on_a_worker_makes_each_sub_group_a_reuse_group_of_its_own():
    cells = cells_of(FIVE)
    config = SimpleNamespace(stash=pytest.Stash(), workerinput={"gpubench_loadgroup": True, "workercount": 2})
    config.stash[SETTINGS_KEY] = Settings(time_scale=0.0)
    items = [_Item(c.cell_id, c) for c in cells]
    arrange_reuse_groups(config, items)  # type: ignore[arg-type]
    groups_seen = [item.stash[GROUP_KEY] for item in items]
    # Each sub-group together, the longer (800 s) first; the fixtures get the split cell.
    assert groups_seen == ["RTX_4090-vastai/1"] * 3 + ["RTX_4090-vastai/2"] * 2
    assert [item.stash[CELL_KEY].session_group for item in items] == groups_seen
    assert [m.args for item in items for m in item.markers] == [(g,) for g in groups_seen]
    members = config.stash[REUSE_GROUPS_KEY]
    assert {g: [key for key, _ in m] for g, m in members.items()} == {
        "RTX_4090-vastai/1": ["RTX_4090-vastai-m100:1b", "RTX_4090-vastai-m200:1b", "RTX_4090-vastai-m500:1b"],
        "RTX_4090-vastai/2": ["RTX_4090-vastai-m300:1b", "RTX_4090-vastai-m400:1b"]}
    # A session rented for a sub-group is sized, reserved and budgeted for its own cells only.
    pool = SessionPool(None, members)  # type: ignore[arg-type]
    first = items[3].stash[CELL_KEY]
    planned = pool.remaining(items[3].stash[RECORD_KEY], first)
    assert [c.model for c in planned] == ["m300:1b", "m400:1b"]
    assert reservation_seconds(planned) == 300 + 8 + 400  # the second cell pulls its 1 GB model too
    # Without xdist's loadgroup, or with one worker: nothing is split.
    for workerinput in ({"gpubench_loadgroup": False, "workercount": 2}, {"gpubench_loadgroup": True,
                                                                          "workercount": 1}):
        config.workerinput = workerinput
        items = [_Item(c.cell_id, c) for c in cells]
        arrange_reuse_groups(config, items)  # type: ignore[arg-type]
        assert {item.stash[GROUP_KEY] for item in items} == {"RTX_4090-vastai"}


def test_the_controller_s_scheduler_gets_the_sub_groups_the_workers_decided(tmp_path):
    """Workers write their grouped cells before xdist sends their collection; the controller
    decides nothing itself (no matrix parsed twice, Python tests on cells included)."""
    cells = cells_of(FIVE)
    config = SimpleNamespace(stash=pytest.Stash(), workerinput={"gpubench_loadgroup": True, "workercount": 2})
    config.stash[SETTINGS_KEY] = Settings(time_scale=0.0)
    items = [_Item(c.cell_id, c) for c in cells]
    arrange_reuse_groups(config, items)  # type: ignore[arg-type]
    lone = _Item("H100-vastai-m100:1b", cells_of(FIVE.replace("RTX 4090", "H100"))[0])
    lone.stash[GROUP_KEY] = "H100-vastai"  # a group of one cell: a unit of its own, not reported
    for item in [*items, lone]:
        item.nodeid = f"gpubench_split.yaml::{item.stash[RECORD_KEY]}"
    channel = GroupsChannel()
    try:
        node = SimpleNamespace(workerinput={GROUPS_INPUT: str(channel.path_for("gw0"))})
        assert channel.groups_of(node) == {}  # nothing reported (yet): nothing grouped
        WorkerGroups(channel.path_for("gw0")).pytest_collection_finish(
            SimpleNamespace(config=config, items=[*items, lone]))  # type: ignore[arg-type]
        assert channel.groups_of(node) == {item.nodeid: item.stash[GROUP_KEY] for item in items}
        assert {g for g in channel.groups_of(node).values()} == {"RTX_4090-vastai/1", "RTX_4090-vastai/2"}
    finally:
        channel.remove()
    assert not channel.folder.exists()


def test_groups_that_tie_but_cannot_all_split_again_stay_as_they_are():
    # Four equal groups of three 300 s cells, ten workers: all go to two sessions (8 units,
    # 600 s each at most); a third session each would need twelve workers. Splitting only
    # some would not end the run sooner: none is split again.
    rows = "".join(f"  - {{gpu: {gpu}, provider: vastai, models: [m100:1b, m200:1b, m300:1b]}}\n"
                   for gpu in ("RTX 3090", "RTX 4090", "RTX 5090", "H100"))
    cells = cells_of(FOUR.split("matrix:")[0] + "matrix:\n" + rows)
    _, decisions = split_groups(cells, scaled0(workers=10))
    assert [(d.group, d.sessions, d.longest_seconds) for d in decisions] == [
        ("H100-vastai", 2, 600), ("RTX_3090-vastai", 2, 600), ("RTX_4090-vastai", 2, 600), ("RTX_5090-vastai", 2, 600)]
    assert [d.why for d in decisions] == [
        "splitting it would not end the run sooner: RTX_4090-vastai, RTX_5090-vastai set the wall time"] * 2 + [
        "no idle worker left (-n 10)"] * 2


def test_cells_of_two_clouds_are_split_and_pooled_as_two_groups():
    """The same GPU and marketplace through two ``cloud:``s: two reuse groups, never one session."""
    shopper, moon = cells_of(FOUR), cells_of("cloud: moon\n" + FOUR, "gpubench_moon.yaml")
    same, decisions = split_groups(shopper + moon, scaled0(workers=2))
    assert {c.session_group for c in same} == {"RTX_4090-vastai", "RTX_4090-vastai-cloud_moon"}
    assert len(decisions) == 2 and all(d.sessions == 1 for d in decisions)
