"""What a one-shot stand-in call costs on a sandbox instance: the answering service
(the wrappers in ``bin/`` now) against the old wrapper that started Python every call.

    python bench/standins.py            # 20 calls of each command, each way
    python bench/standins.py -n 50

A standalone sandbox (``gpubench sandbox``) makes one session with Ollama preinstalled
and runs its ``ollama serve``. Each command then runs ``N`` times through the
instance's wrapper and ``N`` times through the old two-line wrapper
(:func:`pytest_gpubench.sandbox.shims.module_wrapper`, written to a temp directory),
alternating, as a subprocess with the instance's environment (no SSH, so only the
call itself is measured). Per call: wall time, and CPU time of everything it costs,
the call's own processes (``sh``, ``curl``, ``python``) plus what the sandbox process
spends answering it. The ratio column is old / new.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, SANDBOX_AUTH, start_sandbox  # noqa: E402

sys.path.insert(0, str(REPO))  # this checkout's stand-ins, as the sandbox it starts (cwd=REPO) uses

from pytest_gpubench.sandbox import shims  # noqa: E402

PREINSTALLED_4090 = "vastai-18430201"
COMMANDS = [
    ("nvidia-smi", "--query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits"),
    ("nvidia-smi", "--query-gpu=compute_cap --format=csv,noheader,nounits"),
    ("nvidia-smi", "-q -x"),
    ("ollama", "--version"),
    ("df", "-Pk ."),
    ("curl", "-fsSL https://ollama.com/install.sh"),
    ("curl", "-s -o /dev/null {sandbox}/health"),
]


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _session(api: httpx.Client) -> dict[str, str]:
    body = {"consumer_id": f"bench-{uuid.uuid4().hex[:8]}", "offer_id": PREINSTALLED_4090,
            "workload_type": "interactive", "reservation_hours": 1}
    created = api.post("/api/v1/sessions", json=body)
    created.raise_for_status()
    session_id = created.json()["session"]["id"]
    deadline = time.monotonic() + 60
    while api.get(f"/api/v1/sessions/{session_id}").json()["status"] != "running":
        if time.monotonic() > deadline:
            raise SystemExit("the session did not start")
        time.sleep(0.05)
    return next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session_id)


def _old_wrappers(directory: Path, bin_dir: Path) -> None:
    for name, text in {
        "nvidia-smi": shims.module_wrapper(shims.NVIDIA_SMI_MODULE),
        "ollama": shims.module_wrapper(shims.OLLAMA_MODULE),
        "df": shims.module_wrapper(shims.DF_MODULE),
        "curl": shims.module_wrapper(shims.SHIMS_MODULE, "curl", str(bin_dir)),
    }.items():
        shims.write_executable(directory / name, text)


def _measure(argv: list[str], env: dict[str, str], cwd: Path, sandbox_pid: int) -> tuple[float, float, bytes]:
    """One call: (wall seconds, CPU seconds incl. the sandbox's share, stdout)."""
    cpu0, server0, wall0 = _children_cpu(), _process_cpu(sandbox_pid), time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - wall0
    cpu = _children_cpu() - cpu0 + _process_cpu(sandbox_pid) - server0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit status {done.returncode}")
    return wall, cpu, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--calls", type=int, default=20, help="calls of each command, each way (default 20)")
    calls = parser.parse_args().calls
    if shutil.which("curl") is None:
        raise SystemExit("no curl on PATH: the wrappers fall back to Python, nothing to compare")
    process, url = start_sandbox(0.01)
    serve = None
    try:
        with httpx.Client(base_url=url, headers=SANDBOX_AUTH, timeout=30) as api, \
                tempfile.TemporaryDirectory() as old_dir:
            state = _session(api)
            root = Path(state["instance_dir"])
            bin_dir, home = root / "bin", root / "home"
            env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
                   "TMPDIR": str(root / "tmp"), "LANG": "C.UTF-8", "OLLAMA_HOST": state["ollama_host"],
                   shims.INSTANCE_ENV: str(root / "instance.json")}
            serve = subprocess.Popen([str(bin_dir / "ollama"), "serve"], env=env, cwd=home,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while b"ollama version is" not in subprocess.run([str(bin_dir / "ollama"), "--version"], env=env,
                                                             stdout=subprocess.PIPE).stdout:
                if time.monotonic() > deadline:
                    raise SystemExit("ollama serve did not answer")
                time.sleep(0.05)
            _old_wrappers(Path(old_dir), bin_dir)
            print(f"{calls} calls of each, alternating; per call: wall ms, CPU ms (call + sandbox share)")
            print(f"{'command':<84} {'new wall':>8} {'old wall':>8} {'new CPU':>8} {'old CPU':>8} {'CPU ratio':>9}")
            totals = {"new": 0.0, "old": 0.0}
            for program, args in COMMANDS:
                words = args.format(sandbox=url).split()
                samples: dict[str, list[tuple[float, float]]] = {"new": [], "old": []}
                outputs: dict[str, bytes] = {}
                for _ in range(calls):
                    for side, directory in (("new", bin_dir), ("old", Path(old_dir))):
                        wall, cpu, out = _measure([str(directory / program), *words], env, home, process.pid)
                        samples[side].append((wall, cpu))
                        outputs[side] = out
                if args != "-q -x" and outputs["new"] != outputs["old"]:
                    raise SystemExit(f"{program} {args}: the answers differ")
                wall_new, wall_old = (statistics.median(w for w, _ in samples[s]) * 1000 for s in ("new", "old"))
                cpu_new, cpu_old = (sum(c for _, c in samples[s]) / calls * 1000 for s in ("new", "old"))
                totals["new"] += cpu_new
                totals["old"] += cpu_old
                label = f"{program} {args.format(sandbox='<sandbox>')}"
                print(f"{label:<84} {wall_new:8.1f} {wall_old:8.1f} {cpu_new:8.1f} {cpu_old:8.1f} "
                      f"{cpu_old / max(cpu_new, 1e-9):9.1f}")
            print(f"{'all commands, one call each':<84} {'':>8} {'':>8} {totals['new']:8.1f} {totals['old']:8.1f} "
                  f"{totals['old'] / max(totals['new'], 1e-9):9.1f}")
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(10)
        process.stdin.close()
        process.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
