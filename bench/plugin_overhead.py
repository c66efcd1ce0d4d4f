"""What the plugin costs pytest runs: loading it everywhere, and collecting a big matrix.

    python bench/plugin_overhead.py              # median of 5, alternating
    python bench/plugin_overhead.py --repeat 9

Two comparisons, each against a reference measured in the same run, the two sides
run alternately (so a machine that gets busier slows both), median of the repeats:

* **load**: an unrelated suite (200 small tests in 20 modules, generated in a temp
  directory) with the plugin installed, as every project in the environment runs
  it, against the same suite with ``-p no:gpubench``. Target: ratio <= 1.05.
* **collect**: ``pytest --collect-only`` of a generated 10,000-cell matrix against
  plain pytest collecting 10,000 parametrized items (the plugin installed, idle),
  in full, with ``-k`` selecting 1%, and with the GPU filter against ``-k``
  selecting the same 10%. Target: ratio <= 1.3 (the aim is 1.0).

Each row shows the median wall time of the child process, its peak memory
(``ru_maxrss``) and the ratios. Exit 0 when every target holds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUS = ["RTX 4090", "RTX 3090", "A100 80GB", "H100 80GB", "L40S", "RTX A6000", "A10", "L4", "RTX 4080", "V100"]
MODELS = [f"model{i}:7b" for i in range(50)]
CONCURRENCY = list(range(1, 11))
LOAD_TARGET = 1.05
COLLECT_TARGET = 1.3


@dataclass
class Sample:
    seconds: float
    maxrss_mib: float


@dataclass
class Case:
    """One comparison: the plugin's command against its reference, in one directory."""

    name: str
    ours: list[str]
    reference: list[str]
    target: float
    expected: str  # a line both outputs must contain: the two sides select the same count

    def measure(self, directory: Path, repeat: int) -> tuple[list[Sample], list[Sample]]:
        ours: list[Sample] = []
        reference: list[Sample] = []
        for i in range(repeat):
            # Alternate which side goes first, so neither always gets the warmer cache.
            order = [(self.ours, ours), (self.reference, reference)]
            for args, samples in order if i % 2 == 0 else reversed(order):
                samples.append(run_pytest(directory, args, self.expected))
        return ours, reference


def run_pytest(directory: Path, args: list[str], expected: str) -> Sample:
    """``python -m pytest ARGS`` in ``directory``: wall time and peak memory of the child."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out_path = directory / "out.txt"
    with open(out_path, "w") as out:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                                   cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text()
    if process.returncode not in (0, 5) or expected not in text:
        raise SystemExit(f"pytest {' '.join(args)} in {directory} did not give {expected!r}:\n{text[-2000:]}")
    return Sample(seconds, usage.ru_maxrss / 1024)


def write_suite(directory: Path) -> None:
    """200 small tests, 20 modules: a project that has nothing to do with GPUs."""
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")
    for m in range(20):
        tests = "\n\n".join(f"def test_{m}_{t}():\n    assert sum(range({t} + 3)) == {sum(range(t + 3))}"
                            for t in range(10))
        (directory / f"test_mod{m:02d}.py").write_text(f"import math\n\n\n{tests}\n")


def write_collection(directory: Path) -> None:
    """A 10,000-cell matrix and 10,000 parametrized items, with ids of the same length class."""
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")
    rows = "\n".join(f"  - gpu: {gpu}\n    providers: [vastai, tensordock]\n    models: [{', '.join(MODELS)}]"
                     for gpu in GPUS)
    (directory / "gpubench_big.yaml").write_text(
        f"workload: {{duration: 5s, max_tokens: 32, concurrency: {CONCURRENCY}}}\nmatrix:\n{rows}\n")
    (directory / "test_plain.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('x', range(10000), ids=[f'x{i:04d}' for i in range(10000)])\n"
        "def test_plain(x):\n    pass\n")


def cases() -> tuple[Case, list[Case]]:
    load = Case("200 unrelated tests: installed vs -p no:gpubench", ["-q", "."], ["-q", ".", "-p", "no:gpubench"],
                LOAD_TARGET, "200 passed")
    collect = [
        Case("collect 10,000: matrix vs parametrize", ["--collect-only", "-q", "gpubench_big.yaml"],
             ["--collect-only", "-q", "test_plain.py"], COLLECT_TARGET, "10000 tests collected"),
        # One word each: 10 GPUs x 10 concurrencies of one model on one provider is 100 cells;
        # x00 names x0000-x0099.
        Case("collect, -k selecting 1%", ["--collect-only", "-q", "gpubench_big.yaml", "-k", "tensordock-model7:"],
             ["--collect-only", "-q", "test_plain.py", "-k", "x00"], COLLECT_TARGET,
             "100/10000 tests collected (9900 deselected)"),
        # One GPU of ten: the filter against -k at the same 10% (x0 names x0000-x0999).
        Case("collect, --gpubench-gpu 10% vs -k 10%", ["--collect-only", "-q", "gpubench_big.yaml",
                                                        "--gpubench-gpu", "RTX4090"],
             ["--collect-only", "-q", "test_plain.py", "-k", "x0"], COLLECT_TARGET,
             "1000/10000 tests collected (9000 deselected)"),
    ]
    return load, collect


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side (default 5); the median counts")
    options = parser.parse_args()
    load, collect = cases()
    missed = []
    print(f"pytest-gpubench plugin overhead: median of {options.repeat}, alternating; "
          f"wall seconds of the pytest process, peak memory (ru_maxrss) in MiB\n")
    print(f"{'case':<52}{'plugin s':>9}{'ref s':>8}{'ratio':>7}{'plugin MiB':>11}{'ref MiB':>9}"
          f"{'mem ratio':>10}  {'target':<8}")
    with tempfile.TemporaryDirectory(prefix="gpubench-overhead-") as tmp:
        suite, matrix = Path(tmp) / "suite", Path(tmp) / "matrix"
        write_suite(suite)
        write_collection(matrix)
        for case, directory in [(load, suite)] + [(c, matrix) for c in collect]:
            ours, reference = case.measure(directory, options.repeat)
            t_ours = statistics.median(s.seconds for s in ours)
            t_ref = statistics.median(s.seconds for s in reference)
            m_ours = statistics.median(s.maxrss_mib for s in ours)
            m_ref = statistics.median(s.maxrss_mib for s in reference)
            ratio = t_ours / t_ref
            verdict = "PASS" if ratio <= case.target else "MISS"
            if verdict == "MISS":
                missed.append(case.name)
            print(f"{case.name:<52}{t_ours:>9.3f}{t_ref:>8.3f}{ratio:>7.2f}{m_ours:>11.1f}{m_ref:>9.1f}"
                  f"{m_ours / m_ref:>10.2f}  <={case.target:<6} {verdict}", flush=True)
    print("\nALL TARGETS PASS" if not missed else f"\nMISSED: {', '.join(missed)}")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
