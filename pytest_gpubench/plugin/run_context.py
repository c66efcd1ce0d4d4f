"""The per-process run context: settings, manifest and the API, created on first use.

Nothing here is created at import or configure time, so a project that merely
has the plugin installed gets no manifest file and no network traffic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..aio import run as run_async
from ..matrix.overrides import apply_overrides
from ..errors import ApiUnreachable
from ..store.base import Store
from ..store.manifest import Manifest
from ..store.sqlite_store import SqliteStore
from ..matrix.cells import Cell
from ..cloud.processes import ProcessIdentity
from ..cloud.shopper_provider import ShopperProvider
from ..remote.ssh import HostKeyPins
from ..settings import Settings
from ..cloud.shopper_client import ShopperClient


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
    def store(self) -> Store:
        """The run's store (the manifest, typed), started like :attr:`manifest`."""
        return SqliteStore(self.manifest)

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
