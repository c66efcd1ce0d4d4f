"""The plugin in other people's pytest runs: --help, option names, no phantom runs, load cost.

Each test runs pytest on a project of its own (``pytester``, in a subprocess where
the plugin's load matters) with the plugin installed as it is for every user.
"""

from __future__ import annotations

import ast
import os
import re
import sqlite3
import subprocess
import sys

import pytest
from e2e_helpers import DEMO_MATRIX as MATRIX
from e2e_helpers import REPO


@pytest.mark.slow
def test_fixtures_over_the_repository_tests_lists_them_without_an_internal_error():
    """No test module re-imports another's fixture: pytest would see one fixture twice.

    Over the e2e and plugin tiers, which hold the shared conftest fixtures and use the plugin's;
    the next test checks every module of every tier statically. Collecting all 2,600 tests for this
    took 8 CPU s of a CPU-bound suite."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "tests/e2e", "tests/plugin",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "INTERNALERROR" not in done.stdout + done.stderr
    assert "standalone_sandbox" in done.stdout  # the shared fixtures are listed, from conftest.py
    assert "tests/conftest.py" in done.stdout


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py and helpers in plain modules: a test module
    imported by another is collected twice over, its fixtures defined twice."""
    offenders = []
    modules = sorted((REPO / "tests").rglob("test_*.py"))
    assert len(modules) > 50
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name} imports {name}" for name in names if name.split(".")[-1].startswith("test_")]
    assert offenders == []




@pytest.fixture
def project(pytester, closed_port, monkeypatch):
    """A benchmark project: a matrix file, an API nobody answers, reports under the project."""
    for name in [k for k in os.environ if k.startswith("GPUBENCH_")]:
        monkeypatch.delenv(name)
    pytester.makefile(".yaml", gpubench_demo=MATRIX)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_API_BASE", f"http://127.0.0.1:{closed_port}")
    return pytester


def plugin_section(help_text: str) -> str:
    """The plugin's block of ``pytest --help``: from its group title to the next group."""
    lines = help_text.splitlines()
    start = lines.index("GPU benchmarks (pytest-gpubench):")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" "))
    return "\n".join(lines[start:end])


def squeeze(text: str) -> str:
    """Without whitespace: argparse wraps help lines, also after a hyphen ("time-scaled")."""
    return "".join(text.split())


# ------------------------------------------------------------------ item 1: --help


def test_help_shows_every_option_with_its_help(project):
    from pytest_gpubench.options import OPTIONS

    result = project.runpytest("--help")
    assert result.ret == 0, result.stderr.str()
    section = squeeze(plugin_section(result.stdout.str()))
    for opt in OPTIONS:
        assert opt.flag in section
        assert squeeze(opt.help) in section, opt.flag  # a % reads as itself ("tps:10%,ttft:20%")
    ini = squeeze(result.stdout.str().split("[pytest] ", 1)[1])  # pytest's ini options block
    for opt in OPTIONS:
        if opt.ini:
            assert f"gpubench_{opt.dest}" in ini and squeeze(opt.help) in ini, opt.dest


def test_every_help_text_survives_argparse_formatting():
    """argparse formats help with %: what it prints must be the text as written."""
    import argparse

    from pytest_gpubench.options import OPTIONS

    def wide(prog: str) -> argparse.HelpFormatter:
        return argparse.HelpFormatter(prog, width=10**6)

    for opt in OPTIONS:
        parser = argparse.ArgumentParser(prog="x", formatter_class=wide)
        parser.add_argument(opt.flag, help=opt.argparse_help)
        assert opt.help in parser.format_help(), opt.flag


# ------------------------------------------------------- item 2: other people's options


def test_a_project_with_its_own_model_gpu_and_provider_options_keeps_them(project):
    project.makeconftest("""
        def pytest_addoption(parser):
            parser.addoption("--model", default="bert")
            parser.addoption("--gpu", action="store_true")
            parser.addoption("--provider")
    """)
    project.makepyfile(test_ml="""
        def test_uses_my_options(request):
            assert request.config.getoption("--model") == "gpt2"
            assert request.config.getoption("--gpu") is True
            assert request.config.getoption("--provider") == "local"
    """)
    result = project.runpytest("test_ml.py", "--model", "gpt2", "--gpu", "--provider", "local")
    result.assert_outcomes(passed=1)
    assert "conflicting option" not in result.stderr.str()


def test_without_opting_in_the_short_filters_are_unknown_and_the_long_ones_work(project):
    result = project.runpytest("--collect-only", "-q", "--gpu", "RTX4090")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unrecognized arguments: --gpu*"])
    long = project.runpytest("--collect-only", "-q", "--gpubench-gpu", "RTX4090", "--gpubench-provider", "vastai",
                             "--gpubench-model", "qwen2")
    long.stdout.fnmatch_lines(["gpubench_demo.yaml::RTX_4090-vastai-qwen2:7b", "1/5 tests collected (4 deselected)*"])
    usage = project.runpytest("--help").stdout.str()
    assert "--gpubench-gpu=GPU" in usage
    assert not re.search(r"^\s+--(gpu|provider|model)\b(?!-)", usage, re.M)


def test_a_project_that_opts_in_gets_the_short_filters(project):
    project.makeconftest("""
        from pytest_gpubench.options import add_short_filters

        def pytest_addoption(parser):
            add_short_filters(parser)
    """)
    result = project.runpytest("--collect-only", "-q", "--gpu", "RTX4090", "--provider", "tensordock",
                               "--gpubench-model", "deepseek-r1")
    result.stdout.fnmatch_lines(["gpubench_demo.yaml::RTX_4090-tensordock-deepseek-r1:14b",
                                 "1/5 tests collected (4 deselected)*"])
    usage = squeeze(project.runpytest("--help").stdout.str())
    assert "--gpu=GPUshortfor--gpubench-gpu" in usage
    assert "--model=MODELshortfor--gpubench-model" in usage


def test_opting_in_to_some_short_filters_only(project):
    project.makeconftest("""
        from pytest_gpubench.options import add_short_filters

        def pytest_addoption(parser):
            add_short_filters(parser, ["gpu"])
            parser.addoption("--model")  # this project's own
    """)
    result = project.runpytest("--collect-only", "-q", "--gpu", "A100 80GB", "--model", "mine")
    result.stdout.fnmatch_lines(["1/5 tests collected (4 deselected)*"])


# ------------------------------------------- item 4: nothing but a real run writes


@pytest.mark.parametrize("mode", [["--collect-only"], ["--collect-only", "-q"], ["--fixtures"],
                                  ["--fixtures-per-test"], ["--setup-plan"], ["--markers"], ["--help"],
                                  ["--version"]])
def test_modes_that_only_show_write_nothing(project, mode):
    result = project.runpytest("gpubench_demo.yaml", *mode)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert not (project.path / "reports").exists()  # no manifest, no progress files, no report dirs
    assert "no GPU Shopper API" not in result.stdout.str() + result.stderr.str()  # nor any network


# ----------------------------------------------------- item 16: --collect-only's tree


def test_collect_only_lists_each_matrix_file_once(project):
    # Both files have RTX 4090 / vastai cells: one reuse group, run back to back across the files.
    project.makefile(".yaml", gpubench_more="""
matrix:
  - gpu: RTX 4090
    provider: vastai
    model: qwen2:1.5b
  - gpu: RTX 3090
    provider: vastai
    model: qwen2:7b
""")
    tree = project.runpytest("--collect-only").stdout.str()
    assert tree.count("<MatrixFile gpubench_demo.yaml>") == 1, tree
    assert tree.count("<MatrixFile gpubench_more.yaml>") == 1, tree
    flat = project.runpytest("--collect-only", "-q").stdout.lines
    # -q keeps the run order: the shared group's cells of both files together.
    ids = [line for line in flat if "::RTX_4090-vastai" in line]
    assert ids and all(abs(flat.index(a) - flat.index(b)) < 4 for a in ids for b in ids), flat


# ------------------------------------------------ item 3: load only what a run needs

LIGHT = {"pytest_gpubench", "pytest_gpubench.plugin", "pytest_gpubench.plugin.hooks", "pytest_gpubench.options",
         "pytest_gpubench.plugin.stash", "pytest_gpubench.plugin.matrix_scan",
         "pytest_gpubench.plugin.hookspec"}
REPORT_MODULES = """
    import sys

    def pytest_sessionfinish(session):
        with open("modules.txt", "w") as out:
            out.write("\\n".join(sorted(m for m in sys.modules
                                        if m.startswith(("pytest_gpubench", "asyncssh", "sqlite_utils", "httpx")))))
"""


def loaded_modules(pytester: pytest.Pytester, *args: str) -> set[str]:
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret in (0, 5), result.stdout.str() + result.stderr.str()
    return set((pytester.path / "modules.txt").read_text().split())


def test_an_unrelated_suite_loads_only_the_light_modules(project):
    project.makeconftest(REPORT_MODULES)
    project.makepyfile(test_plain="def test_one():\n    assert 1\n")
    assert loaded_modules(project, "test_plain.py") == LIGHT
    # A directory without matrix files, with -n: the controller and workers stay light too.
    sub = project.mkdir("sub")
    (sub / "test_more.py").write_text("def test_two():\n    assert 2\n")
    assert loaded_modules(project, "sub", "-n", "2") == LIGHT


def test_other_projects_test_modules_collect_as_before(project):
    """pytestmark as one mark (not a list), and module objects whose attributes raise."""
    project.makeconftest(REPORT_MODULES)
    project.makepyfile(test_theirs="""
        import pytest

        pytestmark = pytest.mark.slow

        class Touchy:
            def __getattr__(self, name):
                raise RuntimeError("no attributes here")

        touchy = Touchy()

        class TestGrouped:
            pytestmark = pytest.mark.slow

            def test_in_class(self):
                assert True

        def test_one():
            assert True
    """)
    project.makeini("[pytest]\nmarkers =\n    slow: theirs\n")
    result = project.runpytest_subprocess("test_theirs.py", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert set((project.path / "modules.txt").read_text().split()) == LIGHT


def test_a_matrix_or_marked_test_loads_the_rest(project):
    project.makeconftest(REPORT_MODULES)
    project.makepyfile(test_mine="""
        import pytest

        @pytest.mark.gpubench("gpubench_demo.yaml", model="qwen2:7b")
        def test_cell(gpubench_cell):
            pass
    """)
    for args in (["gpubench_demo.yaml", "--collect-only"], ["test_mine.py", "--collect-only"]):
        modules = loaded_modules(project, *args)
        assert {"pytest_gpubench.plugin.collect", "pytest_gpubench.plugin.run_hooks"} <= modules, args
        assert "pytest_gpubench.plugin.fixtures" not in modules, args  # nothing runs, nothing needs them
        # Ordering and splitting the run's reuse groups is arithmetic: no SSH, HTTP or SQLite.
        assert not {"asyncssh", "httpx", "sqlite_utils"} & modules, args
    for args in (["gpubench_demo.yaml", "--fixtures"], ["test_mine.py", "--fixtures"]):
        assert "pytest_gpubench.plugin.fixtures" in loaded_modules(project, *args), args


def test_filtered_cells_build_no_test_function(project):
    project.makeconftest("""
        from collections import Counter
        built = Counter()

        def pytest_itemcollected(item):
            built[type(item).__name__] += 1

        def pytest_collection_finish(session):
            print("BUILT", sorted(built.items()))
    """)
    result = project.runpytest("--collect-only", "-q", "-s", "--gpubench-gpu", "A100 80GB")
    result.stdout.fnmatch_lines(["BUILT [[]('BenchFunction', 1), ('FilteredCell', 4)[]]",
                                 "1/5 tests collected (4 deselected)*"])
    assert "FilteredCell" not in result.stdout.str().split("BUILT", 1)[0]


def test_xdist_workers_that_alone_find_marked_cells_share_one_run(project, monkeypatch):
    """The controller of ``-n 2 test_mine.py`` sees no matrix file and stays light; its
    workers load the plugin when they meet the marked test, under the run id it gave them."""
    project.makepyfile(test_mine="""
        import pytest

        @pytest.mark.gpubench("gpubench_demo.yaml", gpu="RTX4090")
        def test_cell(gpubench_cell):
            assert gpubench_cell.gpu == "RTX 4090"
    """)
    manifest = project.path / "runs" / "manifest.db"
    monkeypatch.setenv("GPUBENCH_STORE", str(manifest))  # not an option: that would load the plugin at once
    result = project.runpytest_subprocess("test_mine.py", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    with sqlite3.connect(manifest) as db:
        rows = db.execute("SELECT run_id, cell_id FROM benchmark_manifest").fetchall()
    assert len(rows) == 4 and len({run for run, _ in rows}) == 1, rows
