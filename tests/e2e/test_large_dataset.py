"""Issue 21 item 6: a ShareGPT-sized dataset (5 MB) runs end to end on the sandbox.

Every prompt used to ride in the load generator's command line, which Linux caps at
128 KiB per argument: a dataset of ~130 KB failed at ``benchmark``, after the GPU was
rented and the model pulled. One short cell (few requests, few tokens) proves the
whole path: collection, the sandbox's real SSH, the instance's python3, the stand-in.
"""

from __future__ import annotations

import json

import pytest
import sqlite_utils
from e2e_helpers import manifest_rows, run_pytest

MATRIX = """
workload:
  duration: 1s
  max_tokens: 4
  warmup_requests: 0
  prompts: {dataset: big.jsonl}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:1.5b}
"""


@pytest.mark.slow
def test_a_5_mb_dataset_is_benchmarked_on_the_sandbox(tmp_path, standalone_sandbox):
    matrix = tmp_path / "gpubench_big.yaml"
    matrix.write_text(MATRIX)
    filler = "Tell me about the weather in a long and winding way. " * 190  # ~10 KB a prompt
    with (tmp_path / "big.jsonl").open("w") as out:
        for i in range(500):
            out.write(json.dumps({"prompt": f"Question {i}. {filler}"}) + "\n")
    assert (tmp_path / "big.jsonl").stat().st_size > 5_000_000
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", standalone_sandbox, "--gpubench-time-scale",
                      "0.02", "--rootdir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "success" and row["error_count"] == 0 and row["total_requests"] > 0
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    sent = [r["prompt_index"] for r in db["requests"].rows if not r["warmup"]]
    assert sent and sent == list(range(len(sent)))  # the dataset's prompts, in order
