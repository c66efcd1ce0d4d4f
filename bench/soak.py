"""Soak test: a large matrix on the sandbox under random faults, as an overnight run would meet them.

    python bench/soak.py                      # 200 cells, -n 8, 20% of cells meet a fault
    python bench/soak.py --cells 40 -n 4      # a smaller one

It starts a standalone sandbox (``gpubench sandbox``), writes a matrix of ``--cells``
cells from the sandbox catalog's GPU x provider x model rates (a ``concurrency``
axis multiplies the rows up to the count), runs ``pytest -n N`` on it while a
fault thread injects, spread over the run, ``round(cells x --fault-share)`` faults
drawn from seed 001's failure list (provisioning errors at boot and at create,
stale inventory, SSH that never comes up, instances killed mid-run), then runs
``gpubench cleanup`` and prints:

* cells run and their statuses (from the manifest), manifest rows (must equal cells);
* sessions created, sessions per cell, sessions left running (must be 0);
* money spent in all, and on cells that produced no data.

Exit status 0 when nothing is left running and every cell has its row, 1 otherwise.
Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import sqlite_utils

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_common import start_sandbox  # noqa: E402 - bench/ is on sys.path: the script's own directory

from pytest_gpubench.sandbox.catalog import load_catalog  # noqa: E402

FAULT_KINDS = ("provision_error_boot", "provision_error_create", "stale_inventory", "no_ssh", "kill_instance")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("-n", "--workers", type=int, default=8)
    parser.add_argument("--fault-share", type=float, default=0.2, help="faults per cell (default 0.2)")
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--duration", type=float, default=1.0, help="benchmark seconds per cell")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


# ------------------------------------------------------------------- the matrix


def matrix_rows() -> list[dict[str, str]]:
    """Every (GPU, provider, model) the catalog has a rate and an offer for, whose model fits the GPU."""
    catalog = load_catalog()
    providers_of: dict[str, set[str]] = {}
    for offer in catalog.offers:
        if offer.available:
            providers_of.setdefault(offer.gpu_type, set()).add(offer.provider)
    rows = []
    for rate in catalog.rates:
        gpu = catalog.gpus[rate.gpu]
        if catalog.models[rate.model].vram_gb > gpu.nominal_gb:
            continue
        for provider in sorted(providers_of.get(rate.gpu, ())):
            if rate.provider in (None, provider):
                rows.append({"gpu": rate.gpu, "provider": provider, "model": rate.model})
    unique = {(r["gpu"], r["provider"], r["model"]): r for r in rows}
    return sorted(unique.values(), key=lambda r: (r["gpu"], r["provider"], r["model"]))


def write_matrix(path: Path, cells: int, duration: float) -> int:
    """A matrix of exactly ``cells`` cells: each row gets a concurrency axis long enough."""
    rows = matrix_rows()
    per_row = math.ceil(cells / len(rows))
    lines = ["name: soak", "workload:", f"  duration: {duration}s", "  max_tokens: 16", "  warmup_requests: 0",
             "  progress_interval: 1s",
             # As in gpubench_seed.yaml: the server gives every TensorDock offer a flat 0.3.
             "offer:", "  min_availability_confidence: {default: 0.5, tensordock: 0.2}", "matrix:"]
    left = cells
    for row in rows:
        take = min(per_row, left)
        if take <= 0:
            break
        left -= take
        levels = ", ".join(str(c) for c in range(1, take + 1))
        lines += [f"  - gpu: {row['gpu']}", f"    provider: {row['provider']}", f"    model: \"{row['model']}\"",
                  f"    workload: {{concurrency: [{levels}]}}"]
    path.write_text("\n".join(lines) + "\n")
    return cells - left


# ------------------------------------------------------------------- the faults


class FaultInjector(threading.Thread):
    """Injects ``total`` faults spread over ``expected_seconds``, recording each."""

    def __init__(self, url: str, total: int, expected_seconds: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.url, self.total, self.rng = url, total, random.Random(seed)
        self.interval = max(0.5, expected_seconds / max(1, total))
        self.injected: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as api:
            offers = [o["id"] for o in api.get("/api/v1/inventory").json()["offers"]]
            while sum(self.injected.values()) < self.total and not self.stop.wait(self.interval):
                kind = self.rng.choice(FAULT_KINDS)
                if kind == "kill_instance":
                    running = [s["id"] for s in api.get("/sandbox/state").json()["sessions"]
                               if s["status"] == "running"]
                    if not running:
                        continue
                    body: dict[str, Any] = {"fault": "kill_instance", "session_id": self.rng.choice(running)}
                else:
                    body = {"fault": kind.removesuffix("_boot").removesuffix("_create"),
                            "offer_id": self.rng.choice(offers), "times": 1}
                    if kind.startswith("provision_error"):
                        body["when"] = kind.rsplit("_", 1)[1]
                if api.post("/sandbox/faults", json=body).status_code < 300:
                    self.injected[kind] += 1


# ------------------------------------------------------------------- the run


def run_pytest(matrix: Path, url: str, work: Path, args: argparse.Namespace) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # also without pip install
    command = [sys.executable, "-m", "pytest", str(matrix), "-n", str(args.workers), "-q", "-p", "no:cacheprovider",
               "--rootdir", str(work), "--gpubench-api", url, "--gpubench-time-scale", str(args.time_scale),
               "--gpubench-live", "false", "--gpubench-reports", str(work / "reports"),
               "--gpubench-manifest", str(work / "reports" / "manifest.db")]
    return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)


def run_cleanup(url: str, work: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "cleanup", "--api", url,
                           "--manifest", str(work / "reports" / "manifest.db")],
                          capture_output=True, text=True, cwd=REPO)
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[-1] if text else f"exit {done.returncode}"


def report(work: Path, url: str, cells: int, workers: int, injector: FaultInjector, wall: float,
           cleanup_line: str) -> bool:
    db = sqlite_utils.Database(work / "reports" / "manifest.db")
    rows = list(db["benchmark_manifest"].rows)
    statuses = Counter(r["status"] for r in rows)
    stages = Counter(r["failure_stage"] for r in rows if r["status"] in ("failed", "partial") and r["failure_stage"])
    state = httpx.get(f"{url}/sandbox/state", timeout=30).json()
    sessions = state["sessions"]
    left_running = [s["id"] for s in sessions if s["status"] in ("provisioning", "running", "stopping")]
    # What the cells cost (price x lifetime of every session a cell rented, failed
    # provisioning attempts included), and what of it bought no measurement.
    spent = sum(r["cost_usd"] or 0.0 for r in rows)
    wasted = sum(r["cost_usd"] or 0.0 for r in rows if not r["benchmark_id"])
    attempts = list(db["attempts"].rows) if "attempts" in db.table_names() else []
    failed_attempts = [a for a in attempts if a["status"] == "failed"]
    print(f"cells: {cells} in the matrix, run in {wall:.0f} s with -n {workers}")
    print(f"faults injected: {sum(injector.injected.values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(injector.injected.items()))})")
    print(f"statuses: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}")
    if stages:
        print(f"failure stages: {', '.join(f'{k} {v}' for k, v in sorted(stages.items()))}")
    print(f"manifest rows: {len(rows)} (cells: {cells}) {'OK' if len(rows) == cells else 'MISMATCH'}")
    verdict = "OK" if not left_running else "LEFT RUNNING: " + ", ".join(left_running)
    print(f"sessions created: {len(sessions)} ({len(sessions) / max(1, cells):.2f} per cell); "
          f"left running: {len(left_running)} {verdict}")
    print(f"provisioning attempts: {len(attempts)}, failed {len(failed_attempts)} "
          f"(${sum(a['cost_usd'] or 0.0 for a in failed_attempts):.4f})")
    print(f"gpubench cleanup: {cleanup_line}")
    print(f"money spent: ${spent:.4f} in all (catalog prices x time-scaled session lifetimes); "
          f"on cells that produced no data: ${wasted:.4f} ({wasted / spent * 100 if spent else 0:.1f}%)")
    return not left_running and len(rows) == cells


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpubench-soak-"))
    matrix = work / "gpubench_soak.yaml"
    cells = write_matrix(matrix, args.cells, args.duration)
    sandbox, url = start_sandbox(args.time_scale)
    faults = round(cells * args.fault_share)
    # A rough guess at the run's length, to spread the faults over it.
    injector = FaultInjector(url, faults, expected_seconds=cells * 6 / args.workers, seed=args.seed)
    try:
        print(f"soak: {cells} cells, -n {args.workers}, {faults} faults, time scale {args.time_scale}, "
              f"work dir {work}", flush=True)
        injector.start()
        started = time.monotonic()
        done = run_pytest(matrix, url, work, args)
        wall = time.monotonic() - started
        injector.stop.set()
        injector.join(30)
        tail = [line for line in done.stdout.splitlines() if line.strip()][-1:]
        print(f"pytest exit {done.returncode}: {tail[0] if tail else ''}")
        if "Traceback" in done.stdout or "INTERNALERROR" in done.stdout:
            print("pytest printed a traceback:\n" + done.stdout[-4000:])
        (work / "pytest-output.txt").write_text(done.stdout + done.stderr)
        if not (work / "reports" / "manifest.db").exists():
            print(f"pytest wrote no manifest:\n{(done.stdout + done.stderr)[-4000:]}")
            return 1
        cleanup_line = run_cleanup(url, work)
        ok = report(work, url, cells, args.workers, injector, wall, cleanup_line)
        return 0 if ok else 1
    finally:
        sandbox.terminate()
        sandbox.wait(60)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
