"""The emulated inference engine behind the Ollama stand-in: models, memory, timing, pulls.

It decides what the server's handlers only format:

- which models are pulled (kept in the state directory, so restarts keep them);
- loading: the first request for a model that is not loaded waits the model's
  scaled ``load_seconds`` and evicts any other loaded model once that one is idle;
  a model whose weights and context do not fit the GPU is refused;
- scheduling: ``OLLAMA_NUM_PARALLEL`` requests per model generate at once, the rest
  wait first in, first out (up to ``OLLAMA_MAX_QUEUE``), so their TTFT grows;
- timing: the first token ``ttft`` after the request gets its slot, then one token
  per ``1 / tokens_per_second``, scheduled on absolute times so sleep overhead
  never accumulates into drift; both stretched by the batch's slowdown when
  several requests generate at once (:func:`batch_slowdown`:
  per-stream rate falls, aggregate throughput saturates at the model's ceiling).

Everything runs on one asyncio loop: no threads, one timer per token.

**Timing primitives** (fair slots, batching and token schedules).
A ``Generation`` delivers each token on an absolute schedule (first token ``ttft``
after the request could start: it arrived, its model was loaded and it had a
slot; then one per interval), so sleep overhead never accumulates into drift, and
it reports counters that match what was streamed.
``LagStats`` records how late tokens actually left, the stand-in's own health
figure. ``FifoSlots`` is the per-model parallelism limit, first in, first out.

Batching (:func:`batch_slowdown`): the generations a model runs at once share
each decode step. A step that serves ``b`` sequences takes ``t_w + b * t_s``
(the weights are read once per step, each sequence adds its own KV-cache reads
and sampling), so with ``r1`` the single-stream rate and ``C = 1 / t_s`` the
aggregate ceiling::

    r(b) = r1 / (1 + (b - 1) / F)        F = C / r1, the batch ceiling factor
    b * r(b) -> C as b grows

A token's interval is stretched by the factor for the batch size at the moment
it is scheduled, and a request's prefill (TTFT) by the factor when it starts:
its prompt is processed in steps shared with the others' decoding.

**``/api/pull``**: the progress stream of a model download.
The emulated registry is the instance file's model catalog. A download takes
``size / pull_mb_per_s`` seconds, shrunk by the time scale, and reports progress
the way Ollama does: ``pulling manifest``, then one ``pulling <digest12>`` status
per layer with ``digest``, ``total`` and a rising ``completed``, then
``verifying sha256 digest``, ``writing manifest`` and ``success``.

Every layer's bytes land on the instance's emulated disk as they arrive (see
:mod:`.df_standin`). Like Ollama, the pull does not check for room first: it stops when
the disk is full, with ``write <models>/blobs/sha256-<hex>-partial: no space left
on device``, and adds nothing to the model list; what it wrote stays on the disk
and the next pull of that model resumes from there. A ``pull_error`` fault armed by
the sandbox fails the pull as a registry dropping the download does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import re
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from .df_standin import DiskUsage, Downloads, default_models_dir, disk_usage, no_space_error
from .instance_spec import (
    BASELINE_MIB,
    BASELINE_RAM_MIB,
    MIB,
    InstanceSpec,
    ModelSpec,
    normalize_model_name,
    visible_gpus,
)
from .ollama_common import (
    DEFAULT_KEEP_ALIVE_S,
    FOREVER,
    TOKENS_PER_WORD,
    OutputPlan,
    Thought,
    human_bytes_binary,
    parse_keep_alive,
    plan_output,
)
from .standin_state import LoadedModel, PulledModel, PullFault, RuntimeState, StateStore, StreamFault

# ------------------------------------------------------------ timing primitives

WAKE_LEARNING_RATE = 0.05  # weight of the newest sleep in LagStats.wake_latency_s
STALL_POLL_SECONDS = 0.05  # how often a stalled stream looks whether its client left


def batch_slowdown(batch: int, ceiling_factor: float | None) -> float:
    """How much longer each step takes for one of ``batch`` sequences decoding
    together than for a sequence alone: ``1 + (batch - 1) / ceiling_factor``.

    ``ceiling_factor`` is the aggregate ceiling over the single-stream rate (the
    catalog's ``batch_ceiling``); None or 0: parallel sequences cost nothing.
    """
    if not ceiling_factor or batch <= 1:
        return 1.0
    return 1.0 + (batch - 1) / ceiling_factor


class FifoSlots:
    """A counting semaphore that serves waiters strictly in arrival order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self.waiters: deque[asyncio.Future[float]] = deque()

    @property
    def held(self) -> int:
        """Slots taken: the generations running now."""
        return self.size - self.free

    async def acquire(self) -> float | None:
        """Take a slot; returns the loop time it was handed over after a wait, or
        ``None`` when one was free at once."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return None
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot arrived just as we were cancelled
            else:
                self.waiters.remove(future)
            raise

    def release(self) -> None:
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(future.get_loop().time())
                return
        self.free += 1


@dataclass(frozen=True)
class Job:
    """One generation request, as the engine needs it."""

    model: str
    prompt: str
    prompt_eval_count: int
    num_predict: int | None
    keep_alive: float
    arrived: float  # loop time when the request reached the handler
    think: bool = False  # the model reasons before it answers (see ollama_common.plan_output)
    context: str = ""  # what the model reads before ``prompt`` (Ollama's ``system``), for the prefix cache
    cached_tokens: int = 0  # prompt tokens the prefix cache served (:class:`PrefixCache`), set when it starts


@dataclass
class LagStats:
    """How late tokens left against their schedule: the stand-in's own health.

    It also learns how late this event loop wakes from a sleep (``wake_latency_s``,
    a moving average), so that :class:`Generation` can ask to be woken that much
    earlier and its tokens leave on time on average instead of always late.
    """

    tokens: int = 0
    late_over_5ms: int = 0
    max_lag_s: float = 0.0
    wake_latency_s: float = 0.0

    def record(self, lag: float) -> None:
        self.tokens += 1
        if lag > 0.005:
            self.late_over_5ms += 1
        if lag > self.max_lag_s:
            self.max_lag_s = lag

    def learn_wake(self, late: float) -> None:
        """Fold one sleep's lateness into the average; a stall (over 2 ms, another
        task's work rather than the wake-up itself) is capped so it cannot make
        later tokens leave early."""
        self.wake_latency_s += WAKE_LEARNING_RATE * (min(max(late, 0.0), 0.002) - self.wake_latency_s)

    def summary(self) -> str:
        return (
            f"{self.tokens} tokens streamed, {self.late_over_5ms} more than 5 ms late, "
            f"max lag {self.max_lag_s * 1e3:.1f} ms, typical wake-up {self.wake_latency_s * 1e3:.2f} ms"
        )


class Generation:
    """The tokens of one request, delivered on their scheduled times."""

    def __init__(
        self,
        job: Job,
        plan: OutputPlan,
        start: float,
        ttft: float,
        intervals: list[float],
        load: float,
        lag: LagStats | None = None,
        fault: StreamFault | None = None,
        slowdown: Callable[[], float] | None = None,
    ):
        self.lag = lag or LagStats()
        self.fault = fault
        self.job = job
        self.plan = plan
        self.start = start
        self.intervals = intervals  # each token's interval for a sequence decoding alone
        #: The batch's slowdown now (see :func:`batch_slowdown`), asked as each token
        #: is scheduled, so a stream slows when others join and speeds up when they leave.
        self.slowdown = slowdown or (lambda: 1.0)
        self.ttft = ttft * self.slowdown()
        self.used: list[float] = []  # the intervals actually scheduled
        self.load_duration = load
        self.emitted = 0

    async def tokens(self, client_gone: Callable[[], bool] | None = None) -> AsyncIterator[str]:
        """Yield each token at ``start + ttft + sum(previous intervals)``, then wait
        until the end-of-sequence step so that ``eval_duration`` is honest.

        A stream fault cuts in after its ``after_tokens``: ``empty`` ends the answer
        there; ``stall`` goes silent until ``client_gone()`` (then nothing more is
        sent) or its ``stall_seconds`` pass (then the rest follows, that much later).
        """
        loop = asyncio.get_running_loop()
        due = self.start + self.ttft
        fault = self.fault
        for index, (token, interval) in enumerate(zip(self.plan.tokens, self.intervals, strict=True)):
            if fault is not None and index == fault.after_tokens:
                if fault.kind == "empty":
                    break
                stalled = loop.time()
                while loop.time() - stalled < fault.stall_seconds:
                    if client_gone is not None and client_gone():
                        return
                    await asyncio.sleep(STALL_POLL_SECONDS)
                due += loop.time() - stalled
            wake = due - self.lag.wake_latency_s
            delay = wake - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                self.lag.learn_wake(loop.time() - wake)
            self.lag.record(loop.time() - due)
            self.emitted += 1
            yield token
            interval *= self.slowdown()
            self.used.append(interval)
            due += interval
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    @property
    def done_reason(self) -> str:
        return self.plan.done_reason

    def stats(self, now: float) -> dict[str, int]:
        """The final chunk's counters, in nanoseconds, matching what was streamed."""
        eval_duration = sum(self.used[: self.emitted])
        return {
            "total_duration": int((now - self.job.arrived) * 1e9),
            "load_duration": int(self.load_duration * 1e9),
            # Ollama counts only the tokens it evaluated: a prefix-cache hit is not among them.
            "prompt_eval_count": self.job.prompt_eval_count - self.job.cached_tokens,
            "prompt_eval_duration": int(self.ttft * 1e9),
            "eval_count": self.emitted,
            "eval_duration": int(eval_duration * 1e9),
        }


# ------------------------------------------------------------ the prefix cache

#: Words per cached block: a prompt is cached in whole blocks, as vLLM caches KV blocks of 16 tokens.
PREFIX_BLOCK_WORDS = 16
#: Blocks a model's cache keeps (least recently used go first): 65,536 words, about 85,000 tokens.
PREFIX_CACHE_BLOCKS = 4096
#: A fully cached prompt still costs this share of the TTFT (the last token's pass, scheduling).
PREFILL_FLOOR = 0.1


class PrefixCache:
    """The prompts a loaded model processed recently, by word prefix (docs/sandbox.md, "Prefix cache").

    Each prompt, and the answer the model planned for it, is kept as the chained hashes of its
    whole blocks of ``PREFIX_BLOCK_WORDS`` words (the text the model reads: a system prompt, then
    the prompt or the messages' contents), at most ``PREFIX_CACHE_BLOCKS`` blocks, least recently
    used dropped first. A new prompt's cached part is its longest run of leading blocks found,
    in tokens by the stand-in's rule (1.3 per word) and at most all but one of its tokens; its
    prefill then takes ``ttft * max(PREFILL_FLOOR, 1 - cached / prompt_tokens)``.
    """

    def __init__(self, capacity: int = PREFIX_CACHE_BLOCKS) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def chain(words: list[str]) -> list[bytes]:
        """The hash of each whole block together with every block before it."""
        hashes, digest = [], b""
        for start in range(0, len(words) - PREFIX_BLOCK_WORDS + 1, PREFIX_BLOCK_WORDS):
            digest = hashlib.sha256(digest + "\x00".join(words[start:start + PREFIX_BLOCK_WORDS]).encode()).digest()
            hashes.append(digest)
        return hashes

    def cached_words(self, words: list[str]) -> int:
        """How many leading words of ``words`` are cached (whole blocks), touching what it finds."""
        found = 0
        for digest in self.chain(words):
            if digest not in self.blocks:
                break
            self.blocks.move_to_end(digest)
            found += PREFIX_BLOCK_WORDS
        return found

    def store(self, words: list[str]) -> None:
        for digest in self.chain(words):
            self.blocks[digest] = None
            self.blocks.move_to_end(digest)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def prefill(self, job: Job, plan: OutputPlan, ttft: float) -> tuple[float, Job]:
        """The TTFT of ``job`` with its cached prefix, and the job with its ``cached_tokens``; the
        prompt and its planned answer are cached for the requests that follow (the next turn)."""
        words = f"{job.context} {job.prompt}".split()
        cached = min(round(self.cached_words(words) * TOKENS_PER_WORD), job.prompt_eval_count - 1)
        cached = max(0, cached)
        answer = "".join(token for token in plan.tokens if not isinstance(token, Thought))
        self.store(words + answer.split())
        if not cached:
            return ttft, job
        uncached = 1 - cached / job.prompt_eval_count
        return ttft * max(PREFILL_FLOOR, uncached), replace(job, cached_tokens=cached)


# ------------------------------------------------------------ the engine

log = logging.getLogger("ollama_standin")

# Context margin: KV cache for a 2048-token context per parallel slot (about
# 32 MiB per billion parameters with grouped-query attention) plus compute graph.
KV_MIB_PER_BILLION = 32
FLUSH_DELAY = 0.02  # seconds between a state change and writing the state file
MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"


class EngineError(Exception):
    """An error a request gets as ``{"error": message}`` with ``status``."""

    status = 500


class ModelNotFound(EngineError):
    status = 404


class ModelTooLarge(EngineError):
    status = 500


class ServerBusy(EngineError):
    status = 503


@dataclass(frozen=True)
class EngineSettings:
    """Knobs read from the environment when ``ollama serve`` starts."""

    num_parallel: int = 1
    max_queue: int = 512
    default_keep_alive: float = DEFAULT_KEEP_ALIVE_S
    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    #: Aggregate ceiling over the single-stream rate; None: the model's, 0: batching is free.
    batch_ceiling_factor: float | None = None
    jitter: float = 0.0
    #: Where pulled blobs go; only named in errors (the disk itself is emulated).
    models_dir: str = "/root/.ollama/models"
    #: Drop unfinished downloads at start, as Ollama does unless ``OLLAMA_NOPRUNE``.
    prune: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EngineSettings:
        """``OLLAMA_NUM_PARALLEL``, ``OLLAMA_MAX_QUEUE``, ``OLLAMA_KEEP_ALIVE`` and the
        sandbox's truth knobs ``GPUBENCH_SANDBOX_TTFT_MS``,
        ``GPUBENCH_SANDBOX_TOKENS_PER_SECOND``, ``GPUBENCH_SANDBOX_BATCH_CEILING_FACTOR``
        and ``GPUBENCH_SANDBOX_JITTER``; where
        models go (``OLLAMA_MODELS``, else ``$HOME/.ollama/models``) and ``OLLAMA_NOPRUNE``."""
        env = os.environ if env is None else env

        def number(name: str, kind: type = float) -> float | int | None:
            raw = env.get(name, "").strip()
            return kind(raw) if raw else None

        ceiling = number("GPUBENCH_SANDBOX_BATCH_CEILING_FACTOR")
        return cls(
            num_parallel=max(1, number("OLLAMA_NUM_PARALLEL", int) or 1),
            max_queue=max(1, number("OLLAMA_MAX_QUEUE", int) or 512),
            default_keep_alive=parse_keep_alive(env.get("OLLAMA_KEEP_ALIVE"), DEFAULT_KEEP_ALIVE_S),
            ttft_ms=number("GPUBENCH_SANDBOX_TTFT_MS"),
            tokens_per_second=number("GPUBENCH_SANDBOX_TOKENS_PER_SECOND"),
            batch_ceiling_factor=None if ceiling is None else max(0.0, ceiling),
            jitter=max(0.0, min(0.9, number("GPUBENCH_SANDBOX_JITTER") or 0.0)),
            models_dir=default_models_dir(env),
            prune=env.get("OLLAMA_NOPRUNE", "").strip().lower() in ("", "0", "f", "false"),
        )


@dataclass(eq=False)
class Runner:
    """A loaded model."""

    name: str
    spec: ModelSpec
    vram: int  # the part on the GPU
    size: int  # the whole model, weights, KV cache and graph; more than vram when offloaded
    slots: FifoSlots
    keep_alive: float
    loaded_at: float = 0.0  # loop time the load finished
    refs: int = 0
    evicting: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    expires_at: datetime | None = None
    expiry: asyncio.TimerHandle | None = None


class Engine:
    """Models, memory and scheduling of one emulated Ollama server."""

    #: The program this server is: whose batching law it follows (``ModelSpec.ceiling_factor``).
    program = "ollama"

    def __init__(self, spec: InstanceSpec, store: StateStore, settings: EngineSettings) -> None:
        self.spec = spec
        #: The GPUs this server sees (``CUDA_VISIBLE_DEVICES``; all without it).
        self.devices = visible_gpus(spec.gpu)
        self.store = store
        self.settings = settings
        self.pulled: dict[str, PulledModel] = store.read_pulled()
        self.downloads = Downloads(store)
        self.runners: dict[str, Runner] = {}
        self.load_lock = asyncio.Lock()
        self.active = 0
        self.waiting = 0
        self.busy_since: float | None = None
        self.idle_since: float | None = time.time()
        self._flush_pending = False
        self._requests = 0
        self.lag = LagStats()
        # Stream faults armed by the sandbox: re-read when their file changes.
        self._fault_stamp: tuple[int, int] | None = None
        self._stream_faults: list[StreamFault] = []
        self._fault_fired: dict[int, int] = {}
        # One prefix cache per loaded model: it goes with the runner when the model is unloaded.
        self._prefix_caches: weakref.WeakKeyDictionary[Runner, PrefixCache] = weakref.WeakKeyDictionary()

    def prefix_cache(self, runner: Runner) -> PrefixCache:
        """The prefix cache of a loaded model (made on its first request)."""
        cache = self._prefix_caches.get(runner)
        if cache is None:
            cache = self._prefix_caches[runner] = PrefixCache()
        return cache

    # -- the model store ------------------------------------------------------

    def find_pulled(self, name: str) -> tuple[PulledModel, ModelSpec] | None:
        """A pulled model and its catalog entry, or None."""
        pulled = self.pulled.get(normalize_model_name(name))
        found = self.spec.find_model(name)
        if pulled is None or found is None:
            return None
        return pulled, found[1]

    def record_pull(self, name: str, model: ModelSpec) -> PulledModel:
        pulled = PulledModel(
            name=name, size=model.size_bytes, digest=model.digest_hex, modified_at=datetime.now(timezone.utc)
        )
        self.pulled = {**self.pulled, name: pulled}
        self.store.write_pulled(self.pulled)
        return pulled

    def delete(self, name: str) -> bool:
        key = normalize_model_name(name)
        if key not in self.pulled:
            return False
        self.pulled = {k: v for k, v in self.pulled.items() if k != key}
        self.store.write_pulled(self.pulled)
        return True

    def disk_usage(self) -> DiskUsage:
        """The instance's disk with the pulled models and unfinished downloads on it."""
        return disk_usage(self.spec.disk, (m.size for m in self.pulled.values()), self.downloads.written)

    # -- memory -----------------------------------------------------------------

    def vram_bytes(self, model: ModelSpec) -> int:
        """What a loaded model occupies: weights, a KV cache per slot, a graph."""
        match = re.match(r"([\d.]+)\s*([BM])", model.parameter_size.upper())
        billions = float(match.group(1)) / (1000 if match and match.group(2) == "M" else 1) if match else 7.0
        kv = max(64, min(1024, KV_MIB_PER_BILLION * billions)) * MIB
        graph = max(256 * MIB, model.size_bytes // 20)
        return model.size_bytes + int(kv) * self.settings.num_parallel + graph

    def available_vram(self) -> int:
        """Memory of the GPUs this server sees, less each card's baseline."""
        return (self.spec.gpu.memory_mib - BASELINE_MIB) * MIB * len(self.devices)

    def model_gpus(self) -> tuple[int, ...]:
        """The GPUs a loaded model is spread over: Ollama splits layers over every GPU it sees."""
        return self.devices

    def available_ram(self) -> int:
        return int(self.spec.host.ram_gib * 1024 * MIB) - BASELINE_RAM_MIB * MIB

    # -- loading ---------------------------------------------------------------

    async def _acquire_runner(self, name: str, keep_alive: float) -> tuple[Runner, float]:
        """The loaded runner for ``name`` (loading it if needed), with a reference held."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        found = self.find_pulled(name)
        if found is None:
            quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
            raise ModelNotFound(f"model {quoted} not found, try pulling it first")
        pulled, model = found
        key = pulled.name
        runner = self.runners.get(key)
        if runner is None or runner.evicting:
            async with self.load_lock:
                runner = self.runners.get(key)
                if runner is None or runner.evicting:
                    runner = await self._load(key, model)
        runner.refs += 1
        runner.idle.clear()
        runner.keep_alive = keep_alive
        if runner.expiry is not None:
            runner.expiry.cancel()
            runner.expiry = None
        return runner, loop.time() - started

    async def _load(self, key: str, model: ModelSpec) -> Runner:
        # As Ollama does: what does not fit on the card is offloaded to system memory
        # (and decodes slowly, see _timing); only a model too big for both is refused.
        needed = self.vram_bytes(model)
        on_gpu = min(needed, max(0, self.available_vram()))
        in_ram, ram = needed - on_gpu, max(0, self.available_ram())
        if in_ram > ram:
            raise ModelTooLarge(
                f"model requires more system memory ({human_bytes_binary(in_ram)}) "
                f"than is available ({human_bytes_binary(ram)})"
            )
        for other in list(self.runners.values()):
            # One model at a time: wait for the other's requests to finish, then
            # unload it. Marked first so that new requests for it queue behind us.
            other.evicting = True
            if other.refs:
                await other.idle.wait()
            self._unload(other)
        if in_ram:
            log.info("offloading %.0f MiB of model %s to system memory", in_ram / MIB, key)
        log.info("loading model %s (%.0f MiB)", key, needed / MIB)
        await asyncio.sleep(self.spec.scaled(model.load_seconds))
        runner = Runner(
            name=key,
            spec=model,
            vram=on_gpu,
            size=needed,
            slots=FifoSlots(self.settings.num_parallel),
            keep_alive=self.settings.default_keep_alive,
            loaded_at=asyncio.get_running_loop().time(),
        )
        runner.idle.set()
        self.runners[key] = runner
        self._schedule_flush()
        return runner

    def _unload(self, runner: Runner) -> None:
        if self.runners.get(runner.name) is runner:
            del self.runners[runner.name]
            log.info("unloaded model %s", runner.name)
        if runner.expiry is not None:
            runner.expiry.cancel()
            runner.expiry = None
        self._schedule_flush()

    def unload(self, name: str) -> None:
        """Unload ``name`` once idle (``keep_alive: 0`` with no prompt)."""
        runner = self.runners.get(normalize_model_name(name))
        if runner is not None:
            if runner.refs:
                runner.keep_alive = 0
            else:
                self._unload(runner)

    def _release_runner(self, runner: Runner) -> None:
        runner.refs -= 1
        if runner.refs:
            return
        runner.idle.set()
        if runner.evicting or runner.keep_alive == 0:
            self._unload(runner)
            return
        if runner.keep_alive == FOREVER:
            runner.expires_at = None
        else:
            runner.expires_at = datetime.now(timezone.utc) + timedelta(seconds=runner.keep_alive)
            runner.expiry = asyncio.get_running_loop().call_later(runner.keep_alive, self._expire, runner)
        self._schedule_flush()

    def _expire(self, runner: Runner) -> None:
        runner.expiry = None
        if runner.refs == 0:
            self._unload(runner)

    async def load_only(self, name: str, keep_alive: float) -> float:
        """Load ``name`` without generating (an empty prompt); returns the load time."""
        runner, load = await self._acquire_runner(name, keep_alive)
        self._release_runner(runner)
        return load

    # -- generation ------------------------------------------------------------

    def _slowdown(self, runner: Runner) -> float:
        """How much longer each step takes with part of the model in system memory:
        the GPU's share at full speed plus the rest at ``offload_penalty`` of it."""
        if runner.vram >= runner.size:
            return 1.0
        offloaded = (runner.size - runner.vram) / runner.size
        return (1 - offloaded) + offloaded / self.spec.offload_penalty

    def _timing(self, job: Job, runner: Runner, count: int) -> tuple[float, list[float]]:
        model, slowdown = runner.spec, self._slowdown(runner)
        ttft = (self.settings.ttft_ms if self.settings.ttft_ms is not None else model.ttft_ms) / 1000 * slowdown
        rate = (self.settings.tokens_per_second or model.tokens_per_second) / slowdown
        jitter = self.settings.jitter
        if not jitter:
            return ttft, [1.0 / rate] * count
        self._requests += 1
        seed = hashlib.sha256(f"{job.prompt}\x00{self._requests}".encode()).digest()
        rng = random.Random(int.from_bytes(seed[:8], "big"))
        ttft *= 1 + jitter * rng.uniform(-1, 1)
        return ttft, [(1 + jitter * rng.uniform(-1, 1)) / rate for _ in range(count)]

    @asynccontextmanager
    async def generation(self, job: Job) -> AsyncIterator[Generation]:
        """Hold a model and a slot for ``job``; errors are raised before anything
        is yielded, so the handler can still answer with a plain HTTP error."""
        runner, load = await self._acquire_runner(job.model, job.keep_alive)
        try:
            if runner.slots.free == 0 and self.waiting >= self.settings.max_queue:
                raise ServerBusy(MAX_QUEUE_MESSAGE)
            self.waiting += 1
            try:
                granted = await runner.slots.acquire()
            finally:
                self.waiting -= 1
            try:
                self._set_active(+1)
                plan = plan_output(job.prompt, job.num_predict, model=runner.name, think=job.think,
                                   accuracy=runner.spec.accuracy)
                ttft, intervals = self._timing(job, runner, len(plan.tokens))
                ttft, job = self.prefix_cache(runner).prefill(job, plan, ttft)
                factor = self.settings.batch_ceiling_factor
                if factor is None:
                    factor = runner.spec.ceiling_factor(self.program)
                # The TTFT clock runs from the moment the request could start, not
                # from here: the handler's own work (parsing, planning) is inside
                # the TTFT a client sees from a real server too.
                start = max(job.arrived, runner.loaded_at, granted or 0.0)
                yield Generation(job, plan, start, ttft, intervals, load, self.lag, fault=self.next_stream_fault(),
                                 slowdown=lambda: batch_slowdown(runner.slots.held, factor))
            finally:
                runner.slots.release()
                self._set_active(-1)
        finally:
            self._release_runner(runner)

    def next_stream_fault(self) -> StreamFault | None:
        """The armed stream fault the generation starting now meets, counted as fired; or None.

        One ``stat`` per generation: the file is read again only when it changed.
        """
        try:
            info = os.stat(self.store.stream_faults_path)
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_ino)
        except OSError:
            stamp = None
        if stamp != self._fault_stamp:
            self._fault_stamp = stamp
            self._stream_faults = self.store.read_stream_faults() if stamp is not None else []
        for fault in self._stream_faults:
            fired = self._fault_fired.get(fault.id, 0)
            if fault.times is None or fired < fault.times:
                self._fault_fired[fault.id] = fired + 1
                log.info("stream fault %d (%s) on this generation", fault.id, fault.kind)
                return fault
        return None

    def next_pull_fault(self) -> PullFault | None:
        """The armed pull fault the pull starting now meets, or None. A firing is written back
        to the file (``times`` less one, gone at 0): unlike a stream fault's, it does not fire
        again in the next server process (a restart, a cell's own ``ollama serve``)."""
        faults = self.store.read_pull_faults()
        if not faults:
            return None
        fault, rest = faults[0], faults[1:]
        if fault.times is not None and fault.times > 1:
            rest = [fault.model_copy(update={"times": fault.times - 1}), *rest]
        elif fault.times is None:
            rest = faults
        if rest != faults:
            self.store.write_pull_faults(rest)
        log.info("pull fault %d on this pull", fault.id)
        return fault

    def _set_active(self, delta: int) -> None:
        before = self.active
        self.active += delta
        if before == 0 and self.active > 0:
            self.busy_since = time.time()
        elif before > 0 and self.active == 0:
            self.idle_since = time.time()
        self._schedule_flush()

    # -- shared state ---------------------------------------------------------

    def loaded_models(self) -> list[LoadedModel]:
        now = datetime.now(timezone.utc)
        models = []
        for runner in self.runners.values():
            expires = runner.expires_at
            if runner.refs:
                expires = None if runner.keep_alive == FOREVER else now + timedelta(seconds=runner.keep_alive)
            models.append(
                LoadedModel(
                    name=runner.name,
                    size=runner.size,
                    size_vram=runner.vram,
                    digest=runner.spec.digest_hex,
                    expires_at=expires,
                    gpus=self.model_gpus(),
                )
            )
        return models

    def _schedule_flush(self) -> None:
        # Many requests change state within a few milliseconds: write once, a little
        # later, so that the write never delays the request that comes right after
        # a response (the file's readers sample every few seconds).
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        """Write the runtime state for ``nvidia-smi`` and ``/api/ps`` readers."""
        self._flush_pending = False
        self.store.write_runtime(
            RuntimeState(
                pid=os.getpid(),
                loaded=self.loaded_models(),
                active_requests=self.active,
                busy_since=self.busy_since,
                idle_since=self.idle_since,
            )
        )


# Ollama's own wording when the registry has no such model or tag.
# ------------------------------------------------------------ /api/pull

MANIFEST_NOT_FOUND = "pull model manifest: file does not exist"
# Small layers that follow the weights: template, license, parameters.
_SMALL_LAYERS = (("template", 1_482), ("license", 11_344), ("params", 110))
# Progress at least this often, and at least this many updates per layer.
MAX_UPDATE_INTERVAL_S = 0.2
MIN_UPDATES = 8


class PullError(Exception):
    """A pull that failed; the message is what Ollama would say."""


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int

    @property
    def status(self) -> str:
        return f"pulling {self.digest.split(':', 1)[-1][:12]}"


def model_layers(model: ModelSpec) -> list[Layer]:
    """The blobs of a model: the weights first, then the small layers."""

    def digest(kind: str) -> str:
        return "sha256:" + hashlib.sha256(f"{model.digest}/{kind}".encode()).hexdigest()

    small = [Layer(digest(kind), size) for kind, size in _SMALL_LAYERS]
    weights = Layer(digest("model"), max(1, model.size_bytes - sum(layer.size for layer in small)))
    return [weights, *small]


def _write(engine: Engine, layer: Layer, completed: int) -> int:
    """Put ``layer`` on disk up to ``completed`` bytes; returns how far it got before the disk filled."""
    before = engine.downloads.get(layer.digest)
    reached = min(completed, before + engine.disk_usage().available)
    engine.downloads.set(layer.digest, reached)
    return max(before, reached)


async def pull_progress(engine: Engine, name: str) -> AsyncIterator[dict[str, Any]]:
    """Yield the progress objects of pulling ``name``; raise ``PullError`` on failure."""
    yield {"status": "pulling manifest"}
    found = engine.spec.find_model(name)
    if found is None:
        raise PullError(MANIFEST_NOT_FOUND)
    key, model = found
    already = engine.find_pulled(key) is not None
    # A registry that drops the download (the sandbox's pull_error): a model on disk
    # still has its manifest fetched, so it fails there; else the weights start first.
    fault = engine.next_pull_fault()
    if fault is not None and already:
        raise PullError(fault.message)
    loop = asyncio.get_running_loop()
    bytes_per_s = engine.spec.ollama.pull_mb_per_s * 1e6
    layers = model_layers(model)
    for layer in layers:
        base = {"status": layer.status, "digest": layer.digest, "total": layer.size}
        if already:
            yield {**base, "completed": layer.size}
            continue
        resumed = engine.downloads.get(layer.digest)
        duration = engine.spec.scaled((layer.size - resumed) / bytes_per_s)
        if fault is not None:
            yield base
            raise PullError(fault.message)
        if duration > 0:
            # Like Ollama, the first report of a layer has no "completed" yet.
            yield base
            interval = min(MAX_UPDATE_INTERVAL_S, duration / MIN_UPDATES)
            start = loop.time()
            end = start + duration
            due = start
            while True:
                due += interval
                await asyncio.sleep(max(0.0, min(due, end) - loop.time()))
                now = loop.time()
                if now >= end:
                    break
                wanted = resumed + int((layer.size - resumed) * (now - start) / duration)
                reached = _write(engine, layer, wanted)
                yield {**base, "completed": reached}
                if reached < wanted:
                    raise PullError(no_space_error(engine.settings.models_dir, layer.digest))
        if _write(engine, layer, layer.size) < layer.size:
            yield {**base, "completed": engine.downloads.get(layer.digest)}
            raise PullError(no_space_error(engine.settings.models_dir, layer.digest))
        yield {**base, "completed": layer.size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    engine.record_pull(normalize_model_name(key), model)
    # The blobs now count as the model's size.
    engine.downloads.drop(layer.digest for layer in layers)
    yield {"status": "success"}
