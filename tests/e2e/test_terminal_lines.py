"""Where the live progress lines land in pytest's terminal output, end to end on the sandbox.

pytest runs as a user runs it (a subprocess, no ``-n``, output to a pipe), with a
two-cell matrix: one cell passes, one fails its threshold. One test checks the three rules
below on that one run: as three tests sharing a module fixture, ``-n auto`` (worksteal) could
hand them to three workers, each running the whole pytest run again (21 s under load).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

MATRIX = """
workload: {duration: 2s, max_tokens: 32, progress_interval: 1s}
matrix:
  - gpu: RTX 4090
    provider: vastai
    model: qwen2:1.5b
  - gpu: RTX 3090
    provider: vastai
    model: qwen2:7b
    thresholds: {min_tps: 100000}
"""

LIVE = re.compile(r"gpubench (?P<cell>[A-Za-z0-9_.:-]+): (?:STATUS|PROGRESS|ERROR):")
#: pytest's own progress: a file's path, status letters, the percentage.
LETTERS = re.compile(r"^(?:gpubench_lines\.yaml ?)?(?P<letters>[.FEs]*)\s*(?:\[\s*\d+%\])?$")


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("lines")
    (where / "gpubench_lines.yaml").write_text(MATRIX)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    done = subprocess.run(
        # The sandbox's clock at 0.01, not the flag's 0.02: where the lines land does not depend on it.
        [sys.executable, "-m", "pytest", "gpubench_lines.yaml", "--gpubench-sandbox", "--gpubench-time-scale", "0.01",
         "-p", "no:cacheprovider",
         "--gpubench-reports", str(where / "reports"), "--gpubench-store", str(where / "reports" / "m.db")],
        cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_live_lines_start_lines_of_their_own_come_before_the_letters_and_end_with_the_summary_s_cost(output):
    every_progress_line_starts_a_line_of_its_own(output)
    a_failed_cell_s_error_line_comes_before_its_letter(output)
    the_cost_on_each_cell_s_last_line_is_the_summary_s(output)


def every_progress_line_starts_a_line_of_its_own(output):
    lines = output.splitlines()
    live = [line for line in lines if LIVE.search(line)]
    assert len(live) > 10, "the run printed live lines"
    glued = [line for line in live if not line.startswith("gpubench ")]
    # e.g. "....  [100%]gpubench RTX_..." before the fix
    assert glued == [], ("every progress line starts a line of its own", glued)


def a_failed_cell_s_error_line_comes_before_its_letter(output):
    lines = output.splitlines()
    error = next(n for n, line in enumerate(lines) if line.startswith("gpubench RTX_3090-vastai-qwen2_7b: ERROR:"))
    letter = next(n for n, line in enumerate(lines)
                  if (found := LETTERS.match(line)) is not None and "F" in found["letters"])
    around = "\n".join(lines[min(error, letter) - 2:max(error, letter) + 3])
    assert error < letter, "a failed cell's ERROR line comes before its letter:\n" + around
    # ... and the cell's lines before it (its benchmark), not only the error.
    benchmark = next(n for n, line in enumerate(lines)
                     if line.startswith("gpubench RTX_3090-vastai-qwen2_7b: STATUS: BENCHMARK_COMPLETE"))
    assert benchmark < letter, "the failed cell's BENCHMARK_COMPLETE line comes before its letter"


def the_cost_on_each_cell_s_last_line_is_the_summary_s(output):
    last = dict(re.findall(r"^gpubench (\S+): STATUS: (?:COMPLETED|FAILED) .*cost=(\S+)$", output, re.M))
    summary = output.split("gpubench summary", 1)[1].splitlines()
    rows = {line.split()[0]: line.split()[-1] for line in summary if line.startswith("RTX_")}
    assert set(rows) == {"RTX_4090-vastai-qwen2:1.5b", "RTX_3090-vastai-qwen2:7b"}, ("the summary lists both cells",
                                                                                   summary)
    # The progress file's name is the cell id made file-name safe (":" becomes "_").
    assert {cell.replace(":", "_"): cost for cell, cost in rows.items()} == last, \
        ("the cost on each cell's last line is the summary's", rows, last)
    assert all(float(cost) > 0 for cost in last.values()), ("costs are not rounded away to 0.00", last)
