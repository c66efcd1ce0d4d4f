"""One configuration (issue 22 item 6): from the same flags, ``GPUBENCH_*`` variables and ini file,
a ``gpubench`` command builds the same ``Settings`` as the plugin in a pytest run; and the plugin
says once, as a warning, that ``--gpubench-manifest`` is the old name of ``--gpubench-store``
(issue 22 item 3). (pytester)

tests/unit/test_cli_settings.py checks the commands' side alone (ini files, precedence, aliases).
"""

from __future__ import annotations

import pytest

from pytest_gpubench.commands.cli import _parser
from pytest_gpubench.commands.cli_options import command_settings
from pytest_gpubench.options import OPTIONS
from pytest_gpubench.plugin.run_hooks import _settings

INI = {
    "pytest.ini": "[pytest]\ngpubench_api = http://ini.example\ngpubench_reports = ini-reports\n"
                  "gpubench_sessions_per_group = 2\ngpubench_time_scale = 0.5\ngpubench_manifest = ini.db\n",
    "pyproject.toml": '[tool.pytest.ini_options]\ngpubench_sandbox = true\ngpubench_split_cost = "35%"\n'
                      'gpubench_store = "postgresql://bench@db.example/gpubench"\n',
    "tox.ini": "[pytest]\ngpubench_api = http://tox.example\ngpubench_workload_type = batch\n",
    "setup.cfg": "[tool:pytest]\ngpubench_reports = cfg-reports\ngpubench_upload = yes\n",
}
#: A value only each ini file gives.
FROM_INI = {"pytest.ini": ("time_scale", 0.5), "pyproject.toml": ("sandbox", True),
            "tox.ini": ("workload_type", "batch"), "setup.cfg": ("upload", True)}
#: The same inputs, as pytest flags and as ``gpubench plan`` flags.
FLAGS = [
    ([], []),
    (["--gpubench-api", "http://flag.example", "--gpubench-gpu", "A100", "--gpubench-gpu", "RTX4090"],
     ["--api", "http://flag.example", "--gpu", "A100", "--gpu", "RTX4090"]),
    (["--gpubench-store", "flag.db", "--gpubench-split-cost", "10", "--gpubench-sandbox"],
     ["--store", "flag.db", "--split-cost", "10", "--sandbox"]),
    (["--gpubench-manifest", "old-flag.db", "--gpubench-model", "qwen2"],
     ["--manifest", "old-flag.db", "--model", "qwen2"]),
]
ENV = {"GPUBENCH_STORE": "env.db", "GPUBENCH_DURATION": "90s", "GPUBENCH_API_TOKEN": "tok",
       "GPUBENCH_SESSIONS_PER_GROUP": "auto"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for opt in OPTIONS:
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)
    monkeypatch.delenv("GPUBENCH_API_TOKEN", raising=False)


@pytest.mark.parametrize("ini_name", list(INI))
@pytest.mark.parametrize("with_env", [False, True], ids=["no-env", "env"])
@pytest.mark.parametrize("flags", FLAGS, ids=["no-flags", "api-gpu", "store-split-sandbox", "old-manifest"])
def test_a_command_and_the_plugin_build_the_same_settings(pytester, monkeypatch, ini_name, with_env, flags):
    pytester.makefile(ini_name[ini_name.index("."):], **{ini_name[: ini_name.index(".")]: INI[ini_name]})
    if with_env:
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
    pytest_flags, command_flags = flags
    plugin = _settings(pytester.parseconfig(*pytest_flags))
    command = command_settings(_parser().parse_args(["plan", "m.yaml", *command_flags]))
    assert command.model_dump(exclude={"run_id"}) == plugin.model_dump(exclude={"run_id"})
    assert command.api_token == plugin.api_token
    assert getattr(plugin, FROM_INI[ini_name][0]) == FROM_INI[ini_name][1]  # the ini file was read


def test_the_plugin_says_once_that_the_manifest_option_is_the_store_s_old_name(pytester, monkeypatch):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    store = pytester.path / "runs" / "m.db"
    result = pytester.runpytest("--gpubench-manifest", str(store), "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*GpubenchDeprecationWarning: --gpubench-manifest is deprecated: give the same "
                                 "value to --gpubench-store"])
    assert result.stdout.str().count("is deprecated") == 1
    monkeypatch.setenv("GPUBENCH_MANIFEST", str(store))
    result = pytester.runpytest("--gpubench-api", "http://127.0.0.1:9", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*environment variable GPUBENCH_MANIFEST is deprecated: give the same value to "
                                 "GPUBENCH_STORE"])
