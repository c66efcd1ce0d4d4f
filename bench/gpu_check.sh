#!/usr/bin/env bash
# The gpu test tier (tests/gpu) on a machine with an NVIDIA GPU and PyTorch, from the repository
# root, with nothing from the network: `cloud: local` microbenchmark cells end to end, NVML against
# the real nvidia-smi, the figures against the datasheet, telemetry, the host left as found.
#
#   bash bench/gpu_check.sh            # results in /tmp/gpubench-gpu-check (and $OUT when set)
#
# Where the project is not installed (a GPU box with torch, pytest and nvidia-ml-py only), put
# wheels of the missing dependencies in .whl/ (bench/gpu_wheels.txt lists them): they are
# installed into /tmp/site, offline, and put on PYTHONPATH with this checkout. A missing GPU
# fails here (GPUBENCH_REQUIRE_GPU=1) rather than passing by skipping every test.
# Read-only on the GPU: nothing sets a clock, a power limit, persistence or the compute mode.
set -u
cd "$(dirname "$0")/.."
SITE=${GPUBENCH_SITE:-/tmp/site}
RESULTS=${GPUBENCH_GPU_CHECK_DIR:-/tmp/gpubench-gpu-check}
export PYTHONDONTWRITEBYTECODE=1 GPUBENCH_REQUIRE_GPU=1
if compgen -G ".whl/*.whl" >/dev/null; then
  # A wheel is a zip file: without pip, unpacking it is the same install (no scripts are needed).
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl ||
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$SITE" .whl/*.whl || exit 1
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
{
  date -u
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,persistence_mode,compute_mode \
    --format=csv
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
               "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
} >"$RESULTS/machine.txt" 2>&1
cat "$RESULTS/machine.txt"
timeout 290 python3 -m pytest tests/gpu -p no:cacheprovider -q -rA --basetemp "$RESULTS/basetemp" \
  --junitxml "$RESULTS/junit.xml" 2>&1 | tee "$RESULTS/pytest.txt"
rc=${PIPESTATUS[0]}
# What the run left for reading: its matrix, store (manifest.db), progress files, JUnit, what it found.
run="$RESULTS/basetemp/gpu-tier-run"
[ -d "$run" ] && cp -r "$run" "$RESULTS/run" && cp "$RESULTS/basetemp/gpu-tier-run.json" "$RESULTS/run/" 2>/dev/null
rm -rf "$RESULTS/basetemp"
if [ -n "${OUT:-}" ]; then
  cp -r "$RESULTS/." "$OUT/"
fi
echo "gpu check: exit $rc; results in $RESULTS${OUT:+ and $OUT}"
exit "$rc"
