"""The emulated inference engine behind the Ollama stand-in: models, memory, timing.

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
  several requests generate at once (:func:`.ollama_schedule.batch_slowdown`:
  per-stream rate falls, aggregate throughput saturates at the model's ceiling).

Everything runs on one asyncio loop: no threads, one timer per token.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from .disk import DiskUsage, Downloads, default_models_dir, disk_usage
from .instance_spec import (BASELINE_MIB, BASELINE_RAM_MIB, MIB, InstanceSpec, ModelSpec, normalize_model_name,
                            visible_gpus)
from .ollama_common import DEFAULT_KEEP_ALIVE_S, FOREVER, human_bytes_binary, parse_keep_alive
from .ollama_schedule import FifoSlots, Generation, Job, LagStats, batch_slowdown
from .ollama_text import plan_output
from .standin_state import LoadedModel, PulledModel, PullFault, RuntimeState, StateStore, StreamFault

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
                plan = plan_output(job.prompt, job.num_predict, model=runner.name, think=job.think)
                ttft, intervals = self._timing(job, runner, len(plan.tokens))
                factor = self.settings.batch_ceiling_factor
                if factor is None:
                    factor = runner.spec.batch_ceiling_factor
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
