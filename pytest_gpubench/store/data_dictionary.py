"""The manifest's data dictionary: what every table and column means, with units.

:mod:`.manifest_schema` says what the tables hold as SQLite types; this module
says what they mean to a person reading them: ``gpubench browse`` turns it into
Datasette's metadata (:mod:`.browse`), so every table and column page in the
browser explains itself. ``tests/unit/test_browse.py`` fails when a table or column of
the real schema has no description here, so add one with every column you add.

Times are ISO-8601 UTC text unless a description says otherwise; money is USD.
"""

from __future__ import annotations

import sqlite3

from pydantic import BaseModel, ConfigDict


class TableDoc(BaseModel):
    """One table: a title, what a row is, a description per column, how to show it.

    ``sort`` / ``sort_desc`` name the column Datasette orders rows by by default,
    ``facets`` the columns it counts values of above the rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    description: str
    columns: dict[str, str]
    sort: str | None = None
    sort_desc: str | None = None
    facets: tuple[str, ...] = ()


_STATUS = "pending, running, success, partial (results, but a later stage failed), failed or skipped"
_STAGES = "inventory, provision, ssh_wait, ssh_connect, runtime_setup, model_pull, benchmark, results or cleanup"

RUNS = TableDoc(
    title="Runs",
    description="One row per pytest run (a run id): who ran it, when, against which API, and how it ended.",
    sort_desc="started_at",
    facets=("status", "host"),
    columns={
        "run_id": "The run's id (--gpubench-run-id, or generated): every other table's run_id points here.",
        "started_at": "When the run started.",
        "finished_at": "When the run ended; empty while it runs, or if its process died.",
        "argv": "The pytest command line of the run, as a JSON list.",
        "matrix_files": "The matrix files the run collected, as a JSON list of paths.",
        "host": "Host name of the machine that ran the run's controller.",
        "status": "How the run ended: running, passed, failed, interrupted or 'exit N' (pytest's exit status).",
        "pid": "Process id of the run's controller; cleanup leaves the sessions of a live process alone.",
        "pid_start": "Start token of that process, so a reused pid is not mistaken for the run.",
        "api": "Base URL of the GPU Shopper API the run rented from.",
        "clouds": "The clouds the run rented through, as JSON: each `cloud:` name with its settings that are "
                  "not secret (GPU Shopper's API, the hosts inventory); empty in older rows (GPU Shopper at `api`).",
        "sandbox": "1 when the run used its own sandbox cloud (whose sessions end with it), else 0 or empty.",
        "resumed_at": "The last time another process took the run over (--gpubench-resume).",
    },
)

BENCHMARK_MANIFEST = TableDoc(
    title="Cells (benchmark manifest)",
    description=(
        "One row per matrix cell (GPU x provider x model) of a run: its status, the stage and message of a "
        "failure, the session it ran on, the headline figures and what it cost. Seed 001's columns first, "
        "then this project's."
    ),
    sort_desc="created_at",
    facets=("status", "failure_stage", "gpu_type", "provider", "model", "run_id"),
    columns={
        "id": "Row id: <run_id>/<cell_id>.",
        "run_id": "The run this cell belongs to (runs.run_id).",
        "created_at": "When the cell was added to the run (collection).",
        "gpu_type": "GPU type of the cell, as the matrix names it (e.g. RTX 4090).",
        "provider": "Cloud provider of the cell (e.g. vastai, tensordock).",
        "model": "Ollama model of the cell (e.g. qwen2:7b).",
        "session_id": "GPU Shopper session the cell ran on (the last one, if it failed over).",
        "instance_ip": "Address of the instance's SSH server.",
        "ssh_port": "Port of the instance's SSH server.",
        "status": f"Cell status: {_STATUS}.",
        "started_at": "When the cell started running.",
        "completed_at": "When the cell reached its final status.",
        "benchmark_id": "The cell's stored result (benchmarks.id); empty when it produced none.",
        "decode_tokens_per_second": (
            "Per-request mean decode rate, tokens/s: the mean over requests of each stream's decode rate "
            "(benchmarks.avg_tokens_per_second). Seed 001's tokens_per_second, renamed by schema version 1."
        ),
        "total_requests": "Measured requests of the benchmark (warm-up excluded).",
        "error_count": "Measured requests that failed.",
        "failure_reason": (
            "Why the cell did not succeed, in a word: the error's class name (e.g. NoEligibleOffer, InstanceLost), "
            "interrupted (its controller stopped it), abandoned (cleanup found its holder's process gone; the next "
            "controller of its run takes it over) or skipped."
        ),
        "failure_stage": f"Stage at which the cell failed or was skipped: {_STAGES}.",
        "error_message": "The failure's message, one paragraph for a person.",
        "notes": "Free-text notes, e.g. an earlier attempt's session never seen released before a resume.",
        "cell_id": "The cell's id in the matrix (also its pytest test id).",
        "matrix_file": "The matrix file the cell came from.",
        "offer_id": "The inventory offer the session was rented from (e.g. vastai-12345).",
        "price_per_hour": "Price of the rented GPU, USD per hour.",
        "cost_usd": (
            "What the cell cost, USD: price_per_hour x the time it held a session, earlier failed-over attempts "
            "included; with session reuse, its share of the shared session."
        ),
        "api_cost_usd": "What GPU Shopper's GET /costs reported, USD (billed by the clock hour, so it may be 0).",
        "session_status": "The session's last status as the API reported it (running, stopped, failed, not_found).",
        "session_started_at": "When the session was created: cost_usd counts from here.",
        "consumer_id": (
            "consumer_id sent to GPU Shopper: gpubench-<run>-<cell>-aN, so the API alone finds a run's sessions."
        ),
        "worker": "pytest-xdist worker that ran the cell (main without xdist).",
        "lease_expires_at": (
            "Until when the worker's claim on the cell holds unless renewed by its heartbeat (seconds since "
            "the epoch); past it, another controller may take the cell over."
        ),
        "ttft_p50_ms": "Median time to first token, milliseconds.",
        "cost_per_million_tokens": (
            "USD per million output tokens: price_per_hour / (output throughput in tokens/s x 3600) x 1e6."
        ),
        "progress_file": "Path of the cell's seed-format progress log (STATUS/PROGRESS/ERROR lines).",
        "host_key_fingerprint": "SHA256 fingerprint of the instance's SSH host key, pinned at the first connection.",
        "attempts": "Offers tried (failover); one row each in the attempts table.",
        "released_by": "Who released the session when the cell itself could not (teardown, gpubench cleanup, ...).",
        "session_released_at": "When the session was released.",
        "reuse_group": "Session reuse: the group (GPU type x provider) whose shared session the cell ran on.",
        "session_turn": "Session reuse: the cell's turn on the shared session (1: it rented the session).",
        "session_owner": "Session reuse: the cell id of the cell that rented the session (its attempts carry the "
                         "bill).",
        "stage_seconds": "JSON object {stage: seconds}: the cell's wall time in each stage it went through "
                         "(inventory ... benchmark, results, cleanup), from the start of the cell to its outcome; "
                         "``claim``: the part of it spent claiming the cell and renewing its claim's lease.",
        "imported_from": (
            "gpubench import: the file the result came from, its place in the file and its format "
            "(e.g. results.json[2] (GPU Shopper BenchmarkResult)); empty for measured cells."
        ),
        "output_tokens_per_second": (
            "Output throughput, tokens/s: the result's total output tokens / its measured duration "
            "(benchmarks.output_tokens_per_second)."
        ),
    },
)

_RESULTS = {
    "total_requests": "Measured requests (warm-up excluded), successful and failed.",
    "total_tokens": "Output tokens of the successful measured requests (the server's eval_count where reported).",
    "total_prompt_tokens": "Prompt tokens of the successful measured requests (Ollama's prompt_eval_count).",
    "total_errors": "Measured requests that failed.",
    "duration_seconds": "Length of the measured phase, seconds.",
    "avg_tokens_per_second": "Mean per-request client decode rate, tokens/s (one stream's speed, not the machine's).",
    "min_tokens_per_second": "Slowest request's client decode rate, tokens/s.",
    "max_tokens_per_second": "Fastest request's client decode rate, tokens/s.",
    "p50_tokens_per_second": "Median per-request client decode rate, tokens/s.",
    "p95_tokens_per_second": "95th percentile of the per-request client decode rate, tokens/s.",
    "p99_tokens_per_second": "99th percentile of the per-request client decode rate, tokens/s.",
    "avg_latency_ms": "Mean end-to-end request latency (send to final chunk), milliseconds.",
    "min_latency_ms": "Shortest end-to-end request latency, milliseconds.",
    "max_latency_ms": "Longest end-to-end request latency, milliseconds.",
    "p50_latency_ms": "Median end-to-end request latency, milliseconds.",
    "p95_latency_ms": "95th percentile end-to-end request latency, milliseconds.",
    "p99_latency_ms": "99th percentile end-to-end request latency, milliseconds.",
    "requests_per_minute": "Successful requests per minute of the measured phase.",
    "avg_tokens_per_request": "Mean output tokens per successful request.",
    "error_rate": "Failed / measured requests, a fraction 0-1.",
    "avg_ttft_ms": "Mean time to first token, milliseconds.",
    "p50_ttft_ms": "Median time to first token, milliseconds.",
    "p95_ttft_ms": "95th percentile time to first token, milliseconds.",
    "match_rate": "Quality check: matching / checked answers, a fraction 0-1 (0 when no prompt expects an answer).",
    "prompts_with_expected": "Quality check: successful requests whose prompt expects an answer.",
    "prompts_matching": "Quality check: those whose answer matched.",
}

_UPLOAD = {
    "upload_status": (
        "Upload to GPU Shopper's /api/v1/benchmarks: pending, uploaded or failed; empty when none was asked for."
    ),
    "upload_error": "Why the last upload failed.",
    "remote_id": "The id GPU Shopper gave the uploaded result.",
    "uploaded_at": "When the result was uploaded.",
}

BENCHMARKS = TableDoc(
    title="Results",
    description=(
        "One row per stored result, in GPU Shopper's BenchmarkResult shape: the flattened PerformanceResults "
        "figures, the full result JSON, the figures beyond it (details_json) and its upload bookkeeping. "
        "Percentiles interpolate linearly; figures cover measured requests only (warm-up dropped)."
    ),
    sort_desc="output_tokens_per_second",
    facets=("gpu_type", "provider", "model", "upload_status", "run_id"),
    columns={
        "id": "Result id (a UUID, or the result's own id).",
        "manifest_id": "The cell that produced it (benchmark_manifest.id).",
        "run_id": "The run that produced it.",
        "created_at": "When the result was stored.",
        "gpu_name": "GPU name as nvidia-smi reported it on the instance (e.g. NVIDIA GeForce RTX 4090).",
        "gpu_type": "GPU type of the cell, as the matrix names it.",
        "provider": "Cloud provider the result was measured on.",
        "location": "Where the instance was (the offer's location).",
        "model": "Model benchmarked.",
        "price_per_hour": "Price of the GPU, USD per hour.",
        "decode_tokens_per_second": "Per-request mean decode rate, tokens/s (= avg_tokens_per_second).",
        "output_tokens_per_second": (
            "Output throughput, tokens/s: total_tokens / duration_seconds, the machine's rate at this load."
        ),
        **_RESULTS,
        "cost_per_million_tokens": (
            "USD per million output tokens: price_per_hour / (output throughput in tokens/s x 3600) x 1e6."
        ),
        "result_json": "The whole BenchmarkResult as JSON (what an upload POSTs).",
        "details_json": (
            "JSON of what the BenchmarkResult has no field for: detailed metrics, validity flags, cold start, "
            "repeated-run statistics, load-generator health, comparison, both cost analyses."
        ),
        **_UPLOAD,
        "workload_fingerprint": (
            "Hash of what changes the figures: prompts, max_tokens, load, think, warm-up, runtime version, "
            "model digest (the fields are in details_json.fingerprint). --gpubench-compare compares only results "
            "with the same one."
        ),
    },
)

REQUESTS = TableDoc(
    title="Requests",
    description="One row per request the load generator sent, warm-up included (warmup = 1), as it recorded it.",
    facets=("warmup", "done_reason"),
    columns={
        "benchmark_id": "The result the request belongs to (benchmarks.id).",
        "manifest_id": "The cell (benchmark_manifest.id).",
        "index": "Position of the request in the run, from 0.",
        "warmup": "1 for a warm-up request (left out of every figure), else 0.",
        "prompt_index": "Which prompt of the workload was sent.",
        "started_at": "When the request was sent, unix seconds (the instance's clock: the load generator runs there).",
        "ttft_ms": "Time to first token, milliseconds.",
        "latency_ms": "End-to-end latency, send to final chunk, milliseconds.",
        "output_tokens": "Output tokens the client counted (non-empty chunks).",
        "eval_count": "Output tokens the server counted (Ollama's eval_count).",
        "eval_duration_ns": "Server decode time (Ollama's eval_duration), nanoseconds.",
        "prompt_tokens": "Prompt tokens the server counted (Ollama's prompt_eval_count).",
        "tokens_per_second": "Client decode rate of this request, tokens/s: (output_tokens - 1) / (latency - TTFT).",
        "error": "Why the request failed; empty when it succeeded.",
        "scheduled_at": "When the request was due, seconds after the run's start.",
        "send_lag_ms": "How late the request left the client (sent - scheduled), milliseconds.",
        "itl_mean_ms": "Mean gap between consecutive tokens (first token excluded), milliseconds.",
        "itl_max_ms": "Longest gap between consecutive tokens, milliseconds.",
        "tpot_ms": "Time per output token, (last token - first token) / (output_tokens - 1), milliseconds.",
        "server_tokens_per_second": "Server decode rate, eval_count / eval_duration, tokens/s.",
        "prompt_eval_duration_ns": "Server prompt-processing time (Ollama's prompt_eval_duration), nanoseconds.",
        "load_duration_ns": "Server model-load time for this request (Ollama's load_duration), nanoseconds.",
        "total_duration_ns": "Server total time (Ollama's total_duration), nanoseconds.",
        "done_reason": "Why generation stopped, as the server said (stop, length, ...).",
        "matched": "Quality check: 1 when the answer matched the prompt's expectation, 0 when not, empty when none.",
        "ttfat_ms": (
            "Time to first answer token, milliseconds: after a reasoning model's thinking; empty when the request "
            "ended before answering."
        ),
        "thinking_tokens": "Output tokens of reasoning (Ollama's thinking field), included in output_tokens.",
        "incomplete": (
            "1 when the request was still streaming at the end of the duration and was cut there (the sandbox's "
            "clock): its TTFT and decode rate count, its latency_ms runs to the cut; 0 otherwise."
        ),
        "conversation": "A conversation workload's conversation this request is a turn of (from 0); empty otherwise.",
        "turn": "Its turn in that conversation, from 1 (turn k carries turns 1..k-1 and the model's answers).",
        "sent_prompt_tokens": "The prompt's length as sent, by the tokenizer-free rule (1.3 tokens per word).",
        "cacheable_prompt_tokens": (
            "Of those, the tokens a prefix cache could serve: a conversation's history, a shared system prompt "
            "sent before, a prompt sent before (docs/metrics.md, prefix reuse)."
        ),
        "cached_prompt_tokens": (
            "Prompt tokens the server says its prefix cache served (usage.prompt_tokens_details.cached_tokens; "
            "Ollama: the sent length less prompt_eval_count); empty when it says nothing."
        ),
    },
)

GPU_SAMPLES = TableDoc(
    title="GPU samples",
    description="nvidia-smi readings taken on the instance during the benchmark, one row per GPU per sample.",
    sort="t",
    facets=("gpu",),
    columns={
        "benchmark_id": "The result (benchmarks.id); empty for samples stored before it.",
        "manifest_id": "The cell (benchmark_manifest.id).",
        "t": "When the sample was taken, unix seconds.",
        "gpu": "GPU index on the instance, from 0.",
        "utilization_pct": "GPU utilisation, percent.",
        "memory_used_mib": "GPU memory in use, MiB.",
        "temperature_c": "GPU temperature, degrees Celsius.",
        "power_draw_w": "GPU power draw, watts.",
    },
)

BENCHMARK_RUNS = TableDoc(
    title="Repeated runs",
    description="With runs: N in the matrix, one row per repeated measurement behind a result.",
    facets=("outlier",),
    columns={
        "benchmark_id": "The result the run belongs to (benchmarks.id).",
        "run_index": "Position of the run, from 0 (run 0 is the first, cold one, with the warm-up requests).",
        "decode_tokens_per_second": "The run's per-request mean decode rate, tokens/s.",
        "output_tokens_per_second": (
            "The run's output throughput, tokens/s (empty for runs stored before schema version 1)."
        ),
        "ttft_p50_ms": "The run's median time to first token, milliseconds.",
        "requests": "Measured requests of the run.",
        "duration_seconds": "Length of the run's measured phase, seconds.",
        "outlier": "1 when the run is an outlier (beyond Tukey's fences) left out of the cell's figures, else 0.",
    },
)

ATTEMPTS = TableDoc(
    title="Provisioning attempts",
    description=(
        "One row per offer a cell tried to rent (failover), with its session, the stage and error of a failure, "
        "its times and cost. A run's GPU spend is the sum of cost_usd here: with session reuse, the attempt of "
        "the cell that rented a shared session carries its whole bill."
    ),
    sort_desc="started_at",
    facets=("status", "stage", "provider", "gpu_type", "run_id"),
    columns={
        "manifest_id": "The cell (benchmark_manifest.id).",
        "attempt": "Attempt number of the cell, 1, 2, ... (the consumer_id's -aN suffix).",
        "run_id": "The run (runs.run_id).",
        "status": "provisioning, ready (handed to the cell) or failed.",
        "offer_id": "The offer tried (e.g. vastai-12345).",
        "provider": "Provider of the offer.",
        "gpu_type": "GPU type of the offer, as the API names it.",
        "location": "Location of the offer.",
        "machine_id": "The provider's machine id, to spot one bad machine across attempts.",
        "price_per_hour": "Price of the offer, USD per hour.",
        "consumer_id": "consumer_id sent with the session create.",
        "session_id": "Session created; empty when the create itself failed.",
        "stage": f"Stage at which a failed attempt failed: {_STAGES}.",
        "error": "Why the attempt failed.",
        "started_at": "When the attempt started (its budget reservation, before the create).",
        "session_started_at": "When the create answered: billing runs from here.",
        "ended_at": "When the session was released (or the attempt ended without one).",
        "expected_seconds": "Session lifetime the spend cap reserved for the attempt, seconds.",
        "cost_usd": "price_per_hour x (ended_at - session_started_at), USD.",
        "api_cost_usd": "What GPU Shopper's GET /costs reported for the session, USD (billed by the clock hour).",
        "session_status": "The session's last status as the API reported it.",
        "worker": "pytest-xdist worker that made the attempt (main without xdist).",
    },
)

SYSTEMS = TableDoc(
    title="Detected systems",
    description=(
        "What system detection found on each session's machine, once per session of a run (a reused session "
        "is detected by the first cell that connected): the GPUs the cell was given, driver, CUDA, clocks, "
        "power limit, CPU, memory, OS, kernel and disk, and the source that answered (docs/hardware.md)."
    ),
    sort_desc="recorded_at",
    facets=("source", "gpu_type", "provider", "run_id"),
    columns={
        "run_id": "The run (runs.run_id).",
        "session_id": "The GPU Shopper session whose machine this is.",
        "manifest_id": "The cell that detected it (benchmark_manifest.id).",
        "gpu_type": "GPU type of that cell, as the API names it.",
        "provider": "Provider of that cell.",
        "machine": "Which machine ran it: the offer's machine_id (a host's name for cloud: hosts), else its "
                   "provider_id; empty when unknown.",
        "source": "Which source answered: nvml (pynvml on the instance), nvidia-smi-xml (nvidia-smi -q -x) "
                  "or nvidia-smi-csv (the --query-gpu CSV).",
        "gpu_name": "The first GPU's product name as the driver reports it.",
        "gpu_count": "GPUs the cell was given on the machine.",
        "recorded_at": "When it was recorded.",
        "system_json": "Everything detected, JSON (SystemInfo: gpus with clocks in MHz and power limit in W, "
                       "host with ram_mib and disk bytes).",
    },
)

MICROBENCH_FIGURES = TableDoc(
    title="GPU microbenchmark figures",
    description=("What a microbenchmark cell (matrix `microbench:`) measured with torch on the instance, one row "
                 "per figure; docs/hardware.md and docs/metrics.md define them."),
    sort="label",
    facets=("gpu_type", "kind", "precision", "run_id"),
    columns={
        "manifest_id": "The cell (benchmark_manifest.id).",
        "run_id": "The run (runs.run_id).",
        "created_at": "When the figures were stored.",
        "gpu_type": "GPU type of the cell, as the matrix names it.",
        "provider": "Provider of the cell.",
        "label": "The figure: memory_bandwidth, or matmul_<precision> (matmul_fp16, ...).",
        "kind": "memory_bandwidth or matmul.",
        "precision": "The matmul's precision: fp32, tf32, fp16, bf16, fp8 or int8; empty for memory bandwidth.",
        "unit": "GB/s (memory), TFLOPS (matmul) or TOPS (INT8 matmul).",
        "value": "Mean of the timed runs (the figure the report shows); empty when skipped.",
        "std": "Sample standard deviation of the timed runs.",
        "cv": "Coefficient of variation of the timed runs (std / mean).",
        "n": "Timed runs (after the untimed warm-up runs).",
        "ci_low": "Lower bound of the 95% bootstrap confidence interval of the mean.",
        "ci_high": "Upper bound of the 95% bootstrap confidence interval of the mean.",
        "values_json": "Every timed run's value, in run order (JSON list).",
        "skipped": "Why the figure was not measured (compute capability, or what torch said).",
        "device": "The GPU as torch names it.",
        "capability": "The GPU's CUDA compute capability (8.9, ...).",
        "torch_version": "The torch that measured it.",
    },
)

GPU_LEASES = TableDoc(
    title="GPU leases",
    description=(
        "One row per GPU a cell leased on a machine the run does not own (cloud: hosts or local, "
        "docs/providers.md): no two leases hold one GPU at once. A lease is renewed while its cell runs and "
        "ends when released, or at expires_at if its run died."
    ),
    sort_desc="acquired_at",
    facets=("machine", "run_id"),
    columns={
        "lease_id": "The lease: its GPUs' rows share it.",
        "machine": "The machine: a host's address:port, or local:<hostname>.",
        "gpu_index": "The GPU, as nvidia-smi numbers it on the machine.",
        "holder": "Who holds it: <run>/<consumer_id> (the run and the cell).",
        "run_id": "The run (runs.run_id).",
        "acquired_at": "When it was claimed, seconds since the epoch.",
        "expires_at": "When it runs out unless renewed, seconds since the epoch (renewed every third of its life).",
        "released_at": "When it was released, seconds since the epoch; empty while held (or if its run died).",
    },
)

#: Every manifest table, in the order a reader meets them.
TABLES: dict[str, TableDoc] = {
    "benchmark_manifest": BENCHMARK_MANIFEST,
    "benchmarks": BENCHMARKS,
    "runs": RUNS,
    "attempts": ATTEMPTS,
    "gpu_leases": GPU_LEASES,
    "requests": REQUESTS,
    "gpu_samples": GPU_SAMPLES,
    "benchmark_runs": BENCHMARK_RUNS,
    "systems": SYSTEMS,
    "microbench_figures": MICROBENCH_FIGURES,
}


def schema_of(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """The tables of the database at ``conn`` and their columns, SQLite's own tables left out."""
    names = [row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    # table_xinfo also lists generated columns; a quoted name keeps odd table names safe.
    return {name: [row[1] for row in conn.execute(f'PRAGMA table_xinfo("{name.replace(chr(34), chr(34) * 2)}")')]
            for name in names}


def undocumented(conn: sqlite3.Connection) -> list[str]:
    """Tables (``table``) and columns (``table.column``) at ``conn`` that have no description here."""
    missing = []
    for table, columns in schema_of(conn).items():
        doc = TABLES.get(table)
        if doc is None:
            missing.append(table)
            continue
        missing.extend(f"{table}.{column}" for column in columns if not doc.columns.get(column, "").strip())
    return missing
