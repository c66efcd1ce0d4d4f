"""The Ollama stand-in's batching and queueing model, on its real HTTP server.

Parallel requests share the GPU: each stream slows as the batch grows
(``r1 / (1 + (b - 1) / F)``), so their total saturates below ``b`` times one
stream; requests beyond ``OLLAMA_NUM_PARALLEL`` wait and their TTFT grows. The
server's own counters follow the model exactly; what a client measures on this
busy machine is checked against the model's prediction with loose bounds, and, where
every stream of a launcher decodes together, within 3% of each runtime's law.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml
from polling import wait_for
from standin_helpers import RATE, TTFT_MS, Server, standin_env, write_instance

from pytest_gpubench.matrix.cells import SEED_PROMPTS
from pytest_gpubench.measure.benchmark import LOADGEN_SOURCE, BenchmarkPlan
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.sandbox.catalog import DEFAULT_CATALOG, load_catalog
from pytest_gpubench.sandbox.instance_spec import InstanceSpec
from pytest_gpubench.sandbox.instances import free_port, instance_document
from pytest_gpubench.sandbox.law import expected_point, expected_power_w
from pytest_gpubench.sandbox.nvidia_smi_standin import read_gpus
from pytest_gpubench.sandbox.ollama_common import plan_output
from pytest_gpubench.sandbox.ollama_engine import batch_slowdown

FACTOR = 2.0
PARALLEL = 4
PROMPT = "Explain the CAP theorem and its implications for distributed systems."


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    server = Server(write_instance(tmp_path_factory.mktemp("batched")), OLLAMA_NUM_PARALLEL=str(PARALLEL),
                    GPUBENCH_SANDBOX_BATCH_CEILING_FACTOR=str(FACTOR))
    server.pull("qwen2:7b")
    server.http.post("/api/generate", json={"model": "qwen2:7b", "prompt": "hi", "stream": False,
                                            "options": {"num_predict": 1}})  # loaded
    yield server
    server.stop()


def generate_together(server: Server, count: int, num_predict: int) -> list[tuple[float, list]]:
    """``count`` streamed requests sent at once, each (send time, chunks with arrival times)."""
    results: list = [None] * count
    barrier = threading.Barrier(count)

    def one(index: int) -> None:
        barrier.wait()
        results[index] = server.stream("/api/generate", {"model": "qwen2:7b", "prompt": PROMPT,
                                                         "options": {"num_predict": num_predict}})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(results), "a request did not finish"
    return results


def server_rate(chunks: list) -> float:
    final = chunks[-1][1]
    assert final["done"]
    return final["eval_count"] / (final["eval_duration"] / 1e9)


def test_slowdown_rules():
    assert batch_slowdown(1, FACTOR) == 1.0
    assert batch_slowdown(4, None) == batch_slowdown(4, 0) == 1.0  # no model: free parallelism
    assert batch_slowdown(4, FACTOR) == pytest.approx(2.5)
    # The aggregate rises with the batch and approaches FACTOR x one stream.
    totals = [b / batch_slowdown(b, FACTOR) for b in (1, 2, 4, 8, 64, 10_000)]
    assert totals == sorted(totals) and totals[-1] == pytest.approx(FACTOR, rel=1e-3)


def test_catalog_gives_every_instance_model_its_ceiling(tmp_path):
    catalog = load_catalog()
    offer = catalog.offer("vastai-18430201")
    models = instance_document(catalog, offer, "s-1", 0.01, tmp_path)["models"]
    assert models["qwen2:7b"]["batch_ceiling_factor"] == pytest.approx(catalog.batching.ceiling_factor, rel=1e-3)
    assert catalog.batch_ceiling("RTX 4090", "vastai", "qwen2:7b") == pytest.approx(2 * 195.3, abs=0.1)


def test_catalog_rows_and_gpus_override_the_default(tmp_path):
    raw = yaml.safe_load(DEFAULT_CATALOG.read_text())
    raw["gpus"]["A100 80GB"]["batch_ceiling_factor"] = 6.0
    raw["rates"].append({"gpu": "RTX 3090", "model": "qwen2:1.5b", "provider": "vastai", "tokens_per_second": 235.7,
                         "ttft_ms": 18, "batch_ceiling_tokens_per_second": 900.0})
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw))
    catalog = load_catalog(path)
    assert catalog.batch_ceiling("RTX 3090", "vastai", "qwen2:1.5b") == 900.0
    assert catalog.batch_ceiling("A100 80GB", "vastai", "qwen2:7b") == pytest.approx(6 * 199.9, abs=0.1)


def test_parallel_streams_slow_down_and_the_total_saturates(batched):
    (_, alone), = generate_together(batched, 1, 100)
    assert server_rate(alone) == pytest.approx(RATE, rel=1e-3)  # one stream: the catalog's rate

    together = generate_together(batched, PARALLEL, 100)
    rates = [server_rate(chunks) for _, chunks in together]
    expected = RATE / batch_slowdown(PARALLEL, FACTOR)  # 80 tokens/s each
    # The server's own counters: each stream runs at the batch's rate but for the
    # few tokens before the others joined or after they left (when the busy machine
    # let each request in), so the median, and every one far below the rate alone.
    assert statistics.median(rates) == pytest.approx(expected, rel=0.1)
    assert all(rate < 0.7 * RATE for rate in rates)
    assert sum(rates) < 2.2 * RATE  # far from the 4x of free parallelism

    # What a client sees: all tokens over the wall time, against the prediction
    # (a stall of this machine only lengthens the wall time: loose below).
    tokens = sum(chunks[-1][1]["eval_count"] for _, chunks in together)
    wall = max(chunks[-1][0] for _, chunks in together) - min(sent for sent, _ in together)
    predicted = PARALLEL * 100 / (batch_slowdown(PARALLEL, FACTOR) * (TTFT_MS / 1000 + 100 / RATE))
    assert 0.6 * predicted < tokens / wall < 1.15 * predicted
    assert tokens / wall < 2.2 * RATE


def test_requests_beyond_num_parallel_queue_and_their_ttft_grows(tmp_path):
    server = Server(write_instance(tmp_path), OLLAMA_NUM_PARALLEL="2", GPUBENCH_SANDBOX_BATCH_CEILING_FACTOR="2")
    try:
        server.pull("qwen2:7b")
        server.http.post("/api/generate", json={"model": "qwen2:7b", "prompt": "hi", "stream": False,
                                                "options": {"num_predict": 1}})
        results = generate_together(server, 4, 60)
    finally:
        server.stop()
    # Two run at once (60 tokens at 1.5x the 5 ms step: 0.45 s); two wait for a slot.
    # Judged on the arrival times themselves, not on the threads' send times, which a
    # busy machine can stagger: a queued request's first token comes only after one of
    # the first two has finished.
    by_first_token = sorted(results, key=lambda result: result[1][0][0])
    running, queued = by_first_token[:2], by_first_token[2:]
    slot_freed = min(chunks[-1][0] for _, chunks in running)
    assert all(chunks[0][0] >= slot_freed for _, chunks in queued)
    # So a queued request's TTFT holds that wait (the barrier sends all four within
    # milliseconds; a generation here is 0.45 s).
    ttft = [chunks[0][0] - sent for sent, chunks in by_first_token]
    assert min(ttft[2:]) > max(ttft[:2]), ttft


def run_loadgen(url: str, directory, concurrency: int) -> tuple[list[RequestRecord], float]:
    """The load generator as the plugin runs it (``python -`` with the script on stdin):
    its measured records and the run's duration."""
    plan = BenchmarkPlan(model="qwen2:7b", duration=3.0, max_tokens=48, prompts=SEED_PROMPTS, warmup_requests=0,
                         progress_interval=1.0, checkpoint_every=10, concurrency=concurrency,
                         checkpoint_path=str(directory / "checkpoint.json"))
    done = subprocess.run([sys.executable, "-", json.dumps(plan.config(url))], input=LOADGEN_SOURCE, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    records = [RequestRecord.model_validate(e) for e in events if e["event"] == "request"]
    assert records and all(r.ok for r in records), events[-1]
    return [r for r in records if not r.warmup], events[-1]["duration_seconds"]


def per_request_rates(records) -> list[float]:
    return [(r.output_tokens - 1) / ((r.latency_ms - r.ttft_ms) / 1000) for r in records
            if r.ok and r.output_tokens > 1 and r.latency_ms > r.ttft_ms]


def test_load_generator_measures_what_the_model_predicts(batched, tmp_path):
    one, one_s = run_loadgen(batched.url, tmp_path / "c1", 1)
    four, four_s = run_loadgen(batched.url, tmp_path / "c4", PARALLEL)
    slowdown = batch_slowdown(PARALLEL, FACTOR)
    # Per stream: the median request's decode rate (a stall of this shared machine
    # flushes one request's tokens in a burst; the median does not care).
    assert statistics.median(per_request_rates(one)) == pytest.approx(RATE, rel=0.1)
    assert statistics.median(per_request_rates(four)) == pytest.approx(RATE / slowdown, rel=0.15)
    # TTFT: a request joining three others prefills in shared steps.
    ttft_one = statistics.median(r.ttft_ms for r in one)
    ttft_four = statistics.median(r.ttft_ms for r in four)
    assert ttft_four > 1.6 * ttft_one
    # The total: 4 streams give 4 / 2.5 = 1.6x one stream's output throughput, not 4x.
    total_one = sum(r.output_tokens for r in one) / one_s
    total_four = sum(r.output_tokens for r in four) / four_s
    assert total_four / total_one == pytest.approx(PARALLEL / slowdown, rel=0.25)
    assert total_four < 2.5 * total_one


# -- the law per runtime, against a launcher stand-in (sandbox/law.py) ----------------------------

LAW_TOKENS = 400  # every answer runs into this cap: 2-2.6 s of decoding per level
LAW_OFFER = "vastai-18430201"  # an RTX 4090 on Vast.ai


def capped_prompts(count: int, model: str, seed: str) -> list[str]:
    """Prompts the stand-in answers with exactly ``LAW_TOKENS`` tokens, sharing no prefix (a prefix
    cache has nothing to shorten)."""
    prompts = []
    for index in range(2000):
        prompt = f"{hashlib.sha256(f'{seed}/{index}'.encode()).hexdigest()[:12]} describe a lighthouse keeper's day"
        if len(plan_output(prompt, LAW_TOKENS, model=model).tokens) == LAW_TOKENS:
            prompts.append(prompt)
            if len(prompts) == count:
                return prompts
    raise AssertionError("too few prompts run into the cap")


async def stream_together(url: str, prompts: list[str], on_all_started) -> list[tuple[float, list[float]]]:
    """Each prompt streamed at once over ``/v1/completions``: (send time, each token's arrival time)."""
    started: set[int] = set()

    async def one(client: httpx.AsyncClient, index: int, prompt: str) -> tuple[float, list[float]]:
        arrivals: list[float] = []
        sent = time.perf_counter()
        body = {"model": "qwen2:7b", "prompt": prompt, "max_tokens": LAW_TOKENS, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                choices = json.loads(line[6:])["choices"] if line.startswith("data: {") else []
                if choices and choices[0].get("finish_reason") is None:  # a token, not the closing chunk
                    arrivals.append(time.perf_counter())
                    if index not in started:
                        started.add(index)
                        if len(started) == len(prompts):
                            on_all_started()
        return sent, arrivals

    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(one(client, i, p) for i, p in enumerate(prompts)))


def test_a_launcher_measures_its_runtimes_law_and_power_follows_the_batch(tmp_path):
    """vLLM's stand-in at 1 and 4 streams: per-stream rate and aggregate within 3% of the law for
    vLLM (not Ollama's), measured while all streams run; nvidia-smi's power rises with the batch."""
    catalog = load_catalog()
    offer = catalog.offer(LAW_OFFER)
    document = instance_document(catalog, offer, "law-1", 0.01, tmp_path / "state")
    instance = tmp_path / "instance.json"
    instance.write_text(json.dumps(document))
    spec = InstanceSpec.model_validate(document)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "pytest_gpubench.sandbox.openai_launchers", "vllm", "serve",
                               "qwen2:7b", "--port", str(port), "--max-num-seqs", "4"],
                              env=standin_env(instance, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert server.poll() is None, server.stderr.read()
            try:
                return httpx.get(f"{url}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False
        wait_for(ready, 60, "the vLLM stand-in to serve")
        measured, power = {}, {}
        for concurrency in (1, 4):
            readings: list = []

            def sample(readings: list = readings) -> None:  # the state is written 20 ms after a change
                asyncio.get_running_loop().call_later(0.3, lambda: readings.append(read_gpus(spec)[0]))

            prompts = capped_prompts(concurrency, "qwen2:7b", f"c{concurrency}")
            streams = asyncio.run(stream_together(url, prompts, sample))
            assert all(len(arrivals) == LAW_TOKENS for _, arrivals in streams), [len(a) for _, a in streams]
            # The window in which every stream decodes: after the last first token, before the first
            # last token. The stand-in's schedule is absolute, so only the window's ends carry lag.
            start = max(arrivals[0] for _, arrivals in streams)
            end = min(arrivals[-1] for _, arrivals in streams)
            assert end - start > 1.5, "the streams did not overlap: this machine delayed a request"
            inside = [[t for t in arrivals if start <= t <= end] for _, arrivals in streams]
            per_stream = statistics.mean((len(ts) - 1) / (ts[-1] - ts[0]) for ts in inside)
            aggregate = sum(len(ts) for ts in inside) / (end - start)
            ttft_ms = statistics.median((arrivals[0] - sent) * 1000 for sent, arrivals in streams)
            measured[concurrency] = (aggregate, per_stream, ttft_ms)
            power[concurrency] = readings[0].power_draw_w
        for concurrency, (aggregate, per_stream, ttft_ms) in measured.items():
            law = expected_point(offer.gpu_type, "qwen2:7b", "vllm", concurrency, provider=offer.provider,
                                 catalog=catalog)
            assert per_stream == pytest.approx(law.per_stream_tps, rel=0.03), (concurrency, measured)
            assert aggregate == pytest.approx(law.output_tps, rel=0.03), (concurrency, measured)
            # A prefill is stretched by the batch it starts in: the first of the streams to arrive
            # starts alone, the last with the whole batch, so their median lies between the two.
            alone = expected_point(offer.gpu_type, "qwen2:7b", "vllm", 1, provider=offer.provider, catalog=catalog)
            assert alone.ttft_ms * 0.97 < ttft_ms < law.ttft_ms + 250, (concurrency, measured)
        ollama = expected_point(offer.gpu_type, "qwen2:7b", "ollama", 4, provider=offer.provider, catalog=catalog)
        assert measured[4][1] > 1.5 * ollama.per_stream_tps  # vLLM's factor, not Ollama's
        # Power: the draw the law gives for the batch (the card warms within the run: heat 0..1).
        limit = spec.gpu.power_limit_w
        for batch in (1, 4):
            assert expected_power_w(limit, batch, heat=0) - 3 < power[batch] < expected_power_w(limit, batch) + 3
        assert power[4] > power[1] + 0.15 * limit
    finally:
        server.terminate()
        server.wait(10)
