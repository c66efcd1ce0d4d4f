"""The load generator as it runs on an instance, against a real Ollama stand-in."""

import asyncio
import json
import subprocess
import sys

import pytest
from standin_helpers import RATE, TTFT_MS, Server, write_instance

from pytest_gpubench.benchmark import LOADGEN_SOURCE, BenchmarkPlan, _local_lines
from pytest_gpubench.matrix import SEED_PROMPTS
from pytest_gpubench.results import RequestRecord, summarize


@pytest.fixture(scope="module")
def ollama(tmp_path_factory):
    server = Server(write_instance(tmp_path_factory.mktemp("loadgen")))
    server.pull("qwen2:7b")
    yield server
    server.stop()


def run_loadgen(config):
    done = subprocess.run([sys.executable, "-", json.dumps(config)], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def config(url, tmp_path, **extra):
    base = BenchmarkPlan(model="qwen2:7b", duration=2.0, max_tokens=48, prompts=SEED_PROMPTS, warmup_requests=1,
                         progress_interval=0.5, checkpoint_every=3,
                         checkpoint_path=str(tmp_path / "ck" / "checkpoint.json")).config(url)
    base.update(extra)
    return base


def test_events_records_checkpoint_and_measured_truth(ollama, tmp_path):
    events = run_loadgen(config(ollama.url, tmp_path))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "connection" and kinds[-1] == "finish"
    assert events[-1]["status"] == "completed"
    assert kinds.count("progress") >= 3  # every 0.5 s over 2 s, plus the final one
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert records[0].warmup and not any(r.warmup for r in records[1:])
    assert len(records) >= 4
    assert all(r.ok and r.output_tokens == r.eval_count for r in records)
    results = summarize(records, events[-1]["duration_seconds"])
    # The stand-in streams at exactly RATE after TTFT_MS: the client must see that.
    assert results.avg_tokens_per_second == pytest.approx(RATE, rel=0.03)
    assert results.p50_ttft_ms == pytest.approx(TTFT_MS, abs=15)
    checkpoint = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
    assert checkpoint["status"] == "completed"
    assert len(checkpoint["results"]) == len(records)  # seed 001: every record on the instance's disk


def test_errors_are_records_not_crashes(ollama, tmp_path):
    events = run_loadgen(config(ollama.url, tmp_path, model="not-pulled:1b", duration=0.5, warmup_requests=0))
    records = [e for e in events if e["event"] == "request"]
    assert records and all("not found" in r["error"] for r in records)
    assert events[-1] == {**events[-1], "event": "finish", "status": "completed"}


def test_local_fallback_streams_the_same_events(ollama, tmp_path):
    async def collect():
        return [line async for line in _local_lines(config(ollama.url, tmp_path, duration=0.5))]

    lines = asyncio.run(collect())
    assert json.loads(lines[-1])["event"] == "finish"
