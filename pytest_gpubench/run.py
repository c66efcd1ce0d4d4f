"""The per-process run context: settings, manifest and the API, created on first use.

Nothing here is created at import or configure time, so a project that merely
has the plugin installed gets no manifest file and no network traffic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .aio import run as run_async
from .errors import ApiUnreachable
from .manifest import Manifest
from .matrix import Cell
from .processes import ProcessIdentity
from .providers.shopper import ShopperProvider
from .remote.ssh import HostKeyPins
from .settings import MIN_SANDBOX_INTERVAL, Settings
from .shopper import ShopperClient


@dataclass
class RunContext:
    """What every cell of this process shares."""

    settings: Settings
    worker: str = "main"
    argv: list[str] = field(default_factory=list)
    #: SSH host keys pinned at each session's first connection (refuses a changed one).
    host_keys: HostKeyPins = field(default_factory=HostKeyPins, repr=False)
    #: The process that owns the run (the xdist controller): cleanup checks it is alive.
    owner: ProcessIdentity = field(default_factory=ProcessIdentity.current)
    _manifest: Manifest | None = None
    _provider: ShopperProvider | None = None
    _unreachable: ApiUnreachable | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def manifest(self) -> Manifest:
        with self._lock:
            if self._manifest is None:
                self._manifest = Manifest(self.settings.manifest)
                self._manifest.start_run(self.run_id, argv=self.argv, matrix_files=[], owner=self.owner,
                                         api=self.settings.api, sandbox=self.settings.sandbox)
            return self._manifest

    @property
    def provider(self) -> ShopperProvider:
        """The GPU Shopper provider, checked to answer once per process."""
        with self._lock:
            if self._unreachable is not None:
                raise self._unreachable
            if self._provider is None:
                client = ShopperClient(self.settings.api, token=self.settings.api_token)
                try:
                    run_async(client.wait_ready(), timeout=60)
                except ApiUnreachable as exc:
                    self._unreachable = exc
                    run_async(client.aclose(), timeout=5)
                    raise
                self._provider = ShopperProvider(client, self.settings)
            return self._provider

    def effective_cell(self, cell: Cell) -> Cell:
        """``cell`` with this run's command-line overrides applied."""
        return apply_overrides(cell, self.settings)

    def close(self) -> None:
        if self._provider is not None:
            try:
                run_async(self._provider.client.aclose(), timeout=5)
            except Exception:  # noqa: BLE001 - closing must not fail the run
                pass


def apply_overrides(cell: Cell, settings: Settings) -> Cell:
    """Apply ``--gpubench-duration`` and friends on top of what the matrix says."""
    workload: dict[str, object] = {}
    if settings.duration is not None:
        workload["duration"] = settings.duration
    if settings.progress_interval is not None:
        workload["progress_interval"] = settings.progress_interval
    if settings.telemetry_interval is not None:
        workload["telemetry_interval"] = settings.telemetry_interval
    if settings.stall_timeout is not None:
        workload["stall_timeout"] = settings.stall_timeout
    if settings.benchmark_scale != 1.0:
        # The run's own sandbox: the benchmark runs on the sandbox's clock, as its
        # setup does (the stall timeout is scaled where it is used). No warm-up
        # requests: the runtime's one-token warm-up has loaded the model, and an
        # emulated GPU has nothing else to warm, while a full-length warm-up at a slow
        # model's real rate (256 tokens at 3.6 tokens/s: 71 s) would outlast the run.
        current = cell.workload.model_copy(update=workload)
        workload.update(
            duration=settings.benchmark_seconds(current.duration),
            progress_interval=settings.benchmark_seconds(current.progress_interval, MIN_SANDBOX_INTERVAL),
            telemetry_interval=settings.benchmark_seconds(current.telemetry_interval, MIN_SANDBOX_INTERVAL),
            warmup_requests=0,
        )
    update: dict[str, object] = {}
    if workload:
        update["workload"] = cell.workload.model_copy(update=workload)
    if settings.max_price is not None:
        cap = settings.max_price if cell.offer.max_price is None else min(settings.max_price, cell.offer.max_price)
        update["offer"] = cell.offer.model_copy(update={"max_price": cap})
    if settings.ollama_install:
        update["ollama_install"] = settings.ollama_install
    if settings.reuse is not None:
        update["reuse"] = settings.reuse
    return cell.model_copy(update=update) if update else cell
