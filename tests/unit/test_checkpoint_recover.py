"""Recovering a run's records from the instance's checkpoint (measure/benchmark.py), through a real shell."""

from __future__ import annotations

import json
import subprocess
import time

from pytest_gpubench.aio import run as run_async
from pytest_gpubench.measure.benchmark import recover
from pytest_gpubench.remote.local import LocalShell

RECORD = {"index": 0, "prompt_index": 0, "started_at": 0.0, "ttft_ms": 10.0, "latency_ms": 50.0, "output_tokens": 5}


class GeneratorFinishesDuringTheCheck(LocalShell):
    """The load generator writes its last checkpoint and exits just as ``kill -0`` asks after it."""

    def __init__(self, *args, final: str, path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.final, self.path = final, path

    async def run(self, command: str, **kwargs):
        result = await super().run(command, **kwargs)
        if command.startswith("kill -0"):
            self.path.write_text(self.final)
        return result


def test_a_generator_that_exits_between_two_reads_is_read_once_more(tmp_path):
    exited = subprocess.Popen(["true"])
    exited.wait()  # its pid: a process that is gone
    running = {"status": "running", "pid": exited.pid, "results": [RECORD]}
    completed = {"status": "completed", "pid": exited.pid, "results": [RECORD, {**RECORD, "index": 1}]}
    home = tmp_path / "home"
    home.mkdir()
    path = home / "run.checkpoint.json"
    path.write_text(json.dumps(running))
    shell = GeneratorFinishesDuringTheCheck(home, keep_home=True, final=json.dumps(completed), path=path)
    recovered = run_async(recover(shell, "run.checkpoint.json", until=time.monotonic() + 30), 60)
    assert (recovered.status, len(recovered.records), recovered.problem) == ("completed", 2, "")


def test_a_generator_that_died_mid_run_ends_running_with_what_it_wrote(tmp_path):
    exited = subprocess.Popen(["true"])
    exited.wait()
    home = tmp_path / "home"
    home.mkdir()
    (home / "run.checkpoint.json").write_text(json.dumps({"status": "running", "pid": exited.pid,
                                                         "results": [RECORD]}))
    recovered = run_async(recover(LocalShell(home, keep_home=True), "run.checkpoint.json",
                                  until=time.monotonic() + 30), 60)
    assert (recovered.status, len(recovered.records), recovered.problem) == ("running", 1, "")
