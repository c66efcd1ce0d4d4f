"""What a runtime is, declared once in its own module, and the registry of runtime names.

Every runtime (``runtime:`` in a matrix) is one module that declares a :class:`RuntimeFacts`
named ``RUNTIME``: its ``Runtime`` class and the facts other folders read (a server per cell or
one per machine, how GPU Shopper starts it from an image, how the sandbox imitates it, its
launch template, health path, version command and tensor-parallel flag). Nothing else lists
runtimes: the matrix checks names here, ``cloud/`` asks here how many GPUs a cell leases and
which image workload it is, ``runtimes/registry.py`` builds a cell's runtime from it, the
sandbox writes an instance's launchers from it.

The registry maps a name to where its declaration lives, as an entry point does
(``module:attribute``): the built-in runtimes in :data:`BUILT_IN`, a third party's in the entry
point group :data:`ENTRY_POINT_GROUP` of its distribution (read only when a name is not built
in, so loading the plugin reads no distribution's metadata). A declaration is imported the first
time a fact of it is asked for. This module sits at the top of the flow (docs/architecture.md)
and imports nothing of the package: the matrix and ``cloud/``, above ``runtimes/`` in the flow,
read the facts without importing the runtimes' folder.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

#: The entry point group a third-party runtime registers in: ``NAME = "module:RUNTIME"``.
ENTRY_POINT_GROUP = "pytest_gpubench.runtimes"
#: The runtimes the package ships, the first the default: name -> its declaration.
BUILT_IN: dict[str, str] = {
    "ollama": "pytest_gpubench.runtimes.ollama:RUNTIME",
    "vllm": "pytest_gpubench.runtimes.vllm:RUNTIME",
    "sglang": "pytest_gpubench.runtimes.sglang:RUNTIME",
    "tgi": "pytest_gpubench.runtimes.tgi:RUNTIME",
    "llamacpp": "pytest_gpubench.runtimes.llamacpp:RUNTIME",
    "openai": "pytest_gpubench.runtimes.openai_endpoint:RUNTIME",
    "worker": "pytest_gpubench.runtimes.worker:RUNTIME",
}
DEFAULT_RUNTIME = next(iter(BUILT_IN))


@dataclass(frozen=True)
class ImageServer:
    """How GPU Shopper's entrypoint mode (``runtime.launch``, ``matrix/launch.py``) starts the runtime
    from an image: the ``workload_type`` that names it (``pkg/models/session.go``) and the server's
    defaults for it (``internal/provider/vastai/types.go``, ``GetPortForWorkload``)."""

    workload_type: str
    image: str
    api_port: int


@dataclass(frozen=True)
class SandboxImitation:
    """How the sandbox (``sandbox/``) imitates the runtime on an instance.

    ``launcher``: ``bin/PROGRAM`` runs the sandbox's stand-in launcher ``stand_in`` (one of
    ``sandbox/openai_launchers.PROGRAMS``: its flags, logs and words), so a runtime whose server
    speaks like one of them needs nothing else of the sandbox; ``python-package``: an importable
    package named ``program`` on the instance's ``PYTHONPATH`` starts ``stand_in`` (SGLang's
    ``python3 -m sglang.launch_server``); ``own``: a stand-in of its own that ``stand_in`` names
    (Ollama's, ``docker``'s workers, a test's endpoint)."""

    program: str
    stand_in: str
    kind: Literal["launcher", "python-package", "own"] = "launcher"


@dataclass(frozen=True)
class RuntimeFacts:
    """One runtime's declaration (its module's ``RUNTIME``): everything outside its module reads this."""

    #: The matrix's ``runtime:`` name; also the result's ``model.runtime``.
    name: str
    #: The ``Runtime`` class (``runtimes/base.py``): ``runtime.for_cell(conn, cell, placement)`` builds a cell's.
    runtime: Any = field(repr=False)
    #: A server of its own per cell (on a free port, with files of its own), so cells on a machine the run
    #: does not own lease only their GPUs; False: one server per machine (Ollama), or containers
    #: (workers): a cell leases the whole machine (``cloud/hosts_provider.py``).
    server_per_cell: bool = False
    #: The launch command's words (``{model}``, ``{host}``, ``{port}``, ``{parallel}``, ``{args}``); empty:
    #: not launched from a template (Ollama's ``ollama serve``, a running endpoint, containers).
    launch: tuple[str, ...] = ()
    #: The path that answers 200 once the server serves ("": the runtime checks health its own way).
    health_path: str = ""
    #: The shell command whose output carries the version ("": the server says it over its API).
    version_command: str = ""
    #: The flag that spreads the model over N GPUs; None: it spreads layers instead (or has no GPUs).
    tensor_parallel_flag: str | None = None
    #: How GPU Shopper starts it from an image; None: it cannot (``launch: {mode: ssh}`` only).
    image: ImageServer | None = None
    #: How the sandbox imitates it; None: the sandbox cannot (its tests need a real server).
    sandbox: SandboxImitation | None = None


class UnknownRuntime(LookupError):
    """A name no runtime is registered under; its message lists those that are."""


_registered: dict[tuple[str, ...], dict[str, Any]] = {}


def registered() -> dict[str, Any]:
    """The third-party runtimes: name -> entry point, read from the distributions on ``sys.path``
    (read again when ``sys.path`` changes: a test, or a run, may put one there meanwhile)."""
    key = tuple(sys.path)
    if key not in _registered:
        from importlib.metadata import entry_points  # only here: reading distributions costs time

        _registered.clear()
        _registered[key] = {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)
                            if point.name not in BUILT_IN}
    return _registered[key]


def runtime_names() -> tuple[str, ...]:
    """Every runtime a matrix may name: the built-in ones, then the registered ones."""
    return (*BUILT_IN, *sorted(registered()))


def is_runtime(name: str) -> bool:
    """Whether ``name`` is a built-in or registered runtime (distributions are read only for a name
    not built in)."""
    return name in BUILT_IN or name in registered()


def unknown(name: str) -> str:
    """``unknown runtime 'x'; known runtimes: ollama, ...``: what a name no runtime has gets."""
    return f"unknown runtime {name!r}; known runtimes: {', '.join(runtime_names())}"


_loaded: dict[str, RuntimeFacts] = {}


def facts_of(name: str) -> RuntimeFacts:
    """The declaration of runtime ``name``, imported on first use; :class:`UnknownRuntime` for a name
    neither built in nor registered, ``TypeError`` for a registration that is no ``RuntimeFacts`` of
    that name."""
    if name in _loaded:
        return _loaded[name]
    if name in BUILT_IN:
        module, _, attribute = BUILT_IN[name].partition(":")
        facts = getattr(importlib.import_module(module), attribute)
        where = BUILT_IN[name]
    else:
        point = registered().get(name)
        if point is None:
            raise UnknownRuntime(unknown(name))
        facts, where = point.load(), f"{point.value} (entry point {ENTRY_POINT_GROUP}: {name})"
    if not isinstance(facts, RuntimeFacts) or facts.name != name:
        raise TypeError(f"{where} is not the RuntimeFacts of runtime {name!r}: {facts!r}")
    _loaded[name] = facts
    return facts


def all_facts() -> list[RuntimeFacts]:
    """Every runtime's declaration, built-in then registered (the sandbox writes each launcher)."""
    return [facts_of(name) for name in runtime_names()]


def server_per_cell(name: str) -> bool:
    """Whether runtime ``name`` starts a server of its own per cell (False for a name no runtime has)."""
    return is_runtime(name) and facts_of(name).server_per_cell


def image_runtimes() -> list[str]:
    """The runtimes GPU Shopper can start from an image (entrypoint mode)."""
    return [facts.name for facts in all_facts() if facts.image is not None]
