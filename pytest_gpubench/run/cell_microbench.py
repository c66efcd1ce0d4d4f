"""A microbenchmark cell on its connected session: stages ``runtime_setup`` (torch) and ``benchmark``.

The cell went offer -> session -> ``gpu_ssh`` like any other; :class:`Microbench` then
makes torch importable there (``measure/microbench.ensure_torch``: the instance's, or a
venv it installs), runs the microbenchmark script (``measure/microbench.run_microbench``)
with ``nvidia-smi`` sampled beside it (``remote/telemetry.sample_gpus``, the cell's
``telemetry_interval``), and hands its figures (``measure/microbench.py``) and the samples
of its GPU to the cell's recorder, which stores them with the cell's outcome. No pytest
here: the ``gpubench_microbench`` fixture wires it up.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..aio import run as run_async
from ..cloud.ssh_wait import stage_timeout
from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..measure.microbench import MicrobenchRun, figures_from_events
from ..measure.microbench import ensure_torch, run_microbench
from ..remote.ssh import Connection
from ..remote.telemetry import GpuSample, sample_gpus
from ..runtimes.base import GpuPlacement
from .cell_benchmark import BRIDGE_SLACK, GpuSession, watched
from .record import CellRecorder
from .run_context import RunContext

#: Seconds the script may take per timed or warm-up run of each figure, beyond the stage's budget.
_SECONDS_PER_RUN = 5.0
#: Seconds a run that ended before nvidia-smi's first reading waits for it.
FIRST_SAMPLE_WAIT = 5.0


class Microbench:
    """Runs a microbenchmark cell's figures on its session; ``run()`` returns them."""

    def __init__(self, run: RunContext, cell: Cell, recorder: CellRecorder, session: GpuSession,
                 conn: Connection) -> None:
        if cell.microbench is None:
            raise ValueError(f"{cell.cell_id} is not a microbenchmark cell")
        self._run, self.cell, self.recorder, self.session, self.conn = run, cell, recorder, session, conn
        self.spec = cell.microbench

    def plan(self) -> dict:
        """What the script is asked to measure (its command-line JSON)."""
        return self.spec.model_dump(mode="json")

    def run(self) -> MicrobenchRun:
        """Torch, then the figures; a cell where no figure could be measured fails at ``benchmark``."""
        settings, recorder = self._run.settings, self.recorder
        recorder.enter(Stage.RUNTIME_SETUP)
        timeout = stage_timeout(settings, Stage.RUNTIME_SETUP, self.session.image)
        torch = run_async(watched(self._run, self.session, Stage.RUNTIME_SETUP,
                                  lambda _: ensure_torch(self.conn, timeout)), timeout + BRIDGE_SLACK)
        recorder.progress.status("TORCH_READY", python=torch.python, installed_now=torch.installed)

        recorder.enter(Stage.BENCHMARK)
        runs = (self.spec.runs + self.spec.warmup) * (len(self.spec.precisions) + 1)
        timeout = settings.stage_timeout(Stage.BENCHMARK, _SECONDS_PER_RUN * runs)
        # The leased GPU on a shared machine (hosts, local): the script measures its cuda:0.
        placement = GpuPlacement.of(1, self.session.ssh.gpu_indices)
        events = run_async(watched(self._run, self.session, Stage.BENCHMARK,
                                   lambda _: self._sampled(run_microbench(self.conn, torch.python, self.plan(),
                                                                          timeout,
                                                                          env_prefix=placement.shell_prefix()),
                                                           placement)),
                           timeout + BRIDGE_SLACK)
        measured = figures_from_events(events)
        recorder.progress.status("MEASURED_ON", device=measured.device,
                                 visible_devices=measured.visible_devices or "all")
        recorder.microbench = measured  # stored with the cell's outcome, whatever comes next
        for figure in measured.figures:
            percent = figure.percent_of_peak(self.cell.gpu)
            recorder.progress.progress(stage="benchmark", figure=figure.label,
                                       **({"skipped": figure.skipped} if figure.skipped else {
                                           "value": round(figure.value, 2), "unit": figure.unit,
                                           "cv": round(figure.stats.cv or 0.0, 4),
                                           **({"pct_of_peak": round(percent, 1)} if percent is not None else {})}))
        if not any(figure.value is not None for figure in measured.figures):
            reasons = "; ".join(f"{f.label}: {f.skipped}" for f in measured.figures) or "the script measured nothing"
            raise StageError(Stage.BENCHMARK, f"no microbenchmark figure could be measured ({reasons})")
        return measured

    async def _sampled(self, work: Any, placement: GpuPlacement) -> Any:
        """Await ``work`` with nvidia-smi sampling the machine beside it; the samples of the cell's GPU
        go to the recorder (stored with the outcome, also when the work failed), as a model cell's do.

        A run that ends before nvidia-smi's first line (it starts in tens of milliseconds, torch in
        seconds, but a stand-in's may be slower than the work) waits for that line, at most
        :data:`FIRST_SAMPLE_WAIT` seconds: every cell that measured has at least one reading of its GPU.
        """
        stop, first = asyncio.Event(), asyncio.Event()
        sampler = asyncio.ensure_future(sample_gpus(self.conn, self.cell.workload.telemetry_interval, stop,
                                                    on_sample=lambda _: first.set()))
        try:
            result = await work
            if not first.is_set():
                waiting = asyncio.ensure_future(first.wait())
                await asyncio.wait({waiting, sampler}, timeout=FIRST_SAMPLE_WAIT,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
            return result
        finally:
            stop.set()
            samples: list[GpuSample] = await sampler
            self.recorder.samples = [sample for sample in samples if placement.owns(sample.gpu)]
