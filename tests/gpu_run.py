"""The ``gpu`` tier's run: one ``cloud: local`` matrix on this machine's GPU, and the host around it.

:func:`run_once` writes a microbenchmark-only matrix for this machine's first GPU type (no
model: nothing is downloaded), reads the host (``gpucheck.HostSnapshot``), runs ``pytest`` on
the matrix in a child process whose environment carries :data:`MARK` (so every process it
starts, even one that left its process group, can be found afterwards), waits for the GPU's
memory to come back, reads the host again, and keeps it all as a :class:`LocalRun` in a JSON
file beside the tier's temporary folders: under ``-n`` the first worker runs it (under a file
lock) and the others read what it found.
"""

from __future__ import annotations

import fcntl
import json
import os
import site
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from pytest_gpubench.measure.gpucheck import (
    HostSnapshot,
    list_entries,
    processes_with_marker,
    query_compute_apps,
    query_gpu_csv,
    query_gpu_states,
)
from pytest_gpubench.gpuinfo import gpu_type_of, parse_gpu_query_csv

#: In the environment of the run's processes (and so of every process they start): ``MARK=<uuid>``.
MARK = "GPUBENCH_GPU_TIER_RUN"
#: Memory a GPU may still have in use after the run beyond what it had before (MiB).
MEMORY_TOLERANCE_MIB = 128
#: The microbenchmarks: big enough to be near the card's peak (a 16384-square matmul) and to keep the
#: GPU busy for about a second on an H100 (so the 0.2 s telemetry sees it), small enough for a 16 GB card.
MATRIX = """\
# The gpu tier's run (tests/gpu): this machine's GPU, microbenchmarks only: no model, nothing downloaded.
name: gpu-tier
cloud: local
workload: {{telemetry_interval: 0.2}}
matrix:
  - gpu: {gpu}
    provider: local
    microbench: {{kinds: [memory_bandwidth, matmul], precisions: [fp16, bf16], runs: 30, warmup: 3,
                 memory_mib: 2048, matmul_size: 16384}}
"""
#: Names a run may add to a watched directory, and why.
ALLOWED = {
    # cloud: local's own home (docs/providers.md): kept between runs, as a host keeps its user's home.
    "~": [".gpubench",
          # CUDA's own JIT cache (the driver writes it when a kernel is compiled for this GPU at load).
          ".nv"],
}


class LocalRun(BaseModel):
    """What :func:`run_once` found."""

    returncode: int
    output: str
    folder: str
    manifest: str
    gpu: str
    product: str
    before: HostSnapshot
    after: HostSnapshot
    #: Directory -> the names a run may add there (:data:`ALLOWED`, home expanded).
    allowed: dict[str, list[str]]
    #: When the run started and ended (unix seconds) and how long it took.
    started_at: float
    ended_at: float
    wall_s: float
    #: Seconds after the run until the GPUs' memory was back within the tolerance (or gave up).
    settle_s: float


def watched_directories() -> list[Path]:
    """Where a run must leave nothing behind: the temporary folders, the home, the working directory."""
    return [Path("/tmp"), Path("/dev/shm"), Path.home(), Path.cwd()]


def snapshot(mark: str) -> HostSnapshot:
    """The host now (every read a query)."""
    return HostSnapshot(gpus=query_gpu_states(), compute_apps=query_compute_apps(),
                        run_processes=frozenset(processes_with_marker(MARK, mark)),
                        files=list_entries(watched_directories()))


def first_gpu() -> tuple[str, str]:
    """This machine's first GPU: nvidia-smi's product name and the GPU type ``cloud: local`` offers it as."""
    fields, text = query_gpu_csv(["index", "name"])
    rows = [row for row in parse_gpu_query_csv(text, fields) if row.get("name")]
    product = str(rows[0]["name"])
    return product, gpu_type_of(product)


def plugin_args() -> list[str]:
    """``-p pytest_gpubench.plugin.hooks`` where the package is on ``PYTHONPATH`` but not installed
    (no ``pytest11`` entry point: the device's carried wheels); nothing where pytest loads it itself."""
    installed = any(entry.value.startswith("pytest_gpubench") for entry in metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_gpubench.plugin.hooks"]


def _wait(condition, timeout: float, step: float = 0.5) -> float:
    """Seconds until ``condition()`` held (polled), or ``timeout`` when it never did."""
    start = time.monotonic()
    while not condition() and time.monotonic() - start < timeout:
        time.sleep(step)
    return time.monotonic() - start


def run(folder: Path) -> LocalRun:
    """Run the matrix in ``folder`` (created) with the host read around it."""
    folder.mkdir(parents=True, exist_ok=True)
    product, gpu = first_gpu()
    matrix = folder / "gpubench_gpu_tier.yaml"
    matrix.write_text(MATRIX.format(gpu=json.dumps(gpu)))
    reports = folder / "reports"
    mark = uuid.uuid4().hex
    before = snapshot(mark)
    # The run's settings are its command line's, not this environment's (the sandbox's stand-ins stay: a dry run).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPUBENCH_") or k in ("GPUBENCH_SANDBOX_INSTANCE", "GPUBENCH_SANDBOX_OWNER")}
    env[MARK] = mark
    # cloud: local runs its commands with HOME set to its own home (~/.gpubench/local-home), where
    # Python looks for user-site packages too: a torch or nvidia-ml-py installed with `pip install
    # --user` would vanish there and the cell would try to install torch (from the network). The
    # tier is about the GPU, not about where its Python keeps packages: the user site stays on the path.
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and Path(user_site).is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), user_site]))
    command = [sys.executable, "-m", "pytest", str(matrix), *plugin_args(), "-p", "no:cacheprovider",
               "--rootdir", str(folder), "-rA", "--junitxml", str(folder / "junit.xml"),
               "--gpubench-reports", str(reports), "--gpubench-store", str(reports / "manifest.db")]
    started_at, start = time.time(), time.monotonic()
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=420)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, output = -1, f"the run did not end within 420 s: {exc.stdout!r}"
    wall, ended_at = time.monotonic() - start, time.time()
    # A process that is ending as the run ends gets a moment; one still there after it is left behind.
    _wait(lambda: not processes_with_marker(MARK, mark), 10)
    start_memory = {gpu.uuid: gpu.memory_used_mib or 0 for gpu in before.gpus}
    settle = _wait(lambda: all((gpu.memory_used_mib or 0) <= start_memory.get(gpu.uuid, 0) + MEMORY_TOLERANCE_MIB
                               for gpu in query_gpu_states()), 60)
    after = snapshot(mark)
    home = str(Path.home())
    allowed = {home if directory == "~" else directory: names for directory, names in ALLOWED.items()}
    return LocalRun(returncode=returncode, output=output[-20000:], folder=str(folder),
                    manifest=str(reports / "manifest.db"), gpu=gpu, product=product, before=before, after=after,
                    allowed=allowed, started_at=started_at, ended_at=ended_at, wall_s=wall, settle_s=settle)


def run_once(shared: Path) -> LocalRun:
    """:func:`run` once for every process sharing ``shared`` (the xdist workers of one session)."""
    shared.mkdir(parents=True, exist_ok=True)
    found = shared / "gpu-tier-run.json"
    with open(shared / "gpu-tier-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found.exists():
            return LocalRun.model_validate_json(found.read_text())
        result = run(shared / "gpu-tier-run")
        found.write_text(result.model_dump_json())
        return result
