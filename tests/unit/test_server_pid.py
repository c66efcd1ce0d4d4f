"""Issue 21 item 5: a stale pid file never gets an unrelated process signalled.

The shell of ``runtimes/openai_server.py`` run by the real ``bash`` on real processes (a
``sleep`` started here): only the server gpubench started, told by its start time and its
command line, is signalled; any other process a pid file names is left alive and the file
dropped, with a line saying why.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpubench.runtimes.openai_server import identify, record, stale_in, start_file, word_pattern
from pytest_gpubench.runtimes.openai_server import stop_script as stop

PATTERN = word_pattern("vllm")


def sh(script: str) -> str:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True).stdout


def alive(process: subprocess.Popen) -> bool:
    return process.poll() is None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def spawn(processes: list, *argv: str) -> subprocess.Popen:
    process = subprocess.Popen(argv)
    processes.append(process)
    return process


def test_a_pid_file_naming_an_unrelated_process_leaves_it_alive_and_is_dropped(tmp_path: Path, processes):
    sleeper = spawn(processes, "sleep", "300")
    pid_file = tmp_path / "vllm-serve.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    out = sh(stop(str(pid_file), PATTERN, grace_steps=5))
    assert "stopped" not in out
    time.sleep(0.2)
    assert alive(sleeper)
    assert not pid_file.exists()
    assert stale_in(out).fields(str(pid_file)) == {"file": str(pid_file), "pid": str(sleeper.pid), "now": "sleep",
                                                   "reason": "its command line is not the server's"}


def test_a_reused_pid_with_the_servers_command_line_but_another_start_time_is_left_alone(tmp_path, processes):
    """A server's pid given, after a reboot, to another process of the same program."""
    other = spawn(processes, "bash", "-c", "exec -a vllm sleep 300")
    pid_file = tmp_path / "vllm-serve.pid"
    wait_cmdline(other.pid, "vllm")
    pid_file.write_text(f"{other.pid}\n")
    Path(start_file(str(pid_file))).write_text("1\n")  # the first server started at tick 1
    out = sh(stop(str(pid_file), PATTERN, grace_steps=5))
    assert alive(other) and "stopped" not in out
    assert stale_in(out).reason == "started at another time than the server"
    assert not pid_file.exists() and not Path(start_file(str(pid_file))).exists()


def test_the_server_started_is_stopped(tmp_path: Path):
    pid_file = tmp_path / "vllm-serve.pid"
    # As serve_command launches: nohup SERVER & then record().
    sh(f'nohup bash -c "exec -a vllm sleep 300" >/dev/null 2>&1 < /dev/null & {record(str(pid_file))}')
    pid = int(pid_file.read_text())
    wait_cmdline(pid, "vllm")
    assert Path(start_file(str(pid_file))).read_text().strip().isdigit()
    assert sh(identify(str(pid_file), PATTERN)).strip() == f"ours {pid}"
    out = sh(stop(str(pid_file), PATTERN, grace_steps=20))
    assert out.strip().endswith("stopped") and stale_in(out) is None
    wait_gone(pid)
    assert not pid_file.exists() and not Path(start_file(str(pid_file))).exists()


def test_a_pid_file_of_an_ended_process_or_garbage_signals_nothing(tmp_path: Path):
    pid_file = tmp_path / "vllm-serve.pid"
    ended = subprocess.Popen(["true"])
    ended.wait()
    pid_file.write_text(f"{ended.pid}\n")
    assert sh(stop(str(pid_file), PATTERN, grace_steps=1)).strip() == "gone" and not pid_file.exists()
    pid_file.write_text("1; kill -9 -1\n")
    out = sh(stop(str(pid_file), PATTERN, grace_steps=1))
    assert stale_in(out).reason == "not a pid" and not pid_file.exists()
    assert sh(stop(str(pid_file), PATTERN, grace_steps=1)).strip() == "none"


def wait_cmdline(pid: int, word: str) -> None:
    deadline = time.monotonic() + 30
    while word not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
        assert time.monotonic() < deadline, f"{pid} never ran {word}"
        time.sleep(0.02)


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
        assert time.monotonic() < deadline, f"{pid} still runs"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return text[text.rfind(")") + 2:].split()[0]
