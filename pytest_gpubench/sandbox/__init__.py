"""The sandbox: an emulated GPU Shopper API whose sessions are real SSH servers on loopback.

Users run it with ``gpubench sandbox`` (or ``python -m pytest_gpubench.sandbox``) to
dry-run matrices for free; the project's end-to-end tests run on it. Its parts:

- ``catalog.py`` / ``catalog.yaml``: offers, GPUs, models, rates, timings;
- ``api.py``: the REST API (and the sandbox-only ``/sandbox/`` calls);
- ``cloud.py`` (inventory, sessions, billing), ``faults.py``: server-side state;
- ``instances.py``, ``sshd.py``, ``shims.py``: the emulated machines;
- ``ollama_standin.py``, ``nvidia_smi_standin.py``, ``df_standin.py``: the programs
  on them (``df_standin.py`` holds the emulated disk that ``df`` and Ollama's pulls share);
- ``standin_service.py``: each instance's answering service. The ``bin/`` wrappers
  ask it over a Unix socket with the real ``curl``, and it answers one-shot calls
  (``nvidia-smi --query-gpu``, ``-q``; ``ollama --version``; ``df``; ``curl`` of
  the install URL) with the modules' own ``one_shot`` code as ``sh`` to replay, so
  no Python starts; loops, ``ollama serve`` and declined calls run the module;
- ``server.py``: :class:`Sandbox`, :class:`SandboxThread`, :func:`serve`, :func:`main`;
  and the machines of the ``hosts`` and ``local`` providers (:class:`SandboxHostsThread`,
  ``gpubench sandbox hosts``).

Exports are resolved lazily: the stand-in modules import this package whenever they
run on an instance and must not pay for aiohttp and asyncssh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The shipped sandbox catalog. Defined here, not in ``catalog.py``, so that reading its GPU
#: names (``run/hints.py``) imports neither the sandbox nor pydantic's models of the catalog.
DEFAULT_CATALOG = Path(__file__).with_name("catalog.yaml")

__all__ = ["Sandbox", "SandboxSummary", "SandboxThread", "serve", "main", "load_catalog", "CatalogError", "URL_PREFIX"]

_EXPORTS = {
    "Sandbox": "server",
    "SandboxSummary": "server",
    "SandboxThread": "server",
    "serve": "server",
    "main": "server",
    "URL_PREFIX": "server",
    "load_catalog": "catalog",
    "CatalogError": "catalog",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
