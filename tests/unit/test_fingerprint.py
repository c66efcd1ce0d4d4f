"""Comparable baselines, issue 9 item 9: a fingerprint of what changes a cell's figures."""

from __future__ import annotations

import json
import sqlite3

from pytest_gpubench.measure.compare import fingerprint, incomparable, stored_fingerprint
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults

BASE = dict(prompts=["Why is the sky blue?", {"prompt": "2+2?", "expect": ["4"]}], max_tokens=64, concurrency=1,
            rate=None, think=None, warmup_requests=1, runtime="ollama", runtime_version="0.12.4",
            model_digest="sha256:abc")


def baseline_with(fp, run_id="r1"):
    """A Manifest.baseline answer whose result stored ``fp`` (None: a result from before fingerprints)."""
    details = {"metrics": {}} if fp is None else {"fingerprint": fp.model_dump(mode="json")}
    return {"run_id": run_id, "benchmark": {"details_json": json.dumps(details)}}


def test_the_same_workload_and_runtime_give_the_same_fingerprint():
    assert fingerprint(**BASE) == fingerprint(**BASE)
    assert incomparable(fingerprint(**BASE), baseline_with(fingerprint(**BASE))) is None
    # One warm-up or five: the measured window starts warm either way.
    assert fingerprint(**{**BASE, "warmup_requests": 5}).hash == fingerprint(**BASE).hash


def test_what_differs_is_named_baseline_value_first():
    old = fingerprint(**BASE)
    cases = {
        "max_tokens": ({"max_tokens": 128}, "max_tokens 64 -> 128"),
        "prompts": ({"prompts": ["Why is the sky blue?"]}, "prompts differ"),
        "think": ({"think": False}, "think default -> false"),
        "runtime": ({"runtime_version": "0.13.0"}, "runtime ollama 0.12.4 -> ollama 0.13.0"),
        "load": ({"concurrency": 4}, "load concurrency 1 -> concurrency 4"),
        "rate": ({"rate": 2.5}, "load concurrency 1 -> rate 2.5/s"),
        "warmup": ({"warmup_requests": 0}, "warmup warm-up -> no warm-up"),
        "digest": ({"model_digest": "sha256:def"}, "model digest differs"),
        "expect": ({"prompts": ["Why is the sky blue?", {"prompt": "2+2?", "expect": ["four"]}]}, "prompts differ"),
    }
    for name, (change, text) in cases.items():
        new = fingerprint(**{**BASE, **change})
        assert new.hash != old.hash, name
        assert incomparable(new, baseline_with(old)) == f"run r1 differs: {text}", name
    both = fingerprint(**{**BASE, "max_tokens": 128, "think": True})
    assert incomparable(both, baseline_with(old)) == "run r1 differs: max_tokens 64 -> 128, think default -> true"


def test_a_baseline_without_a_fingerprint_is_not_comparable():
    why = incomparable(fingerprint(**BASE), baseline_with(None, "seed"))
    assert why == "run seed stored no workload fingerprint (it predates them), so its workload is unknown"
    imported = {**baseline_with(None, "import-1"), "imported_from": "answer.json (GPU Shopper BenchmarkResult)"}
    assert "(it was imported)" in incomparable(fingerprint(**BASE), imported)
    assert stored_fingerprint({"run_id": "x", "benchmark": None}) is None  # a manifest from before results rows
    assert stored_fingerprint({"benchmark": {"details_json": "not json"}}) is None


def test_the_manifest_keeps_the_hash_in_its_own_column_and_old_files_gain_it(tmp_path):
    path = tmp_path / "m.db"
    with Manifest(path) as m:
        m.start_run("r1", [], [])
        row_id = m.add_cell("r1", "cell", gpu_type="RTX 4090", provider="vastai", model="qwen2:7b", matrix_file="m")
        benchmark_id = m.add_benchmark(row_id, BenchmarkResult(results=PerformanceResults()), [])
        fp = fingerprint(**BASE)
        m.set_details(benchmark_id, {"fingerprint": fp.model_dump(mode="json")})
        m.finish_cell(row_id, status="success")
        assert m.benchmarks("r1")[0]["workload_fingerprint"] == fp.hash
        assert stored_fingerprint(m.baseline("cell")) == fp
    # A file from before the column: opening it adds the column, old rows keep NULL.
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE benchmarks DROP COLUMN workload_fingerprint")
    with Manifest(path) as m:
        assert m.benchmarks("r1")[0]["workload_fingerprint"] is None
