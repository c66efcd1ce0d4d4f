"""gpubench import of a checkpoint the real load generator wrote, interrupted while it
measured an Ollama stand-in (a process of the sandbox's instance): imported as partial,
its figures the stand-in's truth. The other import tests are in tests/unit/test_import.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from standin_helpers import RATE, Server, write_instance

from pytest_gpubench.commands.import_formats import CHECKPOINT
from pytest_gpubench.commands.importer import Assumed, import_files
from pytest_gpubench.matrix.cells import SEED_PROMPTS
from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan
from pytest_gpubench.measure.results import BenchmarkResult
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore


def test_an_interrupted_run_of_the_real_load_generator_imports_as_partial(tmp_path):
    server = Server(write_instance(tmp_path / "instance"))
    try:
        server.pull("qwen2:7b")
        config = BenchmarkPlan(model="qwen2:7b", duration=60, max_tokens=48, prompts=SEED_PROMPTS,
                               warmup_requests=1, progress_interval=0.5, checkpoint_every=2,
                               checkpoint_path=str(tmp_path / "ck" / "checkpoint.json")).config(server.url)
        process = subprocess.Popen([sys.executable, "-", json.dumps(config)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        process.stdin.write(LOADGEN_SOURCE)
        process.stdin.close()
        measured = 0
        for line in process.stdout:
            event = json.loads(line)
            measured += event["event"] == "request" and not event["warmup"]
            if measured == 4:
                break
        process.send_signal(signal.SIGTERM)
        process.stdout.read()
        assert process.wait(30) == 0
    finally:
        server.stop()
    checkpoint = tmp_path / "ck" / "checkpoint.json"
    with Manifest(tmp_path / "m.db") as manifest:
        report = import_files([str(checkpoint)], SqliteStore(manifest), argv=["gpubench", "import"],
                              assumed=Assumed(gpu="RTX 4090", provider="local"))
        [row], [bench] = manifest.cells(), manifest.benchmarks()
    assert report.files[0].formats == [CHECKPOINT]
    assert row["status"] == "partial" and "status interrupted" in row["error_message"]
    assert row["cell_id"] == "RTX_4090-local-qwen2:7b"
    result = BenchmarkResult.model_validate_json(bench["result_json"])
    assert result.results.total_requests >= 4 and result.results.total_errors == 0
    # The stand-in streams at RATE: the imported figures are the measured truth.
    assert result.results.p50_tokens_per_second == pytest.approx(RATE, rel=0.05)
