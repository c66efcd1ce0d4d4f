"""Which :class:`~.provider.Provider` a matrix rents through: its ``cloud:`` name.

A matrix file's top-level ``cloud:`` key (default ``shopper``) names the
implementation; the matrix's ``provider:`` stays what it always was, the
marketplace behind GPU Shopper (``vastai``, ``tensordock``). This is the one
place a provider is built: the run (``RunContext.provider_for``), ``gpubench
cleanup``, ``gpubench offers`` and ``gpubench plan`` come here.

The built-in clouds are :data:`PROVIDERS`. A third party adds one without forking, as an
entry point of the group :data:`ENTRY_POINT_GROUP` (``pytest_gpubench.providers``) whose name
is the ``cloud:`` name and whose object is a :class:`ProviderFactory` (a provider class whose
constructor takes those arguments will do); :mod:`.contract` is the suite it passes. The
installed entry points are read only when a name is not built in (:func:`installed`): a
``pytest --help`` with the plugin installed scans no package metadata.

What a run records of each cloud it rents through (:func:`recorded_settings`: its kind and
the settings that are not secret) lets cleanup build the same cloud later, and tell a run
rented elsewhere (``run/cleanup.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import MatrixError
from ..matrix.cells import DEFAULT_CLOUD, Cell
from ..matrix.fields import ENDPOINT_CLOUD
from ..matrix.fields import HOSTS_CLOUD, KEPT_MACHINES, LOCAL_CLOUD
from ..errors import redact
from ..settings import Settings

if TYPE_CHECKING:
    from .gpu_leasing import GpuLeaseBook
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


#: The entry point group a third-party provider registers under: name = its ``cloud:`` name,
#: object = its :class:`ProviderFactory`. It may also carry ``recorded_settings(settings) ->
#: dict[str, str]``: what a run records of it (never a secret; :func:`recorded_settings`).
ENTRY_POINT_GROUP = "pytest_gpubench.providers"


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


@functools.cache
def installed() -> dict[str, Any]:
    """The third-party clouds installed (entry points of :data:`ENTRY_POINT_GROUP`), by name, not
    yet loaded; a name a built-in cloud has is left out (the built-in one wins). Read once per
    process, and only when asked: never at the plugin's import."""
    from importlib.metadata import entry_points

    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP) if point.name not in PROVIDERS}


def known_clouds() -> list[str]:
    """Every ``cloud:`` name that builds a provider: the built-in ones, then the installed ones."""
    return [*PROVIDERS, *sorted(installed())]


def is_known(cloud: str) -> bool:
    """Whether ``cloud`` names a provider; the installed entry points are read only for a name
    that is not built in."""
    return cloud in PROVIDERS or cloud in installed()


def factory_for(cloud: str) -> ProviderFactory:
    """The factory of the provider named ``cloud`` (a built-in one, else an installed entry point,
    loaded now); a ``KeyError`` naming the known ones otherwise."""
    if cloud in PROVIDERS:
        return PROVIDERS[cloud]
    point = installed().get(cloud)
    if point is None:
        raise KeyError(f"unknown cloud {cloud!r}; known clouds: {', '.join(known_clouds())}")
    return point.load()


def build_provider(cloud: str, settings: Settings, *, fixed_offers: bool = False,
                   store: StoreOpener | None = None) -> Provider:
    """The provider named ``cloud`` for ``settings``; a ``KeyError`` naming the known ones otherwise.

    ``fixed_offers``: choose every offer from one reading of the inventory (:class:`ProviderFactory`).
    """
    return factory_for(cloud)(settings, fixed_offers=fixed_offers, store=store)


#: What a run records of a built-in cloud, from the settings that configure it: GPU Shopper's API
#: (its credentials redacted; the token is never recorded), the hosts inventory given on the
#: command line; a cloud not listed records nothing but its kind.
_RECORDED: dict[str, Callable[[Settings], dict[str, str]]] = {
    DEFAULT_CLOUD: lambda settings: {"api": redact(settings.api)},
    HOSTS_CLOUD: lambda settings: {"hosts": settings.hosts} if settings.hosts else {},
}


def recorded_settings(cloud: str, settings: Settings) -> dict[str, str]:
    """What a run records of ``cloud`` as ``settings`` configure it, besides its kind: the
    settings that tell one such cloud from another, never a secret (URLs redacted). A
    third-party cloud's are its factory's ``recorded_settings(settings)``, if it has one."""
    if cloud in PROVIDERS:
        found = _RECORDED.get(cloud, lambda _settings: {})(settings)
    else:
        recorder = getattr(factory_for(cloud), "recorded_settings", None)
        found = recorder(settings) if callable(recorder) else {}
    return {str(key): redact(str(value)) for key, value in found.items()}


def same_cloud(recorded: Mapping[str, str], configured: Mapping[str, str], *,
               same: Callable[[str | None, str | None], bool] | None = None) -> bool:
    """Whether a cloud a run recorded is the one configured now: each setting either records
    (``same`` compares two values; equality by default) agrees."""
    same = same or (lambda a, b: a == b)
    return all(same(recorded.get(key), configured.get(key)) for key in set(recorded) | set(configured))


def check_clouds(cells: list[Cell]) -> None:
    """Raise a :class:`MatrixError` (file, ``cloud``, the known names) for a cell whose
    ``cloud:`` names no provider, built in or installed."""
    for cell in cells:
        if not is_known(cell.cloud):
            raise MatrixError(cell.source, "cloud", f"unknown cloud {cell.cloud!r}; known clouds: "
                                                    f"{', '.join(known_clouds())} (`provider:` names the marketplace; "
                                                    f"a third-party cloud is an entry point of {ENTRY_POINT_GROUP})")
