"""The per-process run context: settings, store and the providers, created on first use.

Nothing here is created at import or configure time, so a project that merely
has the plugin installed gets no store (manifest file) and no network traffic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..aio import run as run_async
from ..matrix.cells import apply_overrides
from ..errors import ApiUnreachable
from ..store.base import Store
from ..store.opening import open_store
from ..matrix.cells import DEFAULT_CLOUD, Cell
from ..cloud.offers import OfferMemory
from ..cloud.processes import ProcessIdentity
from ..cloud.provider import Provider
from ..cloud.registry import LEASING_MACHINES, RENTING_NOTHING, build_provider, recorded_settings
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
    _store: Store | None = None
    #: The providers this process rents through, by ``cloud:`` name, and those that did not answer.
    _providers: dict[str, Provider] = field(default_factory=dict, repr=False)
    _unreachable: dict[str, ApiUnreachable] = field(default_factory=dict, repr=False)
    #: The clouds this process rents through, with what the run records of each (``runs.clouds``).
    _clouds_used: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    _api_client: ShopperClient | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Reuse groups that had an eligible offer earlier in this run: worth a second look when none is listed.
    offers_seen: OfferMemory = field(default_factory=OfferMemory, repr=False)

    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def store(self) -> Store:
        """The run's store (``--gpubench-manifest``), opened and its run recorded on first use."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings.store_location)
                self._store.start_run(self.run_id, argv=self.argv, matrix_files=[], owner=self.owner,
                                      api=self.settings.api, sandbox=self.settings.sandbox,
                                      clouds=self._clouds_used)
            return self._store

    def provider_for(self, cloud: str = DEFAULT_CLOUD, *, record: bool = True) -> Provider:
        """The provider a matrix's ``cloud:`` names, checked to answer once per process.

        ``record``: the run rents through it (a cell, the run's start), so the run's store records
        the cloud (its kind and settings, no secret) for cleanup, when the store is opened (never
        just for this); False for a cleanup pass or an upload, which only use it."""
        with self._lock:
            if cloud in self._unreachable:
                raise self._unreachable[cloud]
            if cloud not in self._providers:
                provider = build_provider(cloud, self.settings, store=lambda: self.store)
                try:
                    run_async(provider.ready(), timeout=60)
                except ApiUnreachable as exc:
                    self._unreachable[cloud] = exc
                    run_async(provider.aclose(), timeout=5)
                    raise
                self._providers[cloud] = provider
            provider = self._providers[cloud]
            new = record and cloud not in self._clouds_used
            if new:
                self._clouds_used[cloud] = recorded_settings(cloud, self.settings)
            store = self._store
        if new and store is not None:  # else the store records it when it is opened
            store.start_run(self.run_id, argv=self.argv, matrix_files=[], owner=self.owner,
                            api=self.settings.api, sandbox=self.settings.sandbox,
                            clouds={cloud: self._clouds_used[cloud]})
        return provider

    def recorded_clouds(self) -> dict[str, dict[str, str]]:
        """The clouds this process rents through, each with what the run records of it; GPU
        Shopper's too (what a run without a recorded cloud rented through)."""
        with self._lock:
            used = dict(self._clouds_used)
        return {DEFAULT_CLOUD: recorded_settings(DEFAULT_CLOUD, self.settings), **used}

    def cleanup_clouds(self) -> list[str]:
        """The clouds a cleanup pass of this run releases through: those it rents sessions
        through (not a running endpoint, not a leased machine), then GPU Shopper, always."""
        renting = [cloud for cloud in self.recorded_clouds()
                   if cloud != DEFAULT_CLOUD and cloud not in RENTING_NOTHING | LEASING_MACHINES]
        return [*renting, DEFAULT_CLOUD]

    @property
    def api_client(self) -> ShopperClient:
        """The GPU Shopper API results are uploaded to (the ``shopper`` provider's client when it is one)."""
        provider = self.provider_for(DEFAULT_CLOUD, record=False)
        if isinstance(provider, ShopperProvider):
            return provider.client
        with self._lock:
            if self._api_client is None:
                self._api_client = ShopperClient(self.settings.api, token=self.settings.api_token)
            return self._api_client

    def effective_cell(self, cell: Cell) -> Cell:
        """``cell`` with this run's command-line overrides applied."""
        return apply_overrides(cell, self.settings)

    def close(self) -> None:
        closables: list[Provider | ShopperClient] = list(self._providers.values())
        if self._api_client is not None:
            closables.append(self._api_client)
        for closable in closables:
            try:
                run_async(closable.aclose(), timeout=5)
            except Exception:  # noqa: BLE001 - closing must not fail the run
                pass
