"""The plugin as users meet it: collection, ids, selection, errors. (pytester)"""

import textwrap

import pytest

MATRIX = """
workload: {duration: 5s, max_tokens: 32}
offer:
  min_availability_confidence: {default: 0.5, tensordock: 0.2}
matrix:
  - gpu: RTX 4090
    providers: [vastai, tensordock]
    models: [qwen2:7b, deepseek-r1:14b]
  - gpu: A100 80GB
    provider: vastai
    model: deepseek-r1:32b
"""


@pytest.fixture
def project(pytester, closed_port, monkeypatch):
    pytester.makefile(".yaml", gpubench_demo=MATRIX)
    pytester.makefile(".yaml", other="not: [a, matrix")  # not matched: left alone
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_API_BASE", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    return pytester


def test_one_item_per_cell_with_readable_ids(project):
    result = project.runpytest("--collect-only", "-q")
    # In run order: each reuse group (GPU + provider) together, the longest first
    # (the 32B model's pull outweighs the others' second benchmark of 5 s).
    result.stdout.fnmatch_lines([
        "gpubench_demo.yaml::A100_80GB-vastai-deepseek-r1:32b",
        "gpubench_demo.yaml::RTX_4090-vastai-qwen2:7b",
        "gpubench_demo.yaml::RTX_4090-vastai-deepseek-r1:14b",
        "gpubench_demo.yaml::RTX_4090-tensordock-qwen2:7b",
        "gpubench_demo.yaml::RTX_4090-tensordock-deepseek-r1:14b",
        "5 tests collected*",
    ])
    assert result.ret == 0
    # --collect-only touched no network: the API port is closed and nothing complained.
    assert "no GPU Shopper API" not in result.stdout.str()
    assert not (project.path / "reports" / "manifest.db").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-k", "deepseek"], 3),
        (["-k", "4090 and vastai"], 2),
        (["-k", "RTX4090"], 4),
        (["--gpubench-gpu", "RTX4090"], 4),
        (["--gpubench-gpu", "rtx 4090", "--gpubench-provider", "tensordock"], 2),
        (["--gpubench-model", "deepseek-r1"], 3),
        (["--gpubench-model", "deepseek-r1:14b", "--gpubench-model", "qwen2:7b"], 4),
        (["--gpubench-gpu", "A100"], 0),  # exact after normalising: "A100" is not "A100 80GB"
    ],
)
def test_selection(project, args, expected):
    result = project.runpytest("--collect-only", "-q", *args)
    outcome = result.parseoutcomes()
    if expected:
        assert f"{expected}/5 tests collected" in result.stdout.str()
    assert outcome.get("deselected", 0) == 5 - expected


def test_filters_report_deselected(project):
    result = project.runpytest("--collect-only", "--gpubench-gpu", "A100 80GB")
    assert result.parseoutcomes()["deselected"] == 4


def test_gpubench_files_ini_changes_what_is_collected(project):
    project.makeini("[pytest]\ngpubench_files = other_*.yaml\n")
    result = project.runpytest("--collect-only", "-q")
    assert result.ret == 5  # no tests: gpubench_demo.yaml no longer matches


def test_bad_matrix_fails_collection_in_one_line(project):
    project.makefile(".yaml", gpubench_bad="matrix:\n  - gpu: RTX 4090\n    provider: vastai\n"
                                           "    model: qwen2:7b\n    workload: {duration: -5}\n")
    result = project.runpytest("--collect-only", "-q")
    assert result.ret == 2
    out = result.stdout.str()
    assert "gpubench_bad.yaml: matrix[0].workload.duration:" in out
    assert "Traceback" not in out and "pydantic" not in out


def test_bad_option_is_a_usage_error(project):
    result = project.runpytest("--gpubench-duration", "-1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --gpubench-duration: '-1' must be a number of seconds or a duration*"])


def test_unreachable_api_stops_at_once_naming_url_and_sandbox(project, closed_port):
    result = project.runpytest("gpubench_demo.yaml")
    assert result.ret == 4
    err = result.stderr.str()
    assert f"no GPU Shopper API answers at http://127.0.0.1:{closed_port}" in err
    assert "--gpubench-sandbox" in err
    assert "Traceback" not in err + result.stdout.str()


def test_python_tests_use_cells_through_the_marker(project):
    project.makepyfile(test_mine=textwrap.dedent("""
        import pytest

        @pytest.mark.gpubench("gpubench_demo.yaml", model="qwen2:7b")
        def test_fast_enough(gpubench_cell):
            assert gpubench_cell.model == "qwen2:7b"
    """))
    result = project.runpytest("--collect-only", "-q", "test_mine.py")
    result.stdout.fnmatch_lines([
        "test_mine.py::test_fast_enough[[]RTX_4090-vastai-qwen2:7b[]]",
        "test_mine.py::test_fast_enough[[]RTX_4090-tensordock-qwen2:7b[]]",
        "2 tests collected*",
    ])
    narrowed = project.runpytest("--collect-only", "-q", "test_mine.py", "--gpubench-provider", "vastai")
    assert narrowed.parseoutcomes()["deselected"] == 1


def test_marker_errors_are_clear(project):
    project.makepyfile(test_mine=textwrap.dedent("""
        import pytest

        @pytest.mark.gpubench("missing.yaml")
        def test_a(gpubench_cell):
            pass
    """))
    result = project.runpytest("--collect-only", "-q", "test_mine.py")
    assert "missing.yaml: matrix file not found" in result.stdout.str() + result.stderr.str()


def test_fixtures_are_documented(project):
    result = project.runpytest("--fixtures")
    for name in ("gpubench_cell", "gpu_offer", "gpu_session", "gpu_ssh", "gpu_runtime", "gpubench"):
        assert name in result.stdout.str()


def test_the_same_cell_in_two_files_gets_two_manifest_rows(project):
    project.makefile(".yaml", gpubench_other=MATRIX)
    project.makeconftest("""
from pytest_gpubench.plugin.stash import RECORD_KEY

def pytest_collection_finish(session):
    for item in session.items:
        print("KEY", item.stash[RECORD_KEY])
""")
    result = project.runpytest("--collect-only", "-q", "-s", "-k", "A100")
    result.stdout.fnmatch_lines([
        "KEY A100_80GB-vastai-deepseek-r1:32b@gpubench_demo",
        "KEY A100_80GB-vastai-deepseek-r1:32b@gpubench_other",
    ])
    single = project.runpytest("--collect-only", "-q", "-s", "-k", "A100", "gpubench_demo.yaml")
    single.stdout.fnmatch_lines(["KEY A100_80GB-vastai-deepseek-r1:32b"])


def test_a_store_url_is_a_usage_error_before_anything_is_written(project):
    result = project.runpytest_subprocess("--gpubench-store", "mysql://bench@db/gpubench")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: store mysql://...: not a store this version knows; a store is*"])
    assert not (project.path / "reports").exists() and not (project.path / "mysql:").exists()
