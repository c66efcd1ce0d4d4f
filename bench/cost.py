"""What session reuse saves: seed 001's matrix on the sandbox, reuse on and off.

    python bench/cost.py                    # time scale 0.05, -n 4
    python bench/cost.py --time-scale 0.02 -n 8

The sandbox's catalog carries realistic waits (Vast.ai boots in 90 s and TensorDock
in 150 s, the Ollama install takes 30 s, models download at 250 or 120 MB/s), all
multiplied by the time scale. To keep the proportions of a real run, each cell
benchmarks for seed 000's 300 s times the same scale; the rest of seed 000's
workload (256 tokens, one warm-up request) is kept.

For each mode it prints, from the manifest and the sandbox:

* sessions created, and sessions per successful cell;
* GPU time billed (every session from creation to release, as the sandbox bills);
* the lower bound: one session per reuse group, set up once (boot, Ollama install,
  the first model's download and load, per the catalog) and its cells' benchmarks
  back to back, each as long as its ``benchmark`` stage took in that run (the
  workload's own time: the duration, the warm-up request, the last request's
  tail; from the manifest's ``stage_seconds``); everything else (later downloads,
  SSH, checks, releases) counts against the plugin;
* their ratio, and the run's wall time against its longest group (with enough
  workers nothing can end sooner) and against the ideal for ``-n`` workers (the
  groups' bounds dealt longest first to the least loaded worker).

Figures are printed in the sandbox's seconds and as real hours (divided by the
time scale). Targets (issue 5): billed <= 1.15 x the lower bound with reuse, and
at most 0.4 sessions per successful cell. Exit 0 when both hold.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import httpx
import sqlite_utils
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# bench/ is on sys.path: the script's own directory
from bench_common import SANDBOX_AUTH, pytest_env, start_sandbox  # noqa: E402

from pytest_gpubench.matrix.cells import expand, load_matrix  # noqa: E402
from pytest_gpubench.sandbox.catalog import load_catalog  # noqa: E402

SEED_MATRIX = REPO / "matrix" / "gpubench_seed.yaml"
SEED_DURATION_S = 300
TARGET_RATIO = 1.15
TARGET_SESSIONS_PER_CELL = 0.4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--workers", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


def write_matrix(work: Path, time_scale: float) -> Path:
    """Seed 001's rows with the benchmark shrunk by the time scale."""
    data = yaml.safe_load(SEED_MATRIX.read_text(encoding="utf-8"))
    data["workload"].update(duration=round(SEED_DURATION_S * time_scale, 3),
                            progress_interval=max(1.0, round(SEED_DURATION_S * time_scale / 3, 1)))
    path = work / "gpubench_cost.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_pytest(matrix: Path, url: str, work: Path, reuse: str, args: argparse.Namespace) -> float:
    env = pytest_env()  # this checkout's plugin, the sandbox's token
    command = [sys.executable, "-m", "pytest", str(matrix), "-n", str(args.workers), "-q", "-p", "no:cacheprovider",
               "--rootdir", str(work), "--gpubench-api", url, "--gpubench-time-scale", str(args.time_scale),
               "--gpubench-live", "false", "--gpubench-reuse", reuse, "--gpubench-reports", str(work / "reports"),
               # The lower bound is one session per reuse group: no group split over idle workers.
               "--gpubench-sessions-per-group", "1",
               "--gpubench-store", str(work / "reports" / "manifest.db")]
    started = time.monotonic()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}"
    print(f"  pytest --gpubench-reuse {reuse}: {last}")
    return wall


def setup_seconds(matrix: Path, time_scale: float) -> dict[str, float]:
    """Per reuse group: its one unavoidable setup (boot, install, first model), per the catalog."""
    catalog = load_catalog()
    setups: dict[str, float] = {}
    for group, cells in _groups(matrix).items():
        first = cells[0]
        provider = catalog.providers[first.provider]
        model = catalog.models[first.model]
        setups[group] = (provider.provisioning_seconds + catalog.timings.ollama_install_seconds
                         + model.size_bytes / 1e6 / provider.pull_mb_per_s + model.load_seconds) * time_scale
    return setups


def later_models_seconds(matrix: Path, time_scale: float) -> float:
    """The downloads and loads of every group's later models, per the catalog: what a bound that
    counts each model's own setup as unavoidable adds to the strict one."""
    catalog = load_catalog()
    total = 0.0
    for cells in _groups(matrix).values():
        provider = catalog.providers[cells[0].provider]
        seen = {cells[0].model}
        for cell in cells[1:]:
            if cell.model not in seen:
                model = catalog.models[cell.model]
                total += (model.size_bytes / 1e6 / provider.pull_mb_per_s + model.load_seconds) * time_scale
                seen.add(cell.model)
    return total


def lower_bound(matrix: Path, setups: dict[str, float], benchmark_s: dict[str, float]) -> dict[str, float]:
    """Per reuse group: setup once, then its cells' benchmarks back to back (``benchmark_s`` by
    cell id: what each took; the configured duration for a cell that did not run)."""
    return {group: setups[group] + sum(benchmark_s.get(cell.cell_id, cell.workload.duration) for cell in cells)
            for group, cells in _groups(matrix).items()}


@functools.cache
def _groups(matrix: Path) -> dict[str, list]:
    """The matrix's cells by reuse group (read once: the file goes with the work directory)."""
    groups: dict[str, list] = defaultdict(list)
    for cell in expand(load_matrix(matrix)):
        groups[cell.reuse_group].append(cell)
    return dict(groups)


def makespan(groups: list[float], workers: int) -> float:
    """The run's ideal wall time: groups dealt longest first to the least loaded of ``workers``
    (what --dist loadgroup does), never less than the longest group."""
    loads = [0.0] * max(workers, 1)
    for seconds in sorted(groups, reverse=True):
        loads[loads.index(min(loads))] += seconds
    return max(loads)


def measure(work: Path, url: str) -> dict[str, float]:
    """Sessions, billed seconds and cells from the manifest, checked against the sandbox."""
    db = sqlite_utils.Database(work / "reports" / "manifest.db")
    attempts = [a for a in db["attempts"].rows if a["session_id"]]
    billed = sum((_time(a["ended_at"]) - _time(a["session_started_at"])) for a in attempts if a["ended_at"])
    cells = list(db["benchmark_manifest"].rows)
    sessions = httpx.get(f"{url}/sandbox/state", headers=SANDBOX_AUTH).json()["sessions"]
    running = [s for s in sessions if s["status"] not in ("stopped", "failed")]
    benchmark_s = {c["cell_id"]: json.loads(c["stage_seconds"]).get("benchmark", 0.0)
                   for c in cells if c["stage_seconds"]}
    return {"sessions": len(sessions), "recorded_sessions": len(attempts), "billed_s": billed,
            "cells": len(cells), "success": sum(1 for c in cells if c["status"] == "success"),
            "left_running": len(running), "benchmark_s": benchmark_s}


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_root = Path(tempfile.mkdtemp(prefix="gpubench-cost-"))
    scale = args.time_scale
    matrix = write_matrix(work_root, scale)
    setups = setup_seconds(matrix, scale)
    configured = lower_bound(matrix, setups, {})
    cells = sum(len(c) for c in _groups(matrix).values())
    print(f"cost: seed 001 matrix, {cells} cells in {len(setups)} reuse groups, -n {args.workers}, "
          f"time scale {scale:g} (benchmark {SEED_DURATION_S * scale:g} s per cell)")
    print(f"lower bound with the configured durations: {sum(configured.values()):.1f} sandbox GPU-seconds = "
          f"{sum(configured.values()) / scale / 3600:.2f} real GPU-hours; setups {sum(setups.values()):.1f} s; "
          f"fewest sessions possible {len(setups)} ({len(setups) / cells:.2f} per cell)")
    results = {}
    try:
        for reuse in ("group", "cell"):
            work = work_root / reuse
            work.mkdir()
            shutil.copy(matrix, work / matrix.name)
            sandbox, url = start_sandbox(scale)
            try:
                wall = run_pytest(work / matrix.name, url, work, reuse, args)
                results[reuse] = {**measure(work, url), "wall_s": wall}
            finally:
                sandbox.stdin.close()
                sandbox.wait(60)
    finally:
        if not args.keep:
            shutil.rmtree(work_root, ignore_errors=True)
        else:
            print(f"work directory kept: {work_root}")
    print()
    print(f"{'reuse':<7}{'sessions':>9}{'per ok cell':>12}{'billed s':>10}{'real GPU-h':>11}{'bound s':>9}"
          f"{'x bound':>9}{'wall s':>8}{'longest':>8}{'x longest':>10}{'ideal':>7}{'x ideal':>8}"
          f"{'ok cells':>9}{'left':>5}")
    for reuse, r in results.items():
        bounds = lower_bound(matrix, setups, r["benchmark_s"])
        r["bound_s"], r["longest_s"] = sum(bounds.values()), max(bounds.values())
        r["makespan_s"] = makespan(list(bounds.values()), args.workers)
        per_cell = r["sessions"] / r["success"] if r["success"] else float("inf")
        print(f"{reuse:<7}{r['sessions']:>9}{per_cell:>12.2f}{r['billed_s']:>10.1f}"
              f"{r['billed_s'] / scale / 3600:>11.2f}{r['bound_s']:>9.1f}{r['billed_s'] / r['bound_s']:>9.3f}"
              f"{r['wall_s']:>8.1f}{r['longest_s']:>8.1f}{r['wall_s'] / r['longest_s']:>10.2f}"
              f"{r['makespan_s']:>7.1f}{r['wall_s'] / r['makespan_s']:>8.2f}"
              f"{r['success']:>9}{r['left_running']:>5}")
    on, off = results["group"], results["cell"]
    print()
    print(f"reuse saves {1 - on['billed_s'] / off['billed_s']:.1%} of the GPU time billed "
          f"({off['billed_s']:.1f} -> {on['billed_s']:.1f} s) and {off['sessions'] - on['sessions']} sessions")
    models_s = later_models_seconds(matrix, scale)
    with_models = on["bound_s"] + models_s
    print(f"the later models' downloads and loads (catalog): {models_s:.1f} s; with them in the bound, "
          f"billed / bound = {on['billed_s'] / with_models:.3f} (reuse) and "
          f"{off['billed_s'] / (off['bound_s'] + models_s):.3f} (one session per cell)")
    ratio = on["billed_s"] / on["bound_s"]
    per_cell = on["sessions"] / on["success"] if on["success"] else float("inf")
    ok_ratio, ok_sessions = ratio <= TARGET_RATIO, per_cell <= TARGET_SESSIONS_PER_CELL
    print(f"target billed <= {TARGET_RATIO} x lower bound: {ratio:.3f} {'PASS' if ok_ratio else 'MISS'}")
    print(f"target sessions per successful cell <= {TARGET_SESSIONS_PER_CELL}: {per_cell:.2f} "
          f"{'PASS' if ok_sessions else 'MISS'} (the floor on this matrix is {len(setups)}/{cells} = "
          f"{len(setups) / cells:.2f}: one session per GPU and provider)")
    clean = all(r["left_running"] == 0 and r["sessions"] == r["recorded_sessions"] for r in results.values())
    print(f"sessions left running: {sum(r['left_running'] for r in results.values())}; "
          f"manifest and sandbox agree on sessions: {'yes' if clean else 'NO'}")
    return 0 if ok_ratio and ok_sessions and clean else 1


if __name__ == "__main__":
    sys.exit(main())
