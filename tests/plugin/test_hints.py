"""Names that match nothing: filters that select no cell, GPU names no one knows."""

from __future__ import annotations

import warnings

import pytest
from e2e_helpers import DEMO_MATRIX as MATRIX

from pytest_gpubench.run.hints import (
    KNOWN_GPUS,
    UnknownGpuWarning,
    check_gpu_names,
    gpu_name_problem,
    known_gpus,
    no_match_message,
)
from pytest_gpubench.matrix.cells import load_cells
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.settings import OPTIONS

#: The filter flags as the plugin spells them (a rename keeps these tests right).
FLAG = {opt.dest: opt.flag for opt in OPTIONS if opt.dest in ("gpu", "provider", "model")}



@pytest.fixture
def cells(tmp_path):
    path = tmp_path / "gpubench_demo.yaml"
    path.write_text(MATRIX)
    return load_cells(path)


def test_a_filter_matching_nothing_names_the_values_there_are(cells):
    assert no_match_message(cells, gpus=["4090"]) == (
        "no cell has GPU '4090' (close: RTX 4090); GPUs in these matrix files: A100 80GB, RTX 4090")
    assert no_match_message(cells, providers=["runpod"]) == (
        "no cell has provider 'runpod'; providers in these matrix files: tensordock, vastai")
    assert no_match_message(cells, models=["llama3"]) == (
        "no cell has model 'llama3'; models in these matrix files: deepseek-r1:14b, deepseek-r1:32b, qwen2:7b")
    assert no_match_message(cells, models=["qwen"]) == (  # a family name without its version
        "no cell has model 'qwen' (close: qwen2:7b); models in these matrix files: deepseek-r1:14b, "
        "deepseek-r1:32b, qwen2:7b")
    # Comma-separated values, as the options take them: only the one matching nothing is named.
    assert no_match_message(cells, gpus=["RTX4090,H100"]).startswith("no cell has GPU 'H100';")


def test_filters_matching_only_apart_name_what_the_others_leave(cells):
    assert no_match_message(cells, gpus=["A100 80GB"], providers=["tensordock"]) == (
        "no cell has GPU 'A100 80GB' and provider 'tensordock' together; providers of the cells with "
        "GPU A100 80GB: vastai")
    assert no_match_message(cells, gpus=["RTX 4090"], providers=["tensordock"], models=["deepseek-r1:32b"]) == (
        "no cell has GPU 'RTX 4090' and provider 'tensordock' and model 'deepseek-r1:32b' together; models of "
        "the cells with GPU RTX 4090 and provider tensordock: deepseek-r1:14b, qwen2:7b")


def test_no_message_when_something_matches_or_nothing_is_asked(cells):
    assert no_match_message(cells, gpus=["rtx-4090"], providers=["Vast.ai"]) is None
    assert no_match_message(cells) is None
    assert no_match_message([], gpus=["4090"]) is None


def test_the_known_gpus_include_the_sandbox_catalog_s():
    catalog = {offer.gpu_type for offer in load_catalog().offers}
    assert catalog <= set(known_gpus()) and set(KNOWN_GPUS) <= set(known_gpus())


@pytest.mark.parametrize("name", ["RTX 4090", "rtx-4090", "RTX_4090", "a100 80gb", "H200 NVL"])
def test_known_names_are_fine(name):
    assert gpu_name_problem(name) is None


def test_a_swapped_pair_of_characters_is_an_error_naming_the_gpu_meant():
    kind, message = gpu_name_problem("RTX 4900")
    assert kind == "error"
    assert message.startswith("no GPU is called 'RTX 4900': did you mean RTX 4090?")
    assert gpu_name_problem("RTX 3009")[0] == "error"


@pytest.mark.parametrize(("name", "close"), [
    ("RTX 5080", "RTX 5090"),   # a real GPU the list lacks: a changed digit is how siblings are named
    ("L40S", "L40"),            # a suffix
    ("RTX 4090 D", "RTX 4090"),
    ("A100", "A100 80GB"),
])
def test_other_unknown_names_only_warn_with_the_close_names(name, close):
    kind, message = gpu_name_problem(name)
    assert kind == "warning"
    assert "close known names: " in message and close in message.split("close known names: ")[1].split(")")[0]


def test_an_unknown_name_with_nothing_close_lists_the_known_ones():
    kind, message = gpu_name_problem("Gaudi 3")
    assert kind == "warning" and "known names: A100 80GB, H100" in message


def test_each_name_is_checked_once_per_matrix(tmp_path):
    path = tmp_path / "gpubench_x.yaml"
    path.write_text("matrix:\n  - {gpu: RTX 5080, providers: [vastai, tensordock], models: [qwen2:7b, qwen2:1.5b]}\n"
                    "  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n")
    errors, notes = check_gpu_names(load_cells(path))
    assert errors == [] and len(notes) == 1
    (cell, text), = notes
    assert cell.source == str(path) and text.startswith("matrix[0].gpu: GPU 'RTX 5080' is not one")


# ------------------------------------------------------------------ in pytest


@pytest.fixture
def project(pytester, monkeypatch, closed_port):
    pytester.makefile(".yaml", gpubench_demo=MATRIX)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_API_BASE", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    return pytester


@pytest.mark.parametrize(("args", "line"), [
    ([FLAG["gpu"], "4090"], "gpubench: no cell has GPU '4090' (close: RTX 4090); GPUs in these matrix files: "
                            "A100 80GB, RTX 4090"),
    ([FLAG["provider"], "runpod"], "gpubench: no cell has provider 'runpod'; providers in these matrix files: "
                                   "tensordock, vastai"),
    ([FLAG["model"], "llama3"], "gpubench: no cell has model 'llama3'; models in these matrix files: "
                                "deepseek-r1:14b, deepseek-r1:32b, qwen2:7b"),
])
def test_pytest_says_which_values_exist_when_a_filter_selects_nothing(project, args, line):
    result = project.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([line, "*5 deselected*"])


def test_no_hint_when_k_deselects_what_the_filters_selected(project):
    result = project.runpytest("--collect-only", FLAG["gpu"], "RTX 4090", "-k", "nothing_like_this")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert "gpubench: no cell" not in result.stdout.str()


def test_a_swapped_gpu_name_in_a_matrix_fails_its_collection(project):
    project.makefile(".yaml", gpubench_typo="matrix:\n  - {gpu: RTX 4900, provider: vastai, model: qwen2:7b}\n")
    result = project.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    assert ("gpubench_typo.yaml: matrix[0].gpu: no GPU is called 'RTX 4900': did you mean RTX 4090?"
            in result.stdout.str())
    assert "Traceback" not in result.stdout.str()


def test_an_unknown_gpu_name_in_a_matrix_is_a_warning_and_its_cells_are_collected(project):
    project.makefile(".yaml", gpubench_new="matrix:\n  - {gpu: RTX 5080, provider: vastai, model: qwen2:7b}\n")
    result = project.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["gpubench_new.yaml::RTX_5080-vastai-qwen2:7b", "*warnings summary*",
                                 "gpubench_new.yaml:0",
                                 "*UnknownGpuWarning: matrix?0?.gpu: GPU 'RTX 5080' is not one the sandbox catalog "
                                 "or the seeds know (close known names: RTX 5090*"])


def test_the_warning_class_is_a_user_warning():
    with pytest.warns(UserWarning):
        warnings.warn(UnknownGpuWarning("x"), stacklevel=1)


@pytest.mark.slow
def test_a_real_run_with_xdist_says_it_too(project):
    result = project.runpytest_subprocess(FLAG["gpu"], "4090", "--gpubench-sandbox", "-n", "2",
                                          "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["gpubench: no cell has GPU '4090' (close: RTX 4090); GPUs in these matrix files: "
                                 "A100 80GB, RTX 4090"])
