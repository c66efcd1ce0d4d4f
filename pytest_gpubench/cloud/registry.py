"""Which :class:`~.provider.Provider` a matrix rents through: its ``cloud:`` name.

A matrix file's top-level ``cloud:`` key (default ``shopper``) names the
implementation; the matrix's ``provider:`` stays what it always was, the
marketplace behind GPU Shopper (``vastai``, ``tensordock``). This is the one
place a provider is built: the run (``RunContext.provider_for``), ``gpubench
cleanup``, ``gpubench offers`` and ``gpubench plan`` come here. A new implementation adds a line to
:data:`PROVIDERS` and gets the contract suite (``tests/e2e/test_provider_contract.py``)
for free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..errors import MatrixError
from ..matrix.cells import DEFAULT_CLOUD, Cell
from ..matrix.fields import ENDPOINT_CLOUD
from ..matrix.fields import HOSTS_CLOUD, KEPT_MACHINES, LOCAL_CLOUD
from ..settings import Settings

if TYPE_CHECKING:
    from .gpu_lease import GpuLeaseBook
    from .provider import Provider

    #: Opens (or returns) the run's store (a ``Store``, which is a ``GpuLeaseBook``), when a
    #: provider first needs it.
    StoreOpener = Callable[[], GpuLeaseBook]


class ProviderFactory(Protocol):
    """Builds one implementation for a run's settings.

    ``fixed_offers``: the provider reads its offers once and answers every later
    :meth:`~.provider.Provider.choose_offer` from that reading (``gpubench plan``
    prices all its cells against one snapshot of the inventory). ``store``: opens the run's
    store, for providers that lease GPUs through it (``hosts``, ``local``); None where a
    command has none (they then list offers but cannot lease).
    """

    def __call__(self, settings: Settings, *, fixed_offers: bool = False,
                 store: StoreOpener | None = None) -> Provider: ...


def _shopper(settings: Settings, *, fixed_offers: bool = False, store: StoreOpener | None = None) -> Provider:
    # Imported when a provider is built, not when a matrix is collected: collection
    # stays free of httpx (a good citizen, DESIGN.md decision 11).
    from .shopper_provider import ShopperProvider

    return ShopperProvider.from_settings(settings, fixed_offers=fixed_offers)


def _endpoint(settings: Settings, *, fixed_offers: bool = False, store: StoreOpener | None = None) -> Provider:
    from .endpoint_provider import EndpointProvider

    return EndpointProvider()


def _hosts(settings: Settings, *, fixed_offers: bool = False, store: StoreOpener | None = None) -> Provider:
    from .hosts_provider import HostsProvider

    return HostsProvider(settings, store)


def _local(settings: Settings, *, fixed_offers: bool = False, store: StoreOpener | None = None) -> Provider:
    from .hosts_provider import LocalProvider

    return LocalProvider(settings, store)


#: ``cloud:`` name -> how to build that provider for a run's settings.
PROVIDERS: dict[str, ProviderFactory] = {
    DEFAULT_CLOUD: _shopper,
    ENDPOINT_CLOUD: _endpoint,
    HOSTS_CLOUD: _hosts,
    LOCAL_CLOUD: _local,
}
#: Providers that rent nothing (no inventory, no SSH): the contract suite's rental tests do not apply.
RENTING_NOTHING: frozenset[str] = frozenset({ENDPOINT_CLOUD})
#: Providers that lease GPUs of machines the run does not own (``hosts``, ``local``): no API to
#: rent from, so the rental tests do not apply either; their own part of the contract does.
LEASING_MACHINES: frozenset[str] = KEPT_MACHINES


def build_provider(cloud: str, settings: Settings, *, fixed_offers: bool = False,
                   store: StoreOpener | None = None) -> Provider:
    """The provider named ``cloud`` for ``settings``; a ``KeyError`` naming the known ones otherwise.

    ``fixed_offers``: choose every offer from one reading of the inventory (:class:`ProviderFactory`).
    """
    try:
        factory = PROVIDERS[cloud]
    except KeyError:
        raise KeyError(f"unknown cloud {cloud!r}; known clouds: {', '.join(PROVIDERS)}") from None
    return factory(settings, fixed_offers=fixed_offers, store=store)


def check_clouds(cells: list[Cell]) -> None:
    """Raise a :class:`MatrixError` (file, ``cloud``, the known names) for a cell whose
    ``cloud:`` names no registered provider."""
    for cell in cells:
        if cell.cloud not in PROVIDERS:
            raise MatrixError(cell.source, "cloud", f"unknown cloud {cell.cloud!r}; known clouds: "
                                                    f"{', '.join(PROVIDERS)} (`provider:` names the marketplace)")
