"""A microbenchmark cell on its connected session: stages ``ollama_install`` (torch) and ``benchmark``.

The cell went offer -> session -> ``gpu_ssh`` like any other; :class:`Microbench` then
makes torch importable there (``remote/microbench.ensure_torch``: the instance's, or a
venv it installs), runs the microbenchmark script (``remote/microbench.run_microbench``)
and hands its figures (``measure/microbench.py``) to the cell's recorder, which stores
them with the cell's outcome. No pytest here: the ``gpubench_microbench`` fixture wires it up.
"""

from __future__ import annotations

from ..aio import run as run_async
from ..cloud.ssh_wait import stage_timeout
from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..measure.microbench import MicrobenchRun, figures_from_events
from ..remote.microbench import ensure_torch, run_microbench
from ..remote.ssh import Connection
from ..runtimes.gpus import GpuPlacement
from .cell_benchmark import BRIDGE_SLACK, GpuSession, watched
from .record import CellRecorder
from .run_context import RunContext

#: Seconds the script may take per timed or warm-up run of each figure, beyond the stage's budget.
_SECONDS_PER_RUN = 5.0


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
        recorder.enter(Stage.OLLAMA_INSTALL)
        timeout = stage_timeout(settings, Stage.OLLAMA_INSTALL, self.session.image)
        torch = run_async(watched(self._run, self.session, Stage.OLLAMA_INSTALL,
                                  lambda _: ensure_torch(self.conn, timeout)), timeout + BRIDGE_SLACK)
        recorder.progress.status("TORCH_READY", python=torch.python, installed_now=torch.installed)

        recorder.enter(Stage.BENCHMARK)
        runs = (self.spec.runs + self.spec.warmup) * (len(self.spec.precisions) + 1)
        timeout = settings.stage_timeout(Stage.BENCHMARK, _SECONDS_PER_RUN * runs)
        # The leased GPU on a shared machine (hosts, local): the script measures its cuda:0.
        prefix = GpuPlacement.of(1, self.session.ssh.gpu_indices).shell_prefix()
        events = run_async(watched(self._run, self.session, Stage.BENCHMARK,
                                   lambda _: run_microbench(self.conn, torch.python, self.plan(), timeout,
                                                            env_prefix=prefix)),
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
