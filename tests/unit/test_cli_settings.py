"""The ``gpubench`` commands resolve their settings as the plugin does (issue 22 item 6): the options
come from the plugin's one table, and resolve flag, then ``GPUBENCH_*``, then the ini file pytest
would read, then the default; ``--manifest`` (and its variable and ini key) is a deprecated alias of
``--store`` that still works and says so once (issue 22 item 3).

tests/plugin/test_cli_plugin_settings.py checks the same ``Settings`` against a real pytest configuration.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from _pytest.config.findpaths import locate_config

from pytest_gpubench.commands.cli import _parser, main
from pytest_gpubench.commands.cli_options import SHARED, command_settings, pytest_flags
from pytest_gpubench.errors import CommandProblem, UsageProblem
from pytest_gpubench.options import OPTIONS
from pytest_gpubench.settings import GpubenchDeprecationWarning, find_ini, resolve
from pytest_gpubench.store.manifest import Manifest


@pytest.fixture
def clean_env(monkeypatch):
    """No GPUBENCH_* variable of the machine running the tests."""
    for opt in OPTIONS:
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)
    monkeypatch.delenv("GPUBENCH_API_TOKEN", raising=False)


def parsed(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


# ----------------------------------------------------------------------------- the ini file

LAYOUTS = {
    "pytest.ini": {"pytest.ini": "[pytest]\ngpubench_api = http://ini\n"},
    "an empty pytest.ini still counts": {"pytest.ini": "", "tox.ini": "[pytest]\ngpubench_api = http://tox\n"},
    "pyproject ini_options": {"pyproject.toml": '[tool.pytest.ini_options]\ngpubench_api = "http://toml"\n'},
    "pyproject without pytest goes on up": {"pyproject.toml": "[tool.black]\nline-length = 1\n",
                                            "../pytest.ini": "[pytest]\ngpubench_api = http://up\n"},
    "pytest.ini before pyproject": {"pyproject.toml": '[tool.pytest.ini_options]\ngpubench_api = "http://t"\n',
                                    "pytest.ini": "[pytest]\ngpubench_api = http://i\n"},
    "tox.ini": {"tox.ini": "[tox]\nenvlist = py\n[pytest]\ngpubench_reports = out\n"},
    "tox.ini without [pytest] goes on": {"tox.ini": "[tox]\nenvlist = py\n",
                                         "setup.cfg": "[tool:pytest]\ngpubench_reports = cfg\n"},
    "setup.cfg": {"setup.cfg": "[metadata]\nname = x\n[tool:pytest]\ngpubench_store = s.db\n"},
    "a parent folder": {"../../pytest.ini": "[pytest]\ngpubench_api = http://top\n"},
    "a toml bool as text": {"pyproject.toml": "[tool.pytest.ini_options]\ngpubench_sandbox = true\n"},
    "nothing": {},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_ini_file_is_the_one_pytest_finds(tmp_path, layout):
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    for name, text in LAYOUTS[layout].items():
        (here / name).resolve().write_text(text)
    path, options = find_ini(here)
    try:
        _, pytest_path, pytest_config, _ = locate_config(here, [here])
    except TypeError:  # pytest 8.0: no invocation_dir
        _, pytest_path, pytest_config, _ = locate_config([here])
    # pytest names a pyproject.toml without its section as the ini file, holding nothing: the same options.
    assert path == pytest_path or (path is None and pytest_path.name == "pyproject.toml" and pytest_config == {})
    # pytest 9 wraps each value (ConfigValue), pytest 8 does not.
    assert options == {key: getattr(value, "value", value) for key, value in pytest_config.items()}


def test_a_broken_ini_file_is_a_usage_problem(tmp_path):
    (tmp_path / "tox.ini").write_text("[pytest\n")
    with pytest.raises(UsageProblem):
        find_ini(tmp_path)
    (tmp_path / "tox.ini").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options\n")
    with pytest.raises(UsageProblem, match="pyproject.toml"):
        find_ini(tmp_path)


# ----------------------------------------------------------------------------- resolution


def test_a_command_s_flag_beats_the_environment_which_beats_the_ini(tmp_path, monkeypatch, clean_env):
    (tmp_path / "pytest.ini").write_text("[pytest]\ngpubench_api = http://ini\ngpubench_store = ini.db\n"
                                         "gpubench_reports = ini-reports\n")
    monkeypatch.chdir(tmp_path)
    settings = command_settings(parsed("cleanup"))
    assert (settings.api, settings.store_location, settings.reports) == ("http://ini", "ini.db", Path("ini-reports"))
    monkeypatch.setenv("GPUBENCH_API_BASE", "http://env")
    monkeypatch.setenv("GPUBENCH_STORE", "env.db")
    settings = command_settings(parsed("cleanup"))
    assert (settings.api, settings.store_location) == ("http://env", "env.db")
    settings = command_settings(parsed("cleanup", "--api", "http://flag", "--store", "flag.db", "--reports", "r"))
    assert (settings.api, settings.store_location, settings.progress_dir) == ("http://flag", "flag.db",
                                                                              Path("r/progress"))


def test_without_any_setting_the_store_is_the_reports_folder_s_manifest(tmp_path, monkeypatch, clean_env):
    monkeypatch.chdir(tmp_path)
    assert command_settings(parsed("export")).store_location == str(Path("reports") / "manifest.db")
    monkeypatch.setenv("GPUBENCH_REPORTS", "elsewhere")
    assert command_settings(parsed("export")).store_location == str(Path("elsewhere") / "manifest.db")


def test_every_shared_flag_is_the_plugin_s_without_its_prefix():
    parser = _parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    by_dest = {opt.dest: opt for opt in OPTIONS}
    seen = set()
    for name, command in commands.choices.items():
        shared = command.get_default(SHARED) or ()
        for action in command._actions:
            if action.dest not in shared:
                continue
            opt = by_dest[action.dest]
            assert action.option_strings == [opt.flag.replace("--gpubench-", "--")], name
            assert action.metavar == (None if opt.action == "store_true" else opt.metavar), (name, opt.dest)
            assert opt.deprecated_for or action.help.startswith(opt.argparse_help), (name, opt.dest)
            seen.add((name, opt.dest))
    assert {("cleanup", "api"), ("cleanup", "store"), ("cleanup", "manifest"), ("cleanup", "reports"),
            ("report", "reports"), ("status", "store"), ("plan", "split_cost"), ("offers", "sandbox")} <= seen


def test_a_bad_value_names_its_source_as_a_command_problem(tmp_path, monkeypatch, clean_env, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUBENCH_DURATION", "soon")
    with pytest.raises(CommandProblem, match="environment variable GPUBENCH_DURATION: 'soon' must be"):
        command_settings(parsed("cleanup"))
    assert main(["cleanup", "--store", str(tmp_path / "m.db")]) == 2
    assert "gpubench cleanup: error: environment variable GPUBENCH_DURATION" in capsys.readouterr().err


def test_plan_hands_its_options_to_pytest_under_the_plugin_s_names():
    args = parsed("plan", "m.yaml", "--gpu", "A", "--gpu", "B", "--sandbox", "--split-cost", "10", "--manifest", "x.db")
    assert pytest_flags(args) == ["--gpubench-gpu", "A", "--gpubench-gpu", "B", "--gpubench-sandbox",
                                  "--gpubench-store", "x.db", "--gpubench-split-cost", "10"]
    # --store and its old name both given: pytest gets --store's.
    args = parsed("plan", "m.yaml", "--manifest", "old.db", "--store", "new.db")
    assert pytest_flags(args) == ["--gpubench-store", "new.db"]


# ----------------------------------------------------------------------------- the deprecated names


@pytest.fixture
def manifest(tmp_path) -> Path:
    path = tmp_path / "kept" / "manifest.db"
    path.parent.mkdir()
    with Manifest(path) as opened:
        opened.start_run("run-1", argv=[], matrix_files=[])
    return path


@pytest.mark.parametrize("given_as", ["flag", "environment", "ini"])
def test_the_old_manifest_name_still_names_the_store_with_one_line(manifest, tmp_path, monkeypatch, clean_env,
                                                                   capsys, given_as):
    monkeypatch.chdir(tmp_path)
    args = ["export", "--run", "last"]
    if given_as == "flag":
        args += ["--manifest", str(manifest)]
        line = "gpubench export: warning: --manifest is deprecated: give the same value to --store"
    elif given_as == "environment":
        monkeypatch.setenv("GPUBENCH_MANIFEST", str(manifest))
        line = ("gpubench export: warning: environment variable GPUBENCH_MANIFEST is deprecated: give the same "
                "value to GPUBENCH_STORE")
    else:
        (tmp_path / "pytest.ini").write_text(f"[pytest]\ngpubench_manifest = {manifest}\n")
        line = "gpubench export: warning: ini option gpubench_manifest is deprecated: give the same value to gpubench_store"
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert captured.err.splitlines()[0] == line
    assert captured.err.count("deprecated") == 1


def test_the_new_name_wins_at_the_same_level_and_a_flag_of_either_beats_the_environment(manifest, tmp_path,
                                                                                        monkeypatch, clean_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUBENCH_STORE", str(tmp_path / "env.db"))
    assert command_settings(parsed("export", "--manifest", "old.db")).store_location == "old.db"
    assert command_settings(parsed("export", "--manifest", "old.db", "--store", "new.db")).store_location == "new.db"
    monkeypatch.setenv("GPUBENCH_MANIFEST", "env-old.db")
    assert command_settings(parsed("export")).store_location == str(tmp_path / "env.db")


def test_the_plugin_s_resolution_warns_with_its_own_flag_names():
    with pytest.warns(GpubenchDeprecationWarning, match="--gpubench-manifest is deprecated: give the same value "
                                                        "to --gpubench-store"):
        settings = resolve({"manifest": "m.db"}, {}, lambda key: None)
    assert settings.store_location == "m.db"
    notes: list[str] = []
    resolve({}, {"GPUBENCH_STORE": "s.db"}, lambda key: None, warn=notes.append)
    assert notes == []


def test_report_s_old_output_dir_still_works_with_one_line(manifest, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", "--store", str(manifest), "--output-dir", str(out)]) == 0
    assert capsys.readouterr().err == ("gpubench report: warning: --output-dir is deprecated: give the same value "
                                       "to --reports\n")
    assert (out / "BENCHMARK_REPORT.md").is_file() and (out / "index.html").is_file()
