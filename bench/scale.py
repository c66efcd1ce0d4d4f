"""Many controllers on one matrix: does every cell run exactly once, and what do claims cost?

    python bench/scale.py                               # 200 cells; 1, 2 and 4 controllers
    python bench/scale.py --cells 24 --controllers 1,2  # a smaller one
    python bench/scale.py --store postgresql://gpubench@localhost/gpubench

It starts a standalone sandbox (``gpubench sandbox``), writes a matrix of ``--cells``
cells from the sandbox catalog (``soak.write_matrix``: a tiny workload), and for each
controller count N starts N ``pytest`` processes at once on that matrix, one shared
store and one run id (``--gpubench-run-id``), the sandbox reset before each. Then it
reads the store and prints one row per N:

* wall time, and its ratio against 1 controller measured in the same run (the reference);
* duplicate runs: executions beyond the first of a cell (must be 0). An execution is a
  ``STARTING`` line in any controller's progress file of the cell (written when its
  recorder starts, before anything is rented): a second run whose result was thrown away
  (its claim lost) shows here, where counting results would hide it. (Sessions rented
  are no count: failover rents several in one execution, a reuse group one for many.);
* lost cells: cells of the matrix without a final status in the store (must be 0);
* claim overhead per cell: the median of the cells' ``stage_seconds["claim"]``, the time
  their controller spent claiming the cell and renewing its lease (store calls);
* how the cells ended, and how many each controller ran (the rest it reported ``claimed``).

Exit status 0 when no configuration ran a cell twice or lost one. Not part of the test
suite: the 200-cell default takes minutes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench_common import REPO, SANDBOX_AUTH, pytest_command, start_controller, start_sandbox
from bench_common import executions as count_executions
from soak import write_matrix

sys.path.insert(0, str(REPO))
from pytest_gpubench.store.opening import open_store  # noqa: E402

ENDED = ("success", "partial", "failed", "skipped")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--controllers", default="1,2,4", help="controller counts, comma-separated (default 1,2,4)")
    parser.add_argument("--store", default=None,
                        help="the shared store: a PostgreSQL URL (default: a SQLite file per configuration)")
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--duration", type=float, default=0.5, help="benchmark seconds per cell")
    parser.add_argument("--claim-ttl", default="60s", help="--gpubench-claim-ttl of every controller")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


def controller(matrix: Path, url: str, store: str, run_id: str, work: Path, index: int,
               args: argparse.Namespace) -> subprocess.Popen[str]:
    """One controller: pytest on the matrix, into the shared store and run."""
    command = pytest_command([matrix], url, work, args.time_scale, work / f"reports-{index}", "--gpubench-store", store,
                             "--gpubench-run-id", run_id, "--gpubench-claim-ttl", args.claim_ttl)
    return start_controller(command, work, work / f"{run_id}-{index}.out")


def measure(count: int, matrix: Path, cells: int, url: str, work: Path, args: argparse.Namespace) -> dict:
    """Run ``count`` controllers at once; what the store says afterwards."""
    httpx.post(f"{url}/sandbox/reset", headers=SANDBOX_AUTH, timeout=120).raise_for_status()
    run_id = f"scale-{count}-{int(time.time())}"
    store = args.store or str(work / f"store-{count}.db")
    started = time.perf_counter()
    processes = [controller(matrix, url, store, run_id, work, i, args) for i in range(count)]
    codes = [process.wait() for process in processes]
    wall = time.perf_counter() - started
    with open_store(store) as opened:
        rows = opened.cells(run_id)
    per_cell = executions(work, run_id, rows)
    claim = [row.stage_seconds["claim"] for row in rows if "claim" in row.stage_seconds]
    return {
        "controllers": count, "wall": wall, "codes": codes,
        "duplicates": sum(n - 1 for n in per_cell.values() if n > 1),
        "lost": cells - sum(1 for row in rows if row.status in ENDED),
        "claim_ms": statistics.median(claim) * 1000 if claim else None,
        "statuses": Counter(row.status for row in rows),
        "ran": sorted(Counter(row.worker for row in rows if row.status in ENDED).values(), reverse=True),
    }


def executions(work: Path, run_id: str, rows: list) -> Counter[str]:
    """How many times each cell (by cell id) was started: its ``STARTING`` lines in every
    controller's progress files (``reports-N/progress/<run>/<cell>.log``)."""
    return count_executions(work.glob(f"reports-*/progress/{run_id}/*.log"), rows)[0]


def table(rows: list[dict]) -> list[str]:
    reference = rows[0]["wall"]
    lines = [f"{'controllers':>11}  {'wall s':>7}  {'ratio':>5}  {'duplicates':>10}  {'lost':>4}  "
             f"{'claim ms/cell':>13}  statuses; cells per controller"]
    for row in rows:
        claim = f"{row['claim_ms']:.1f}" if row["claim_ms"] is not None else "-"
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(row["statuses"].items()))
        lines.append(f"{row['controllers']:>11}  {row['wall']:>7.1f}  {row['wall'] / reference:>5.2f}  "
                     f"{row['duplicates']:>10}  {row['lost']:>4}  {claim:>13}  {statuses}; "
                     f"{'/'.join(map(str, row['ran']))}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(n) for n in args.controllers.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpubench-scale-"))
    sandbox, url = start_sandbox(args.time_scale)
    try:
        matrix = work / "gpubench_scale.yaml"
        cells = write_matrix(matrix, args.cells, args.duration)
        print(f"scale: {cells} cells, controllers {counts}, time scale {args.time_scale}, "
              f"store {args.store or 'SQLite (one file per configuration)'}", flush=True)
        rows = []
        for count in counts:
            rows.append(measure(count, matrix, cells, url, work, args))
            print(f"  {count} controller(s): {rows[-1]['wall']:.1f} s, exit {rows[-1]['codes']}", flush=True)
        for line in table(rows):
            print(line)
        ok = all(row["duplicates"] == 0 and row["lost"] == 0 for row in rows)
        print("every cell ran exactly once" if ok else "DUPLICATE OR LOST CELLS")
        return 0 if ok else 1
    finally:
        sandbox.stdin.close()
        sandbox.wait(30)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
