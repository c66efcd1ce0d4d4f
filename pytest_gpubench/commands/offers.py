"""``gpubench offers``: what can be rented now, with prices, VRAM, confidence and location.

One ``GET /api/v1/inventory`` (after ``/health``) on GPU Shopper or, with
``--sandbox``, on a sandbox started in this process for the listing and stopped
after (nothing is written). ``--gpu`` and ``--provider`` match as pytest's filters
do (``RTX4090`` is ``RTX 4090``, ``Vast.ai`` is ``vastai``); when they match
nothing, the GPUs or providers on offer are named instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from contextlib import ExitStack

from pydantic import TypeAdapter

from ..errors import CommandProblem
from ..run.hints import close_names
from ..matrix.selection import filter_values, gpu_matches, normalize_provider, provider_matches
from ..cloud.registry import build_provider, is_known, known_clouds
from ..cloud.provider import Offer
from ..matrix.cells import DEFAULT_CLOUD
from ..settings import Settings

#: Seed 000's bar: an offer at or below it is not rented unless the matrix lowers it.
DEFAULT_BAR = 0.5
COLUMNS = ("GPU", "provider", "$/hour", "VRAM GB", "GPUs", "confidence", "location", "offer id")


async def fetch_offers(url: str, token: str | None = None, *, cloud: str = DEFAULT_CLOUD,
                       settings: Settings | None = None) -> list[Offer]:
    """Every offer the cloud lists now (GPU Shopper's API lists available ones only): the
    provider the registry builds for ``cloud``, GPU Shopper's at ``url`` with ``token``, another
    from ``settings`` (the user's configuration)."""
    own = Settings(api=url, api_token=token) if cloud == DEFAULT_CLOUD or settings is None else settings
    provider = build_provider(cloud, own)
    try:
        await provider.ready(attempts=3)
        return await provider.offers()
    finally:
        await provider.aclose()


def select(offers: Iterable[Offer], gpus: Sequence[str] = (), providers: Sequence[str] = ()) -> list[Offer]:
    """The offers on one of ``gpus`` and ``providers`` (each empty: all), cheapest first per GPU."""
    gpus, providers = filter_values(gpus), filter_values(providers)
    chosen = [o for o in offers
              if (not gpus or any(gpu_matches(g, o.gpu_type) for g in gpus))
              and (not providers or any(provider_matches(p, o.provider) for p in providers))]
    return sorted(chosen, key=lambda o: (o.gpu_type, o.price_per_hour, -o.availability_confidence, o.id))


def nothing_found(offers: Sequence[Offer], gpus: Sequence[str], providers: Sequence[str]) -> str:
    """Why the filters select no offer: the values that are on offer, and the close ones."""
    parts = []
    for wanted, label, attr, match in (("gpu", "GPU", "gpu_type", gpu_matches),
                                       ("provider", "provider", "provider", provider_matches)):
        have = sorted({getattr(o, attr) for o in offers})
        for value in filter_values(gpus if wanted == "gpu" else providers):
            if not any(match(value, h) for h in have):
                close = close_names(value, have) if wanted == "gpu" else close_names(value, have, normalize_provider)
                guess = f" (close: {', '.join(close)})" if close else ""
                parts.append(f"no offer for {label} {value!r}{guess}; {label}s on offer: {', '.join(have) or 'none'}")
    if not parts:
        pairs = sorted({f"{o.gpu_type} on {o.provider}" for o in offers})
        parts.append(f"no offer matches {' and '.join(filter_values(gpus) + filter_values(providers))} together; "
                     f"on offer: {', '.join(pairs)}")
    return "\n".join(parts)


def render(offers: Sequence[Offer], source: str) -> list[str]:
    """A table, one offer a line (the long offer id last), and a footnote on confidence."""
    rows = [COLUMNS] + [(
        o.gpu_type, o.provider, f"{o.price_per_hour:.3f}", f"{o.vram_gb:g}", str(o.gpu_count),
        f"{o.availability_confidence:.2f}" + ("" if o.availability_confidence > DEFAULT_BAR else " *"),
        o.location or "-", o.id,
    ) for o in offers]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    numeric = {2, 3, 4, 5}
    lines = ["  ".join([*(cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
                          for i, cell in enumerate(row[:-1])), row[-1]]) for row in rows]
    gpus = len({o.gpu_type for o in offers})
    providers = len({o.provider for o in offers})
    lines.append(f"{len(offers)} offer(s) of {gpus} GPU type(s) on {providers} provider(s) at {source}")
    if any(o.availability_confidence <= DEFAULT_BAR for o in offers):
        lines.append(f"* availability confidence not above {DEFAULT_BAR:g}: not rented unless the matrix lowers "
                     "offer.min_availability_confidence for its provider (TensorDock reports a flat 0.3)")
    return lines


def as_json(offers: Sequence[Offer]) -> str:
    """The offers with the API's fields (as :class:`Offer` reads them), in the table's order."""
    return json.dumps(TypeAdapter(list[Offer]).dump_python(list(offers), mode="json"), indent=2)


def list_offers(settings: Settings, *, sandbox: bool = False, as_json_text: bool = False,
                cloud: str = DEFAULT_CLOUD) -> str:
    """The command's output: the offers at ``settings.api`` (with ``settings.api_token``), or of a
    sandbox started for the listing (``sandbox``, its catalog ``settings.sandbox_catalog``), or of
    another ``cloud`` the registry builds, that ``settings.gpu`` and ``settings.provider`` select.
    Raises :class:`CommandProblem`."""
    from ..errors import ApiUnreachable, StageError

    gpus, providers = settings.gpu, settings.provider
    url, token = settings.api, settings.api_token
    if cloud != DEFAULT_CLOUD:
        if sandbox:
            raise CommandProblem(f"--sandbox lists GPU Shopper's offers; --cloud {cloud} lists its own", 2)
        if not is_known(cloud):
            raise CommandProblem(f"unknown cloud {cloud!r}; known clouds: {', '.join(known_clouds())}", 2)
        url = f"the {cloud} cloud"
    with ExitStack() as stack:
        if sandbox:
            from ..sandbox import SandboxThread

            catalog = settings.sandbox_catalog
            try:
                started = stack.enter_context(SandboxThread(catalog=catalog))
            except Exception as exc:  # noqa: BLE001 - a bad catalog file: one line
                raise CommandProblem(f"the sandbox did not start: {exc}", 2) from None
            url, token = started.url, started.token  # its API needs its own token
        try:
            offers = asyncio.run(fetch_offers(url, token, cloud=cloud, settings=settings))
        except ApiUnreachable as exc:
            raise CommandProblem(f"{exc.message}: start the server, point --api or GPUBENCH_API_BASE at it, or "
                                "list the sandbox's offers with --sandbox", 1) from None
        except StageError as exc:
            raise CommandProblem(f"reading the inventory at {url} failed: {exc}", 1) from None
    chosen = select(offers, gpus, providers)
    if as_json_text:
        return as_json(chosen)
    if not chosen:
        raise CommandProblem(nothing_found(offers, gpus, providers) if offers
                            else f"the inventory at {url} lists no offers now", 1)
    return "\n".join(render(chosen, "the sandbox" if sandbox else url))
