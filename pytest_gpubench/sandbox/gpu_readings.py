"""The emulated GPU's live readings, derived from what the Ollama stand-in is doing.

``nvidia-smi`` has no GPU to ask, so it asks the Ollama stand-in's runtime state:

- memory used = a baseline (driver context) + each loaded model's VRAM, split
  evenly over the cards that hold it (the server's ``CUDA_VISIBLE_DEVICES``, a
  tensor-parallel group; every card when the state does not say);
- utilization, power and clocks are high while a generation runs and drop to idle
  values when none does;
- temperature and fan follow load with a lag (exponential, ``THERMAL_TAU_S``), so a
  sampled benchmark sees warm-up and cool-down rather than a step.

Values wobble a little with time, deterministically, so samples are not all equal.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from .instance_spec import BASELINE_MIB, MIB, InstanceSpec
from .standin_state import RuntimeState, StateStore

IDLE_TEMP_C = 34.0
HOT_TEMP_C = 74.0
THERMAL_TAU_S = 20.0
RUNNER_PROCESS = "/usr/local/lib/ollama/runners/cuda_v12_avx/ollama_llama_server"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int


@dataclass(frozen=True)
class GpuReading:
    """One card, now."""

    index: int
    name: str
    uuid: str
    bus_id: str
    memory_total_mib: int
    memory_used_mib: int
    temperature_c: int
    power_draw_w: float
    power_limit_w: float
    utilization_gpu: int
    utilization_memory: int
    fan_percent: int
    pstate: str
    sm_clock_mhz: int
    mem_clock_mhz: int
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    @property
    def memory_free_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_used_mib)


def gpu_uuid(spec: InstanceSpec, index: int) -> str:
    """A stable UUID per session and card, in nvidia-smi's ``GPU-...`` form."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpubench-sandbox/{spec.session_id}/{index}"))


def bus_id(index: int) -> str:
    return f"00000000:{index + 1:02X}:00.0"


def _heat(state: RuntimeState, now: float) -> float:
    """0 (cold) .. 1 (steady under load), lagging load changes."""
    if state.active_requests > 0 and state.busy_since is not None:
        return 1 - math.exp(-(now - state.busy_since) / THERMAL_TAU_S)
    if state.busy_since is not None and state.idle_since is not None and state.idle_since >= state.busy_since:
        peak = 1 - math.exp(-(state.idle_since - state.busy_since) / THERMAL_TAU_S)
        return peak * math.exp(-(now - state.idle_since) / THERMAL_TAU_S)
    return 0.0


def _wobble(now: float, index: int, amplitude: float) -> float:
    return amplitude * math.sin(now * 1.7 + index * 2.1)


def _model_mib_per_card(state: RuntimeState, count: int) -> list[int]:
    """MiB of loaded models on each card: each model's VRAM split evenly over its GPUs."""
    share = [0] * count
    for model in state.loaded:
        cards = [i for i in model.gpus if 0 <= i < count] if model.gpus else list(range(count))
        for index in cards:
            share[index] += math.ceil(model.size_vram / MIB / len(cards))
    return share


def read_gpus(spec: InstanceSpec, now: float | None = None) -> list[GpuReading]:
    """Readings for every card of the instance."""
    now = time.time() if now is None else now
    state = StateStore(spec.state_dir).read_runtime()
    gpu = spec.gpu
    count = gpu.count
    share = _model_mib_per_card(state, count)
    heat = _heat(state, now)
    readings = []
    for index in range(count):
        limit = gpu.power_limit_w
        model_mib = share[index]
        # A card no model is on stays idle while the server works on the others.
        busy = state.active_requests > 0 and (model_mib > 0 or not any(share))
        if busy:
            load = min(1.0, 0.8 + 0.05 * state.active_requests)
            util = round(min(99.0, 90 * load + _wobble(now, index, 3)))
            mem_util = round(40 * load + _wobble(now, index, 4))
            power = limit * (0.55 + 0.2 * load * (0.5 + 0.5 * heat)) + _wobble(now, index, 4)
            # Under load the card runs near its highest clocks.
            pstate, sm_clock, mem_clock = "P2", gpu.sm_clock_max_mhz or 2520, gpu.mem_clock_max_mhz or 10251
        else:
            util, mem_util = 0, 0
            power = limit * (0.045 + 0.02 * heat) + (6 if model_mib else 0) + _wobble(now, index, 0.5)
            pstate, sm_clock, mem_clock = ("P8", 210, 405)
        processes: tuple[GpuProcess, ...] = ()
        if model_mib and state.pid:
            processes = (GpuProcess(pid=state.pid, name=RUNNER_PROCESS, used_mib=model_mib),)
        readings.append(
            GpuReading(
                index=index,
                name=gpu.name,
                uuid=gpu_uuid(spec, index),
                bus_id=bus_id(index),
                memory_total_mib=gpu.memory_mib,
                memory_used_mib=min(gpu.memory_mib, BASELINE_MIB + model_mib),
                temperature_c=round(IDLE_TEMP_C + index + (HOT_TEMP_C - IDLE_TEMP_C) * heat + _wobble(now, index, 0.4)),
                power_draw_w=round(max(1.0, power), 2),
                power_limit_w=limit,
                utilization_gpu=max(0, util),
                utilization_memory=max(0, mem_util),
                fan_percent=round(30 + 45 * heat),
                pstate=pstate,
                sm_clock_mhz=sm_clock,
                mem_clock_mhz=mem_clock,
                processes=processes,
            )
        )
    return readings
