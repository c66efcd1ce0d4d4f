"""``/api/pull`` of the Ollama stand-in: the progress stream of a model download.

The emulated registry is the instance file's model catalog. A download takes
``size / pull_mb_per_s`` seconds, shrunk by the time scale, and reports progress
the way Ollama does: ``pulling manifest``, then one ``pulling <digest12>`` status
per layer with ``digest``, ``total`` and a rising ``completed``, then
``verifying sha256 digest``, ``writing manifest`` and ``success``.

Every layer's bytes land on the instance's emulated disk as they arrive (see
:mod:`.disk`). Like Ollama, the pull does not check for room first: it stops when
the disk is full, with ``write <models>/blobs/sha256-<hex>-partial: no space left
on device``, and adds nothing to the model list; what it wrote stays on the disk
and the next pull of that model resumes from there. A ``pull_error`` fault armed by
the sandbox fails the pull as a registry dropping the download does.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .disk import no_space_error
from .instance_spec import ModelSpec, normalize_model_name
from .ollama_engine import Engine

# Ollama's own wording when the registry has no such model or tag.
MANIFEST_NOT_FOUND = "pull model manifest: file does not exist"
# Small layers that follow the weights: template, license, parameters.
_SMALL_LAYERS = (("template", 1_482), ("license", 11_344), ("params", 110))
# Progress at least this often, and at least this many updates per layer.
MAX_UPDATE_INTERVAL_S = 0.2
MIN_UPDATES = 8


class PullError(Exception):
    """A pull that failed; the message is what Ollama would say."""


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int

    @property
    def status(self) -> str:
        return f"pulling {self.digest.split(':', 1)[-1][:12]}"


def model_layers(model: ModelSpec) -> list[Layer]:
    """The blobs of a model: the weights first, then the small layers."""

    def digest(kind: str) -> str:
        return "sha256:" + hashlib.sha256(f"{model.digest}/{kind}".encode()).hexdigest()

    small = [Layer(digest(kind), size) for kind, size in _SMALL_LAYERS]
    weights = Layer(digest("model"), max(1, model.size_bytes - sum(layer.size for layer in small)))
    return [weights, *small]


def _write(engine: Engine, layer: Layer, completed: int) -> int:
    """Put ``layer`` on disk up to ``completed`` bytes; returns how far it got before the disk filled."""
    before = engine.downloads.get(layer.digest)
    reached = min(completed, before + engine.disk_usage().available)
    engine.downloads.set(layer.digest, reached)
    return max(before, reached)


async def pull_progress(engine: Engine, name: str) -> AsyncIterator[dict[str, Any]]:
    """Yield the progress objects of pulling ``name``; raise ``PullError`` on failure."""
    yield {"status": "pulling manifest"}
    found = engine.spec.find_model(name)
    if found is None:
        raise PullError(MANIFEST_NOT_FOUND)
    key, model = found
    already = engine.find_pulled(key) is not None
    # A registry that drops the download (the sandbox's pull_error): a model on disk
    # still has its manifest fetched, so it fails there; else the weights start first.
    fault = engine.next_pull_fault()
    if fault is not None and already:
        raise PullError(fault.message)
    loop = asyncio.get_running_loop()
    bytes_per_s = engine.spec.ollama.pull_mb_per_s * 1e6
    layers = model_layers(model)
    for layer in layers:
        base = {"status": layer.status, "digest": layer.digest, "total": layer.size}
        if already:
            yield {**base, "completed": layer.size}
            continue
        resumed = engine.downloads.get(layer.digest)
        duration = engine.spec.scaled((layer.size - resumed) / bytes_per_s)
        if fault is not None:
            yield base
            raise PullError(fault.message)
        if duration > 0:
            # Like Ollama, the first report of a layer has no "completed" yet.
            yield base
            interval = min(MAX_UPDATE_INTERVAL_S, duration / MIN_UPDATES)
            start = loop.time()
            end = start + duration
            due = start
            while True:
                due += interval
                await asyncio.sleep(max(0.0, min(due, end) - loop.time()))
                now = loop.time()
                if now >= end:
                    break
                wanted = resumed + int((layer.size - resumed) * (now - start) / duration)
                reached = _write(engine, layer, wanted)
                yield {**base, "completed": reached}
                if reached < wanted:
                    raise PullError(no_space_error(engine.settings.models_dir, layer.digest))
        if _write(engine, layer, layer.size) < layer.size:
            yield {**base, "completed": engine.downloads.get(layer.digest)}
            raise PullError(no_space_error(engine.settings.models_dir, layer.digest))
        yield {**base, "completed": layer.size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    engine.record_pull(normalize_model_name(key), model)
    # The blobs now count as the model's size.
    engine.downloads.drop(layer.digest for layer in layers)
    yield {"status": "success"}
