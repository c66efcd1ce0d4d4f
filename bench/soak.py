"""Soak test: a large matrix on the sandbox under every kind of fault, as an overnight run would meet them.

    python bench/soak.py --cells 1000                 # the figure: 1,000 cells, -n 8, 20% meet a fault (SQLite)
    python bench/soak.py                              # 200 cells: a few minutes
    python bench/soak.py --cells 40 -n 4              # a smaller one
    python bench/soak.py --cells 600 --store postgresql://gpubench@localhost/gpubench
                                                      # three controllers on one PostgreSQL store, one of
                                                      # them SIGKILLed every ~200 ended cells and restarted

It starts a standalone sandbox (``gpubench sandbox``), writes a matrix of ``--cells``
cells from the sandbox catalog's GPU x provider x model rates (a ``concurrency``
axis up to 8, then a Poisson ``rate`` axis, multiplies the rows up to the count;
``--worker-share`` of them, 3% by default, in a second matrix file served by container workers, ``runtime: worker``), runs
them with session reuse while a fault thread injects, spread over the run,
``round(cells x --fault-share)`` faults (paced by the cells started so far, so that
a slow machine meets as many per cell) drawn in turn from every kind the sandbox has
(docs/sandbox.md): stale offers (``stale_inventory``), provisioning failure at create
and at boot (``provision_error``), SSH never up (``no_ssh``), the instance killed
mid-run (``kill_instance``), the model pull failing (``pull_error``), the runtime
crashing (``stop_ollama``), a worker container crashing (``worker_crash``, on a
session that runs workers) and the network cut mid-stream (``drop_ssh``). Offer
faults wait for the offer's next rental; session faults hit a running session at
once (one the fault can act on: Ollama serving for ``stop_ollama`` and
``pull_error``, a worker image pulled for ``worker_crash``; a kind with no such
session at that moment is tried again later). Then it runs ``gpubench cleanup``
and prints, from the store, the sandbox and the progress files:

* cells, manifest rows (must equal cells) and statuses;
* sessions created, sessions left running (must be 0);
* measured requests lost (must be 0): streamed requests the stand-ins delivered
  whole (``served_requests`` of ``/sandbox/state``) that are not in the store as a
  successful request, session by session (requests of worker cells are shown apart:
  a worker's warm-up is a streamed request too; so are, with ``--store``, those of
  sessions a killed controller used: what it measured died with it);
* cells that failed without a stage (must be 0);
* the commonest failure message per stage and per skip reason (numbers, ids and
  paths folded, so one message is counted once);
* money spent in all, and on cells that produced no data;
* wall time, and the peak resident memory of the controller (``VmHWM``) and of its
  largest xdist worker.

With ``--store postgresql://...`` it runs ``--controllers`` (3) controllers at once
on the one store and run id (bench/scale.py's machinery, bench_common.py), each with
``-n`` workers (2 here by default), and SIGKILLs one of them (in turn, with its
process group: its workers too) each time ``--kill-every`` (200) more cells have
ended, then starts it again; at the end it also prints every cell's executions
(``STARTING`` lines in the progress files, as scale.py counts them): a cell must
have exactly one execution that ended (``duplicates`` must be 0), and the starts a
kill cut short are shown apart. ``--claim-ttl`` (30 s) is how long a killed
controller's cells wait before another takes them over.

Exit status 0 when every invariant holds, 1 otherwise. Not part of the test suite:
the 1,000-cell run takes 15 minutes or more.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_common import (  # noqa: E402 - bench/ is on sys.path: the script's own directory
    SANDBOX_AUTH, PeakMemory, executions, kill_controller, pytest_command, pytest_env, start_controller,
    start_sandbox)

from pytest_gpubench.sandbox.catalog import load_catalog  # noqa: E402
from pytest_gpubench.store.opening import open_store  # noqa: E402
from pytest_gpubench.store.progress import read_progress  # noqa: E402

#: Every fault kind the soak injects, in the order it cycles through them.
FAULT_KINDS = ("stale_inventory", "provision_error_create", "provision_error_boot", "no_ssh", "kill_instance",
               "pull_error", "stop_ollama", "worker_crash", "drop_ssh")
OFFER_KINDS = ("stale_inventory", "provision_error_create", "provision_error_boot", "no_ssh")
ENDED = ("success", "partial", "failed", "skipped")
WORKER_MODEL = "qwen2:1.5b"
WORKER_PRESETS = f"""models:
  {WORKER_MODEL}:
    inference:
      docker_image: "gpubench/sandbox-worker:latest"
      env_vars: {{MODEL_NAME: "{WORKER_MODEL}"}}
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("-n", "--workers", type=int, default=None,
                        help="xdist workers (default 8; with --store, per controller, default 2)")
    parser.add_argument("--fault-share", type=float, default=0.2, help="faults per cell (default 0.2)")
    parser.add_argument("--worker-share", type=float, default=0.03,
                        help="share of the cells served by container workers (default 0.03)")
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--duration", type=float, default=1.0, help="benchmark seconds per cell")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--store", default=None, help="a PostgreSQL URL: several controllers, one killed now and then")
    parser.add_argument("--controllers", type=int, default=3, help="controllers with --store (default 3)")
    parser.add_argument("--kill-every", type=int, default=200, help="ended cells between kills with --store")
    parser.add_argument("--claim-ttl", default="30s", help="--gpubench-claim-ttl of every controller with --store")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = 2 if args.store else 8
    if args.store and not args.store.startswith(("postgresql://", "postgres://")):
        parser.error("--store: a PostgreSQL URL (postgresql://...); the SQLite soak needs no --store")
    return args


# ------------------------------------------------------------------- the matrix


def matrix_rows() -> list[dict[str, Any]]:
    """Every (GPU, provider, model) the catalog has a rate and an offer for, whose model fits the GPU,
    with the catalog's single-stream tokens/s (``tps``)."""
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
                rows.append({"gpu": rate.gpu, "provider": provider, "model": rate.model,
                             "tps": catalog.rate(rate.gpu, provider, rate.model)[0]})
    unique = {(r["gpu"], r["provider"], r["model"]): r for r in rows}
    return sorted(unique.values(), key=lambda r: (r["gpu"], r["provider"], r["model"]))


def _matrix_lines(name: str, duration: float, head: list[str]) -> list[str]:
    return [f"name: {name}", *head, "workload:", f"  duration: {duration}s", "  max_tokens: 16",
            "  warmup_requests: 0", "  progress_interval: 1s",
            # As in gpubench_seed.yaml: the server gives every TensorDock offer a flat 0.3.
            "offer:", "  min_availability_confidence: {default: 0.5, tensordock: 0.2}", "matrix:"]


#: The highest concurrency a soak cell asks for. Past it a row's cells send Poisson arrivals
#: instead: at concurrency 15-28 a 32B model offloaded from a 24 GB card took about 4 minutes
#: a cell to answer the requests in flight at its deadline (the stand-in's batching model is
#: the catalog's), so one reuse group of such cells held the 1,000-cell soak for an hour after
#: every other group had ended. A rate cell has about ``rate x duration`` requests in flight then.
MAX_SOAK_CONCURRENCY = 8
#: Rate cells send ``RATE_FLOOR``, ``RATE_FLOOR + RATE_STEP``, ... arrivals per benchmark
#: duration. A first run's arrivals are seeded (seed 0: the first comes 1.86 mean gaps in), so
#: from 2 per duration every rate cell sends at least one request; below it some send none and
#: fail "no successful request", a failure the soak does not inject.
RATE_FLOOR, RATE_STEP = 2.0, 0.25
#: A row whose model streams under this many tokens/s alone on its GPU (the catalog's: a 32B or
#: 70B model offloaded from a card too small for it) gets at most :data:`SLOW_ROW_CELLS` cells.
#: Such a cell at rate 6 took 2.5 minutes to answer what was in flight at its deadline, and its
#: reuse group runs its cells one after another on one worker: 28 of them held a 1,000-cell
#: soak for 40 minutes after the other groups had ended.
SLOW_TPS, SLOW_ROW_CELLS = 20.0, 4


def _row_lines(row: dict[str, Any], axis: str) -> list[str]:
    return [f"  - gpu: {row['gpu']}", f"    provider: {row['provider']}", f"    model: \"{row['model']}\"",
            f"    workload: {{{axis}}}"]


def _shares(rows: list[dict[str, Any]], cells: int) -> list[int]:
    """How many of ``cells`` each row gets: a slow row (under :data:`SLOW_TPS`) at most
    :data:`SLOW_ROW_CELLS`, the others the rest, evenly (the first ones one more)."""
    slow = [row["tps"] < SLOW_TPS for row in rows]
    shares = [0] * len(rows)
    left = cells
    for index in (i for i, is_slow in enumerate(slow) if is_slow):
        shares[index] = min(SLOW_ROW_CELLS, left, math.ceil(cells / len(rows)))
        left -= shares[index]
    fast = [i for i, is_slow in enumerate(slow) if not is_slow] or list(range(len(rows)))
    for position, index in enumerate(fast):
        shares[index] += left // len(fast) + (position < left % len(fast))
    return shares


def _spread(lines: list[str], rows: list[dict[str, Any]], cells: int, duration: float) -> int:
    """Add ``cells`` cells over ``rows`` (:func:`_shares`): each row a concurrency axis up to
    :data:`MAX_SOAK_CONCURRENCY`, then a rate axis for the rest of its share; how many were added."""
    added = 0
    for row, take in zip(rows, _shares(rows, cells) if rows else [], strict=True):
        if take <= 0:
            continue
        added += take
        by_concurrency = min(take, MAX_SOAK_CONCURRENCY)
        lines += _row_lines(row, f"concurrency: [{', '.join(str(c) for c in range(1, by_concurrency + 1))}]")
        if take > by_concurrency:
            rates = ", ".join(f"{(RATE_FLOOR + RATE_STEP * k) / duration:g}" for k in range(take - by_concurrency))
            lines += _row_lines(row, f"rate: [{rates}]")
    return added


def write_matrix(path: Path, cells: int, duration: float) -> int:
    """A matrix of exactly ``cells`` cells: each row gets a concurrency axis long enough."""
    lines = _matrix_lines("soak", duration, [])
    added = _spread(lines, matrix_rows(), cells, duration)
    path.write_text("\n".join(lines) + "\n")
    return added


def write_matrices(work: Path, cells: int, duration: float, worker_share: float) -> tuple[list[Path], int, int]:
    """The soak's matrix files: Ollama cells, and a worker matrix for ``worker_share`` of them
    (the worker model's rows, with its presets file beside it). Returns the files and the cell counts."""
    rows = matrix_rows()
    worker_rows = [r for r in rows if r["model"] == WORKER_MODEL]
    workers = round(cells * worker_share) if worker_rows else 0
    main = work / "gpubench_soak.yaml"
    added = write_matrix(main, cells - workers, duration)
    if not workers:
        return [main], added, 0
    (work / "model_presets.yaml").write_text(WORKER_PRESETS)
    lines = _matrix_lines("soak-workers", duration, ["runtime: {name: worker, presets: model_presets.yaml}"])
    worker_cells = _spread(lines, worker_rows, workers, duration)
    (work / "gpubench_soak_workers.yaml").write_text("\n".join(lines) + "\n")
    return [main, work / "gpubench_soak_workers.yaml"], added, worker_cells


# ------------------------------------------------------------------- the faults


class FaultInjector(threading.Thread):
    """Injects ``total`` faults, cycling through :data:`FAULT_KINDS` (shuffled by ``seed``), each at a
    random offer or a running session it can act on. Paced by the run's own progress: at most
    ``share`` faults per cell started so far (``started()``), so a machine slower than expected
    meets the same faults per cell, not a pile of them waiting on a few offers."""

    def __init__(self, url: str, total: int, share: float, started: Any, seed: int, gpus: set[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.total, self.rng, self.gpus = url, total, random.Random(seed), gpus
        self.share, self.started = share, started
        self.interval = 1.0
        self.injected: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        #: Rounds that failed (the sandbox slow to answer under load, say), and the last error:
        #: the thread goes on, and the report says so.
        self.errors = 0
        self.last_error = ""
        #: Rounds tried and the slowest (seconds): a sandbox slow to answer paces the faults.
        self.rounds = 0
        self.slowest = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30, headers=SANDBOX_AUTH) as api:
            # Offer faults wait for a rental: only offers the matrix's cells can rent (one GPU of its types).
            offers = [o["id"] for o in api.get("/api/v1/inventory").json()["offers"]
                      if o.get("gpu_type") in self.gpus and (o.get("gpu_count") or 1) == 1]
            queue: list[str] = []
            while sum(self.injected.values()) < self.total and not self.stop.wait(self.interval):
                if sum(self.injected.values()) >= self.share * self.started() + 1:
                    continue
                if not queue:
                    queue = list(FAULT_KINDS)
                    self.rng.shuffle(queue)
                began = time.monotonic()
                try:
                    self._inject_next(api, queue, offers)
                except (httpx.HTTPError, ValueError, KeyError, OSError) as exc:
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"[:200]
                self.rounds += 1
                self.slowest = max(self.slowest, time.monotonic() - began)

    def _inject_next(self, api: httpx.Client, queue: list[str], offers: list[str]) -> None:
        """Inject the first kind of ``queue`` that has something to act on now (it leaves the
        queue; the kinds before it go to the queue's end, to be tried again later). One round
        tries every kind: a round that gave up at the first kind without a target (a worker
        crash while no worker runs) injected 134 of 200 faults before a 1,000-cell run ended."""
        for _ in range(len(queue)):
            kind = queue[0]
            body = self._body(api, kind, offers)
            if body is not None:
                break
            queue.append(queue.pop(0))
        else:
            return  # nothing any kind can act on now
        queue.pop(0)
        try:
            answered = api.post("/sandbox/faults", json=body).status_code
        except httpx.HTTPError:
            answered = 0
        if answered < 300 and answered:
            self.injected[kind] += 1
        else:  # the session ended meanwhile (409): counted apart, not as a fault that happened
            self.refused[kind] += 1

    def _body(self, api: httpx.Client, kind: str, offers: list[str]) -> dict[str, Any] | None:
        if kind in OFFER_KINDS:
            body: dict[str, Any] = {"fault": kind.removesuffix("_boot").removesuffix("_create"),
                                    "offer_id": self.rng.choice(offers), "times": 1}
            if kind.startswith("provision_error"):
                body["when"] = kind.rsplit("_", 1)[1]
            return body
        targets = [s for s in api.get("/sandbox/state").json()["sessions"]
                   if s["status"] == "running" and s.get("instance_dir") and _can_act(kind, Path(s["instance_dir"]))]
        if not targets:
            return None
        body = {"fault": kind, "session_id": self.rng.choice(targets)["id"]}
        if kind in ("pull_error", "worker_crash"):
            body["times"] = 1
        if kind == "worker_crash":
            body["after_tokens"] = 2  # past a one-token warm-up: a measured request meets it
        return body


def _can_act(kind: str, instance_dir: Path) -> bool:
    """Whether a session fault of ``kind`` has something to act on in this instance (its state files)."""
    state = instance_dir / "state"
    if kind in ("stop_ollama", "pull_error"):
        return (state / "ollama.pid").exists()
    if kind == "worker_crash":
        return (state / "docker" / "images.json").exists()
    return True


# ------------------------------------------------------------------- running


@dataclass
class Controller:
    """One controller process of the run (restarted after each kill: ``incarnation`` counts them)."""

    index: int
    command_for: Any
    work: Path
    process: subprocess.Popen[str] | None = None
    incarnation: int = 0
    killed: int = 0
    #: Whether its latest incarnation was killed (else it ran to its end).
    killed_last: bool = False
    memory: list[PeakMemory] = field(default_factory=list)

    def start(self) -> None:
        self.incarnation += 1
        self.killed_last = False
        reports = self.work / f"reports-{self.index}-{self.incarnation}"
        self.process = start_controller(self.command_for(reports), self.work,
                                        self.work / f"controller-{self.index}.out")
        peak = PeakMemory(self.process.pid)
        peak.start()
        self.memory.append(peak)

    def kill(self) -> None:
        assert self.process is not None
        self.memory[-1].sample()
        kill_controller(self.process)
        self.memory[-1].stop.set()
        self.killed += 1
        self.killed_last = True

    def wait(self) -> int:
        assert self.process is not None
        code = self.process.wait()
        self.memory[-1].stop.set()
        return code

    def interrupt(self, grace: float = 60.0) -> None:
        """Stop a running incarnation as Ctrl-C would (its own session does not get the soak's
        Ctrl-C): SIGINT, so that its teardown destroys its sessions, then SIGKILL after ``grace``."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            kill_controller(self.process)
        self.memory[-1].stop.set()


def ended_cells(store: str, run_id: str) -> int:
    try:
        with open_store(store) as opened:
            return sum(1 for row in opened.cells(run_id) if row.status in ENDED)
    except Exception:  # noqa: BLE001 - a store busy or not created yet: ask again later
        return 0


def run_controllers(args: argparse.Namespace, matrices: list[Path], url: str, work: Path, store: str,
                    run_id: str, total: int) -> tuple[list[Controller], float]:
    """``--controllers`` controllers on one store; one killed (in turn) and restarted every
    ``--kill-every`` ended cells (SQLite: one controller, never killed). Returns them and the wall time."""
    options = ["-n", str(args.workers), "--gpubench-store", store, "--gpubench-run-id", run_id]
    if args.store:
        options += ["--gpubench-claim-ttl", args.claim_ttl]
    count = args.controllers if args.store else 1
    controllers = [Controller(i, lambda reports: pytest_command(matrices, url, work, args.time_scale, reports,
                                                                *options), work) for i in range(count)]
    started = time.monotonic()
    try:
        for one in controllers:
            one.start()
        next_kill, victim = args.kill_every, 0
        while any(one.process is not None and one.process.poll() is None for one in controllers):
            time.sleep(2)
            if not args.store:
                continue
            done = ended_cells(store, run_id)
            if done >= next_kill and done < total:
                one = controllers[victim % count]
                if one.process is not None and one.process.poll() is None:
                    print(f"  {done} cells ended: SIGKILL controller {one.index} (pid {one.process.pid}), restarted",
                          flush=True)
                    one.kill()
                    one.start()
                victim += 1
                next_kill += args.kill_every
    except KeyboardInterrupt:
        # The controllers run in sessions of their own (so that a kill takes their workers
        # down): the terminal's Ctrl-C reaches only this script. Pass it on before the sandbox goes.
        print("interrupted: stopping the controllers (Ctrl-C to each, then SIGKILL after 60 s)", flush=True)
        for one in controllers:
            one.interrupt()
        raise
    for one in controllers:
        one.wait()
    return controllers, time.monotonic() - started


def run_cleanup(url: str, store: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest_gpubench.commands.cli", "cleanup", "--api", url,
                           "--store", store], capture_output=True, text=True, cwd=REPO, env=pytest_env())
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[-1] if text else f"exit {done.returncode}"


# ------------------------------------------------------------------- the report

_FOLD = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"(/[\w.+-]+){2,}"), "<path>"),
    (re.compile(r"\b(vastai|tensordock)-[\w-]+"), "<offer>"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
]


def fold(message: str | None) -> str:
    """A message with its numbers, ids, offers and paths folded, so one failure is counted once."""
    text = (message or "(no message)").strip()
    for pattern, replacement in _FOLD:
        text = pattern.sub(replacement, text)
    return text[:200]


def commonest(rows: list[Any], status: str) -> dict[str, tuple[int, int, str]]:
    """Per stage: (cells, count of the commonest message, the message) among ``status`` cells."""
    by_stage: dict[str, Counter[str]] = {}
    for row in rows:
        if row.status == status:
            by_stage.setdefault(row.failure_stage or "(no stage)", Counter())[fold(row.error_message)] += 1
    return {stage: (sum(c.values()), *c.most_common(1)[0][::-1]) for stage, c in sorted(by_stage.items())}


def stored_by_session(opened: Any, run_id: str, rows: list[Any]) -> Counter[str]:
    """Successful measured requests in the store, by the session their cell ran on."""
    session_of = {row.row_id: row.session_id for row in rows}
    stored: Counter[str] = Counter()
    for result in opened.results(run_id):
        stored[session_of.get(result.row_id) or "?"] += sum(
            1 for r in opened.requests(result.id) if not r.error and not r.warmup)
    return stored


def killed_sessions(controllers: list[Controller], work: Path) -> set[str]:
    """Sessions named in the progress files of controller incarnations that were killed: what
    they measured died with them (the cells were run again by another controller)."""
    found: set[str] = set()
    for one in controllers:
        for incarnation in range(1, one.incarnation + 1 if one.killed_last else one.incarnation):
            for path in (work / f"reports-{one.index}-{incarnation}").glob("progress/*/*.log"):
                for line in read_progress(path):
                    if line.fields.get("session_id"):
                        found.add(str(line.fields["session_id"]))
    return found


@dataclass
class Figures:
    cells: int
    worker_cells: int
    wall: float
    controllers: list[Controller]
    injector: FaultInjector
    cleanup_line: str


def report(args: argparse.Namespace, url: str, store: str, run_id: str, work: Path, figures: Figures) -> bool:
    """Print the soak's figures; whether every invariant held."""
    with open_store(store) as opened:
        rows = opened.cells(run_id)
        attempts = opened.attempts(run_id)
        worker_ids = {r.cell_id for r in rows if r.cell_id and "-runtime_worker" in r.cell_id}
        stored = stored_by_session(opened, run_id, rows)
    state = httpx.get(f"{url}/sandbox/state", headers=SANDBOX_AUTH, timeout=60).json()
    sessions = state["sessions"]
    never_met = Counter(f["fault"] for f in state["faults"])
    left_running = [s["id"] for s in sessions if s["status"] in ("provisioning", "running", "stopping")]
    # Per session: what its stand-ins delivered whole against what the store holds of it. Worker
    # sessions apart (a worker's warm-up streams too), and sessions of killed controllers apart.
    worker_sessions = {r.session_id for r in rows if r.cell_id in worker_ids and r.session_id}
    killed = killed_sessions(figures.controllers, work)
    lost = lost_to_kills = served_ollama = stored_ollama = served_workers = stored_workers = 0
    for s in sessions:
        served, kept = s["served_requests"], stored.get(s["id"], 0)
        if s["id"] in worker_sessions:
            served_workers, stored_workers = served_workers + served, stored_workers + kept
        elif s["id"] in killed:
            lost_to_kills += max(0, served - kept)
        else:
            served_ollama, stored_ollama = served_ollama + served, stored_ollama + kept
            lost += max(0, served - kept)
    statuses = Counter(r.status for r in rows)
    no_stage = [r.cell_id for r in rows if r.status in ("failed", "partial") and not r.failure_stage]
    spent = sum(r.cost_usd or 0.0 for r in rows)
    wasted = sum(r.cost_usd or 0.0 for r in rows if not r.benchmark_id)
    failed_attempts = [a for a in attempts if a.status == "failed"]
    injector, cells = figures.injector, figures.cells

    print(f"cells: {cells} in the matrix ({figures.worker_cells} on container workers), run in "
          f"{figures.wall:.0f} s, -n {args.workers} x {len(figures.controllers)} controller(s)")
    print(f"faults injected: {sum(injector.injected.values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(injector.injected.items()))})"
          + (f"; refused (the session ended first): {sum(injector.refused.values())}" if injector.refused else "")
          + f"; fault thread: {injector.rounds} rounds, the slowest {injector.slowest:.1f} s"
          + (f", {injector.errors} failed (last: {injector.last_error})" if injector.errors else "")
          + (f"; offer faults never met (no rental of their offer after them): {sum(never_met.values())}"
             if never_met else ""))
    print(f"statuses: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}")
    print(f"manifest rows: {len(rows)} (cells: {cells}) {'OK' if len(rows) == cells else 'MISMATCH'}")
    verdict = "OK" if not left_running else "LEFT RUNNING: " + ", ".join(left_running)
    print(f"sessions created: {len(sessions)} ({len(sessions) / max(1, cells):.2f} per cell); "
          f"left running: {len(left_running)} {verdict}")
    print(f"measured requests lost: {lost} {'OK' if not lost else 'LOST'} (streamed requests served "
          f"{served_ollama}, successful in the store {stored_ollama}, compared session by session; worker "
          f"cells: served {served_workers} with their warm-ups, stored {stored_workers}"
          + (f"; on sessions of killed controllers: {lost_to_kills} served, not stored" if killed else "") + ")")
    print(f"cells failed without a stage: {len(no_stage)} {'OK' if not no_stage else ', '.join(no_stage)}")
    for label, status in (("failures", "failed"), ("partial", "partial"), ("skips", "skipped")):
        for stage, (n, top, message) in commonest(rows, status).items():
            print(f"  {label} at {stage}: {n}; commonest ({top}): {message}")
    print(f"provisioning attempts: {len(attempts)}, failed {len(failed_attempts)} "
          f"(${sum(a.cost_usd or 0.0 for a in failed_attempts):.4f})")
    print(f"gpubench cleanup: {figures.cleanup_line}")
    print(f"money spent: ${spent:.4f} in all (catalog prices x time-scaled session lifetimes); "
          f"on cells that produced no data: ${wasted:.4f} ({wasted / spent * 100 if spent else 0:.1f}%)")
    peak_controller = max((m.controller_kib for c in figures.controllers for m in c.memory), default=0)
    peak_worker = max((m.worker_kib for c in figures.controllers for m in c.memory), default=0)
    print(f"wall time: {figures.wall:.0f} s; peak memory: controller {peak_controller / 1024:.0f} MiB, "
          f"largest xdist worker {peak_worker / 1024:.0f} MiB")
    ok = not left_running and len(rows) == cells and not lost and not no_stage
    if args.store:
        ok = exactly_once(work, run_id, rows, figures.controllers) and ok
    return ok


def exactly_once(work: Path, run_id: str, rows: list[Any], controllers: list[Controller]) -> bool:
    """Every cell started and ended once, counting a kill's cut-short starts apart."""
    started, ended = executions(work.glob(f"reports-*/progress/{run_id}/*.log"), rows)
    ids = {r.cell_id for r in rows}
    duplicates = sum(n - 1 for n in ended.values() if n > 1)
    never = sorted(i for i in ids if ended.get(i, 0) == 0)
    cut = sum(started.values()) - sum(ended.values())
    kills = sum(c.killed for c in controllers)
    print(f"executions: {sum(started.values())} starts for {len(ids)} cells; {kills} controller kills cut "
          f"{cut} start(s) short (rerun by another controller); cells that ended more than once: "
          f"{duplicates} {'OK' if not duplicates else 'DUPLICATES'}; cells that never ended: {len(never)} "
          f"{'OK' if not never else ', '.join(never[:10])}")
    return not duplicates and not never


# ------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpubench-soak-"))
    matrices, ollama_cells, worker_cells = write_matrices(work, args.cells, args.duration, args.worker_share)
    cells = ollama_cells + worker_cells
    run_id = f"soak-{int(time.time())}"
    store = args.store or str(work / "manifest.db")
    sandbox, url = start_sandbox(args.time_scale)
    faults = round(cells * args.fault_share)
    injector = FaultInjector(url, faults, args.fault_share, seed=args.seed, gpus={row["gpu"] for row in matrix_rows()},
                             started=lambda: sum(1 for _ in work.glob("reports-*/progress/*/*.log")))
    try:
        print(f"soak: {cells} cells, -n {args.workers}, {faults} faults, time scale {args.time_scale}, store "
              f"{args.store or 'SQLite'}{f' ({args.controllers} controllers)' if args.store else ''}, work dir {work}",
              flush=True)
        injector.start()
        controllers, wall = run_controllers(args, matrices, url, work, store, run_id, cells)
        injector.stop.set()
        injector.join(30)
        for one in controllers:
            out = (work / f"controller-{one.index}.out").read_text(errors="replace")
            tail = [line for line in out.splitlines() if line.strip()][-1:]
            print(f"controller {one.index}: exit {one.process.returncode if one.process else '?'}, "
                  f"{one.killed} kill(s): {tail[0] if tail else ''}")
            if "Traceback" in out or "INTERNALERROR" in out:
                print(f"controller {one.index} printed a traceback:\n" + out[-4000:])
        figures = Figures(cells, worker_cells, wall, controllers, injector, run_cleanup(url, store))
        return 0 if report(args, url, store, run_id, work, figures) else 1
    finally:
        sandbox.terminate()
        sandbox.wait(60)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
