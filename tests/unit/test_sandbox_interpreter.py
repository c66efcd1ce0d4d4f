"""The sandbox's stand-in programs run on the sandbox's own interpreter.

An instance's ``python3`` is the bare interpreter (a symlink to the one the sandbox runs on,
which outside a virtualenv has none of the project's dependencies), as on a fresh cloud
instance. A stand-in started through it (``python3 -m sglang.launch_server``) must not
re-run itself on that interpreter: in a virtualenv every SGLang cell waited 60 s and failed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_gpubench.sandbox import shims
from pytest_gpubench.sandbox.openai_launchers import SGLANG_VERSION


def test_sglang_launch_server_execs_the_sandbox_interpreter_not_the_one_that_started_it(tmp_path: Path) -> None:
    shims.write_sglang_package(tmp_path)
    launch_server = tmp_path / shims.SGLANG_PACKAGE / "launch_server.py"
    # Started by an interpreter that is not the sandbox's (here: one that calls itself a bare
    # python3 elsewhere): the stand-in must still come up, on the sandbox's interpreter.
    starter = (
        "import runpy, sys\n"
        "sys.executable = '/nonexistent/bare/python3'\n"
        f"sys.argv = ['launch_server', '--version']\n"
        f"runpy.run_path({str(launch_server)!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert SGLANG_VERSION in done.stdout + done.stderr
