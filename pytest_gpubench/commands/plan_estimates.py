"""How long each stage of a cell is expected to take, for ``gpubench plan``.

Two sources, the first that has something to say wins:

* **History**: the manifest's finished cells (``success``, ``partial``, ``failed``)
  of earlier runs on the same kind of cloud (sandbox runs for a sandbox plan, real
  ones otherwise). Their progress files (the manifest's ``progress_file`` column)
  time every stage to the second, from one ``STATUS`` line to the next:

  ============== =========================================
  stage          from -> to
  ============== =========================================
  provision      ``INVENTORY_QUERY`` -> first ``PROVISIONING`` (the create call)
  ssh_wait       first ``PROVISIONING`` -> ``SSH_READY`` (boot; failed attempts included)
  ssh_connect    ``SSH_READY`` -> ``SYSTEM_INFO``
  runtime_setup  ``SYSTEM_INFO`` -> ``OLLAMA_INSTALLED`` (cells that rented their session)
  model_pull     ``OLLAMA_INSTALLED`` -> ``MODEL_READY`` (pull and warm-up load)
  ============== =========================================

  A stage's estimate is the median of its samples, from the most specific cells
  that have any: for setup stages the same provider and GPU, then the same
  provider; for the pull the same model on the same provider, then the same model.
  The manifest's other times do not split a cell into stages (``attempts`` only
  knows the create and the release, ``benchmark_manifest`` the cell's start and end).
* **Defaults** (:data:`DEFAULT_STAGE_SECONDS`, on a real cloud; a sandbox plan
  multiplies them by its time scale, as the sandbox does its delays): seed 000's
  example run where it times a stage, and the model's size for the pull.

The benchmark itself is the workload's duration times its runs plus the warm-up
requests (``max_tokens`` at the tokens/s earlier runs measured for that GPU and
model, or seed 000's figure); it is never time-scaled, in the sandbox neither.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Stage
from ..matrix.cells import Cell, model_ref, normalize_gpu, normalize_provider
from ..store.progress import ProgressLine, read_progress
from ..cloud.reuse_split import DEFAULT_STAGE_SECONDS, PULL_SECONDS_PER_GB

#: The pull (and warm-up load) of a model takes ``PULL_SECONDS_PER_GB`` per GB of the
#: model's VRAM need: the figure session reuse orders groups by
#: (:mod:`pytest_gpubench.run.session_pool`); seed 000 pulled and loaded llama3:70b
#: (48 GB) in 4 minutes (``OLLAMA_INSTALLED`` 10:03 -> ``MODEL_READY`` 10:07), 5 s/GB.
DEFAULT_PULL_SECONDS_PER_GB = PULL_SECONDS_PER_GB
#: Tokens/s assumed for warm-up requests without history: seed 000's llama3:70b
#: figure (41.6), slow on purpose, so small models' warm-ups are not underestimated.
DEFAULT_TOKENS_PER_SECOND = 41.6
#: The stages a session pays once, in order; the pull is per cell.
SETUP_STAGES: tuple[Stage, ...] = (Stage.PROVISION, Stage.SSH_WAIT, Stage.SSH_CONNECT, Stage.RUNTIME_SETUP)
#: Progress-file labels that bound each stage (from, to).
STAGE_BOUNDS: Mapping[Stage, tuple[str, str]] = {
    Stage.PROVISION: ("INVENTORY_QUERY", "PROVISIONING"),
    Stage.SSH_WAIT: ("PROVISIONING", "SSH_READY"),
    Stage.SSH_CONNECT: ("SSH_READY", "SYSTEM_INFO"),
    Stage.RUNTIME_SETUP: ("SYSTEM_INFO", "OLLAMA_INSTALLED"),
    Stage.MODEL_PULL: ("OLLAMA_INSTALLED", "MODEL_READY"),
}
_FINISHED = ("success", "partial", "failed")


@dataclass(frozen=True)
class Estimate:
    """Seconds, and where the figure comes from (``history: ...`` or ``default``)."""

    seconds: float
    source: str


def stage_seconds(lines: Iterable[ProgressLine]) -> dict[Stage, float]:
    """Each stage's seconds in one cell's progress file (only stages it passed).

    A cell that ran on a session an earlier cell rented (``SESSION_REUSED``) only
    tells the pull: its connect and Ollama check are not a session's setup.
    """
    first: dict[str, float] = {}
    for line in lines:
        if line.kind == "STATUS" and line.label and line.label not in first:
            first[line.label] = line.timestamp.timestamp()
    reused = "SESSION_REUSED" in first
    found: dict[Stage, float] = {}
    for stage, (start, end) in STAGE_BOUNDS.items():
        if reused and stage is not Stage.MODEL_PULL:
            continue
        if start in first and end in first and first[end] >= first[start]:
            found[stage] = first[end] - first[start]
    return found


@dataclass
class _Sample:
    provider: str
    gpu: str
    model: str
    stages: dict[Stage, float]
    tokens_per_second: float | None


@dataclass
class StageHistory:
    """Stage times of earlier cells, and the estimates drawn from them (or the defaults)."""

    samples: list[_Sample] = field(default_factory=list)
    #: Multiplies the defaults: the sandbox's time scale for a sandbox plan, else 1.
    time_scale: float = 1.0
    #: What the history was read from, for the plan's footnote.
    description: str = "no manifest history"

    @classmethod
    def from_manifest(cls, path: Path | str, *, sandbox: bool, time_scale: float = 1.0) -> StageHistory:
        """Read the finished cells of ``path`` (left alone, and not created, when missing)."""
        history = cls(time_scale=time_scale)
        from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest
        from ..store.opening import open_store, redact, store_exists

        if not store_exists(path):
            history.description = f"no manifest at {redact(path)}"
            return history
        try:
            # A plan only reads: a file that is no manifest, or an older one, is left as it is.
            store = open_store(path, busy_timeout=5, retry_seconds=10, read_only=True)
        except (NotAManifest, MigrationNeeded, ManifestTooNew) as exc:
            history.description = f"no manifest history: {exc}"
            return history
        with store:
            runs = [store.run(run_id) for run_id in store.run_ids()]
            sandboxed = {run.run_id for run in runs if run is not None and run.sandbox}
            cells = [cell for cell in store.cells() if cell.status in _FINISHED
                     and (cell.run_id in sandboxed) == sandbox]
        for cell in cells:
            progress = _progress_file(cell.progress_file, path)
            if progress is None:
                continue
            try:
                stages = stage_seconds(read_progress(progress))
            except OSError:
                continue
            if stages or cell.decode_tokens_per_second:
                history.samples.append(_Sample(normalize_provider(cell.provider), normalize_gpu(cell.gpu_type),
                                               model_ref(cell.model).lower(), stages,
                                               cell.decode_tokens_per_second or None))
        kind = "sandbox" if sandbox else "real-cloud"
        history.description = f"{len(history.samples)} finished {kind} cell(s) in {path}"
        return history

    # ------------------------------------------------------------------ estimates

    def setup(self, stage: Stage, cell: Cell) -> Estimate:
        """A setup stage (paid once per session) of ``cell``'s session."""
        provider, gpu = normalize_provider(cell.provider), normalize_gpu(cell.gpu)
        found = self._median(stage, [
            (f"{cell.gpu} on {cell.provider}", lambda s: s.provider == provider and s.gpu == gpu),
            (f"{cell.provider}", lambda s: s.provider == provider),
        ])
        return found or Estimate(DEFAULT_STAGE_SECONDS[stage] * self.time_scale, "default")

    def pull(self, cell: Cell) -> Estimate:
        """Pulling and loading ``cell``'s model on a session that does not have it yet."""
        provider, model = normalize_provider(cell.provider), cell.model_ref.lower()
        found = self._median(Stage.MODEL_PULL, [
            (f"{cell.model} on {cell.provider}", lambda s: s.model == model and s.provider == provider),
            (f"{cell.model}", lambda s: s.model == model),
        ])
        seconds = DEFAULT_PULL_SECONDS_PER_GB * cell.vram_gb * self.time_scale
        return found or Estimate(seconds, f"default ({cell.vram_gb} GB x {DEFAULT_PULL_SECONDS_PER_GB:g} s/GB)")

    def tokens_per_second(self, cell: Cell) -> Estimate:
        """Tokens/s of one request of ``cell``'s model on its GPU (``seconds`` holds the rate)."""
        gpu, model = normalize_gpu(cell.gpu), cell.model_ref.lower()
        rates = [s.tokens_per_second for s in self.samples
                 if s.gpu == gpu and s.model == model and s.tokens_per_second]
        if rates:
            return Estimate(statistics.median(rates), f"history: {len(rates)} result(s) of {cell.model} on {cell.gpu}")
        return Estimate(DEFAULT_TOKENS_PER_SECOND, "default (seed 000)")

    def _median(self, stage: Stage, scopes: list[tuple[str, Any]]) -> Estimate | None:
        for label, wanted in scopes:
            values = [s.stages[stage] for s in self.samples if stage in s.stages and wanted(s)]
            if values:
                return Estimate(statistics.median(values), f"history: median of {len(values)} cell(s), {label}")
        return None


def _progress_file(recorded: str | None, manifest: Path | str) -> Path | None:
    """The progress file a row names: as recorded (absolute, or relative to here), or
    relative to the directory above the manifest's (``reports/manifest.db`` and
    ``reports/progress/...`` are both relative to where pytest ran)."""
    if not recorded:
        return None
    from ..store.opening import store_kind

    path = Path(recorded)
    # A server store (postgresql://) is in no directory: only the path as recorded.
    beside = [Path(manifest).resolve().parent.parent / path] if store_kind(manifest) == "sqlite" else []
    for candidate in (path, *beside):
        if candidate.is_file():
            return candidate
    return None
