"""``LocalShell``: the SSH Connection's interface on this machine, with the same quoting rules."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpubench.errors import RemoteCommandError, Stage, StageError
from pytest_gpubench.remote.local import LocalShell
from pytest_gpubench.remote.ssh import quote


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def shell():
    opened = LocalShell.open(hide_gpu=True)
    yield opened
    asyncio.run(opened.close())


def test_a_quoted_word_with_shell_syntax_stays_one_word(shell, tmp_path):
    hostile = "$(touch pwned); `id` && rm -rf / 'x' \"y\" \\ *"
    result = run(shell.run(f"printf '%s\\n' {quote(hostile)}", stage=Stage.BENCHMARK, what="echo", timeout=30))
    assert result.ok and result.stdout == hostile + "\n"
    assert not (shell.home / "pwned").exists()


def test_commands_run_in_a_private_home_with_this_python_as_python3(shell):
    result = run(shell.run('pwd; echo "$HOME"; python3 -c "import sys; print(sys.executable)"',
                           stage=Stage.BENCHMARK, what="where", timeout=30))
    cwd, home, python = result.stdout.split()
    assert Path(cwd) == Path(home) == shell.home and oct(shell.home.stat().st_mode & 0o777) == "0o700"
    assert os.path.realpath(python) == os.path.realpath(sys.executable)


def test_python3_is_the_plugins_virtualenv_with_its_packages(tmp_path, monkeypatch):
    """A GPU box whose PyTorch lives in a virtualenv: ``python3`` in the shell must be that
    virtualenv, not its base interpreter (a symlink outside the virtualenv loses its packages,
    so a ``cloud: local`` cell could not import torch nor NVML's bindings)."""
    import venv

    env_dir = tmp_path / "gpu-box-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    venv_python = env_dir / "bin" / "python"
    site = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "only_in_the_venv.py").write_text("WHERE = 'venv'\n", encoding="utf-8")
    monkeypatch.setattr(sys, "executable", str(venv_python))
    opened = LocalShell.open()
    try:
        result = run(opened.run("python3 -c 'import only_in_the_venv; print(only_in_the_venv.WHERE)'",
                                stage=Stage.BENCHMARK, what="import", timeout=60))
    finally:
        run(opened.close())
    assert result.ok and result.stdout.strip() == "venv", result.stderr


def test_failures_and_timeouts_are_stage_errors(shell):
    with pytest.raises(RemoteCommandError) as failed:
        run(shell.run("echo oops >&2; exit 3", stage=Stage.RUNTIME_SETUP, what="a failing step", timeout=30))
    assert failed.value.stage is Stage.RUNTIME_SETUP and "oops" in str(failed.value)
    unchecked = run(shell.run("exit 4", stage=Stage.BENCHMARK, what="x", timeout=30, check=False))
    assert unchecked.exit_status == 4 and not unchecked.ok
    with pytest.raises(StageError) as slow:
        run(shell.run("sleep 30", stage=Stage.BENCHMARK, what="a slow step", timeout=0.5))
    assert "a slow step did not finish within" in str(slow.value)


def test_stdin_reaches_the_command_and_lines_stream_back(shell):
    assert run(shell.run("cat", stage=Stage.BENCHMARK, what="cat", timeout=30, stdin="via stdin")).stdout == "via stdin"

    async def collect():
        return [line async for line in shell.stream_lines("python3 - one two", stdin="import sys\n"
                                                          "print(*sys.argv[1:], sep='\\n')\nsys.exit(2)")]

    assert run(collect()) == ["one", "two"]
    assert shell.last_exit_status == 2


def test_a_stream_left_early_ends_its_process(shell):
    async def first_line():
        lines = shell.stream_lines("echo $$ > pid; echo started; sleep 60", stdin="")
        async for line in lines:
            await lines.aclose()
            return line

    assert run(first_line()) == "started"
    pid = int((shell.home / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_nvidia_smi_is_hidden_and_forward_is_the_identity(shell):
    result = run(shell.run("nvidia-smi --query-gpu=name --format=csv", stage=Stage.SSH_CONNECT, what="nvidia-smi",
                           timeout=30, check=False))
    assert result.exit_status == 127 and "command not found" in result.stderr
    assert run(shell.forward("127.0.0.1", 8000)) == 8000
    shell.set_keepalive(5)  # nothing to keep alive, and no error


def test_close_removes_the_home_and_refuses_more_commands():
    shell = LocalShell.open()
    home = shell.home
    run(shell.close())
    assert shell.closed and not home.exists()
    with pytest.raises(StageError):
        run(shell.run("true", stage=Stage.BENCHMARK, what="after close", timeout=5))


def test_this_machine_as_a_provider_keeps_its_home_between_cells_an_endpoint_does_not(tmp_path, monkeypatch):
    """``cloud: local``'s caches (Ollama's models, the HF cache, server pid files) outlive the cell;
    a running endpoint's shell stays a private temporary directory."""
    from types import SimpleNamespace

    from pytest_gpubench.cloud.provider import SshDetails
    from pytest_gpubench.run.cell_benchmark import connect

    monkeypatch.setenv("HOME", str(tmp_path))

    def session(declared: bool):
        return SimpleNamespace(ssh=SshDetails(host="localhost", port=0, user="", private_key="", local=True,
                                              declared_hardware=declared))

    async def one_cell(declared: bool) -> Path:
        shell = await connect(None, session(declared), 30)  # type: ignore[arg-type]
        await shell.run("mkdir -p .ollama && echo model > .ollama/blob", stage=Stage.BENCHMARK, what="pull",
                        timeout=30)
        await shell.close()
        return shell.home

    machine = run(one_cell(False))
    assert machine == tmp_path / ".gpubench" / "local-home"
    assert run(one_cell(False)) == machine and (machine / ".ollama" / "blob").read_text() == "model\n"
    endpoint = run(one_cell(True))
    assert endpoint != machine and not endpoint.exists()
