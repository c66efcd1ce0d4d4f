"""The runners file (seed 002): phases, runners per host, reruns; and the errors a bad file gets."""

from __future__ import annotations

import pytest

from pytest_gpubench.matrix.cells import parse_matrix
from pytest_gpubench.matrix.runners import RunnersError, load_runners, plan_runner, rerun_id

from e2e_helpers import DEMO_MATRIX

#: Five cells on an RTX 4090 or an A100 80GB, and a T4 cell that no phase below holds.
MATRIX = DEMO_MATRIX + """  - gpu: T4
    provider: vastai
    model: qwen2:7b
"""

RUNNERS = """
phases:
  nightly:
    gpus: [RTX 4090, A100 80GB]
    reruns: 2
  smoke:
    matrix: [gpubench_demo.yaml]
    models: [qwen2]
runners:
  gpu-box-a: {phase: nightly, gpus: [RTX 4090], providers: [tensordock], models: [qwen2:7b]}
  gpu-box-b: {phase: nightly, gpus: [rtx4090, A100 80GB]}
  default: {phase: nightly}
"""


def write(tmp_path, text: str, name: str = "runners.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def cells(tmp_path):
    matrix = write(tmp_path, MATRIX, "gpubench_demo.yaml")
    from pytest_gpubench.matrix.cells import expand

    return expand(parse_matrix(MATRIX, str(matrix)))


def test_a_runners_file_reads_with_its_defaults_and_paths_relative_to_it(tmp_path):
    runners = load_runners(write(tmp_path, RUNNERS))
    nightly, smoke = runners.phases["nightly"], runners.phases["smoke"]
    assert nightly.reruns == 2 and nightly.matrix == () and nightly.gpus == ("RTX 4090", "A100 80GB")
    assert smoke.matrix == (str((tmp_path / "gpubench_demo.yaml").resolve()),) and smoke.reruns == 1
    box = runners.runners["gpu-box-a"]
    assert (box.phase, box.gpus, box.providers, box.models) == ("nightly", ("RTX 4090",), ("tensordock",), ("qwen2:7b",))


def test_each_host_takes_what_its_runner_allows_of_its_phase(tmp_path, cells):
    runners = load_runners(write(tmp_path, RUNNERS))
    box_a = plan_runner(runners, "gpu-box-a")
    taken, left, outside = box_a.split(cells)
    assert [c.cell_id for c in taken] == ["RTX_4090-tensordock-qwen2:7b"]
    assert len(left) == 4 and [c.cell_id for c in outside] == ["T4-vastai-qwen2:7b"]
    assert box_a.summary(2, 12) == (
        "runner gpu-box-a takes RTX 4090 on tensordock, qwen2:7b: 2 of 12 cells of phase nightly")
    # GPU names match as --gpubench-gpu matches them (rtx4090 is 'RTX 4090').
    assert len(plan_runner(runners, "gpu-box-b").split(cells)[0]) == 5
    # A fully qualified hostname finds its short name's runner; any other host is `default`.
    assert plan_runner(runners, "GPU-BOX-A.lab.example").runner == "gpu-box-a"
    other = plan_runner(runners, "ci-7")
    assert (other.runner, other.phase, len(other.split(cells)[0])) == ("default", "nightly", 5)
    assert other.summary(12, 12) == "runner default (host ci-7) takes every cell: 12 of 12 cells of phase nightly"


def test_the_phase_can_be_chosen_and_names_its_files_and_filters(tmp_path, cells):
    runners = load_runners(write(tmp_path, RUNNERS))
    smoke = plan_runner(runners, "ci-7", phase="smoke")
    assert smoke.phase == "smoke"
    assert [c.cell_id for c in smoke.split(cells)[0]] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-tensordock-qwen2:7b", "T4-vastai-qwen2:7b"]
    elsewhere = [c.model_copy(update={"source": str(tmp_path / "gpubench_other.yaml")}) for c in cells]
    assert smoke.split(elsewhere)[0] == []  # not one of the phase's matrix files


def test_reruns_keep_the_first_id_and_suffix_the_others(tmp_path, cells):
    runners = load_runners(write(tmp_path, RUNNERS))
    plan = plan_runner(runners, "gpu-box-a")
    assert plan.test_ids(cells[0]) == ["RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-rerun2"]
    assert rerun_id("x", 1) == "x" and rerun_id("x", 3) == "x-rerun3"
    assert plan_runner(runners, "gpu-box-a", phase="smoke").test_ids(cells[0]) == ["RTX_4090-vastai-qwen2:7b"]


def test_without_runners_every_host_takes_the_only_phase(tmp_path, cells):
    runners = load_runners(write(tmp_path, "phases:\n  nightly:\n"))
    plan = plan_runner(runners, "anywhere")
    assert (plan.phase, plan.runner, len(plan.split(cells)[0])) == ("nightly", "anywhere", len(cells))


@pytest.mark.parametrize(("text", "field", "words"), [
    ("phases: {nightly: {reruns: 0}}", "phases.nightly.reruns", "from 1 to 100"),
    ("phases: {nightly: {reruns: true}}", "phases.nightly.reruns", "from 1 to 100"),
    ("phases: {nightly: {gpus: [1]}}", "phases.nightly.gpus", "list of GPU names"),
    ("phases: {nightly: {providers: 3}}", "phases.nightly.providers", "list of providers"),
    ("phases: {nightly: {colour: red}}", "phases.nightly.colour", "allowed keys: gpus, providers, models, matrix, reruns"),
    ("phases: {}", "phases", "at least one phase"),
    ("phases: {'bad name': {}}", "phases", "a phase name is its run id"),
    ("runners: {a: {phase: x}}", "phases", "required key is missing"),
    ("phases: {n: {}}\nrunners: {a: {phase: nope}}", "runners.a.phase", "no phase 'nope' in this file; phases: n"),
    ("phases: {n: {}}\nrunners: {a: {models: [qwen2], gpu: T4}}", "runners.a.gpu", "unknown key (did you mean 'gpus'?)"),
    ("phases: {n: {}}\nrunners: {'a b': {}}", "runners", "a runner is a host name"),
    ("phases: {n: {}}\nhosts: {}", "hosts", "allowed keys: phases, runners"),
])
def test_a_bad_file_names_the_file_the_field_the_line_and_what_is_allowed(tmp_path, text, field, words):
    path = write(tmp_path, text)
    with pytest.raises(RunnersError) as caught:
        load_runners(path)
    message = str(caught.value)
    assert message.startswith(f"{path.resolve()}: "), message
    assert caught.value.field == field, message
    assert words in message, message
    assert "(line " in message or "missing" in message, message  # a missing key has no line


def test_a_file_that_is_not_a_mapping_or_not_there_says_so(tmp_path):
    with pytest.raises(RunnersError, match="must be a mapping with `phases:`"):
        load_runners(write(tmp_path, "- a list"))
    with pytest.raises(RunnersError, match="cannot read the runners file"):
        load_runners(tmp_path / "missing.yaml")


def test_an_unknown_host_a_missing_phase_and_an_unknown_phase_are_errors(tmp_path):
    no_default = load_runners(write(tmp_path, "phases: {a: {}, b: {}}\nrunners: {box1: {phase: a}, box2: {}}"))
    with pytest.raises(RunnersError, match="no runner for host 'ci-7' and no `default:` entry; runners: box1, box2"):
        plan_runner(no_default, "ci-7")
    with pytest.raises(RunnersError, match=r"runner box2 names no phase and the file has 2 \(a, b\)"):
        plan_runner(no_default, "box2")
    assert plan_runner(no_default, "box2", phase="b").phase == "b"
    with pytest.raises(RunnersError, match="no phase 'c'; phases: a, b"):
        plan_runner(no_default, "box1", phase="c")


def test_the_example_runners_file_plans_over_the_example_matrices():
    from pathlib import Path

    from pytest_gpubench.matrix.cells import load_cells

    folder = Path(__file__).resolve().parents[2] / "matrix"
    runners = load_runners(folder / "runners.yaml")
    quick, seed = load_cells(folder / "gpubench_quick.yaml"), load_cells(folder / "gpubench_seed.yaml")
    box_a, box_b = plan_runner(runners, "gpu-box-a"), plan_runner(runners, "gpu-box-b")
    taken_a, left_a, outside = box_a.split(quick + seed)
    taken_b = box_b.split(quick + seed)[0]
    assert len(taken_a) + len(taken_b) == len(quick) and len(outside) == len(seed)
    assert {c.gpu for c in taken_a} == {"RTX 4090"} and len(left_a) == len(taken_b)
    assert box_a.test_ids(taken_a[0])[1].endswith("-rerun2")
    other = plan_runner(runners, "ci-7")
    assert other.phase == "seed" and other.split(quick)[0] == [] and len(other.split(seed)[0]) == 6
