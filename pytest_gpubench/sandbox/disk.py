"""An instance's emulated disk: how big it is, what fills it, and how a full one fails.

The disk is the instance file's ``disk`` (the session's ``disk_gb`` or the
provider's default). Used space is the system (image and OS) plus every pulled
model plus the blobs of pulls not finished; ``df`` on the instance reports it and
the Ollama stand-in's pull stops when it is full, with Ollama's own error.

Nothing here touches the host's real disk: sizes are bookkeeping in the state
directory, shared by the processes of one instance.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .instance_spec import DiskSpec, InstanceSpec
from .standin_state import StateStore

NO_SPACE = "no space left on device"


@dataclass(frozen=True)
class DiskUsage:
    """Bytes of one filesystem; ``used`` never exceeds ``total``."""

    total: int
    used: int

    @property
    def available(self) -> int:
        return self.total - self.used


def disk_usage(disk: DiskSpec, model_sizes: Iterable[int], downloads: Mapping[str, int]) -> DiskUsage:
    """The disk with these pulled models and these partly written blobs on it."""
    used = disk.system_bytes + sum(model_sizes) + sum(downloads.values())
    return DiskUsage(total=disk.size_bytes, used=min(used, disk.size_bytes))


def read_disk_usage(spec: InstanceSpec) -> DiskUsage:
    """The disk as the instance's state files describe it now (what ``df`` shows)."""
    store = StateStore(spec.state_dir)
    return disk_usage(spec.disk, (m.size for m in store.read_pulled().values()), store.read_downloads())


def default_models_dir(env: Mapping[str, str]) -> str:
    """Where Ollama keeps models: ``OLLAMA_MODELS``, else ``$HOME/.ollama/models``."""
    configured = env.get("OLLAMA_MODELS", "").strip()
    if configured:
        return configured
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".ollama", "models")


def no_space_error(models_dir: str, digest: str) -> str:
    """Ollama's pull error when the disk fills while it writes ``digest``.

    Ollama writes each blob to ``blobs/sha256-<hex>-partial`` and stops at the first
    write that fails with ENOSPC; Go words that as ``write <path>: <errno text>``.
    """
    blob = digest.replace(":", "-", 1)
    return f"write {os.path.join(models_dir, 'blobs', blob)}-partial: {NO_SPACE}"


class Downloads:
    """Bytes written so far of each blob whose pull has not finished.

    Kept in the state directory (``ollama_downloads.json``) so that ``df`` counts
    them. A blob stays after a pull stopped by a full disk, and the next pull of the
    same model resumes it, as Ollama's ``-partial`` files do, until the model is
    complete (its size then counts as a pulled model instead) or the server restarts
    (Ollama prunes partial downloads when it starts).
    """

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.written: dict[str, int] = store.read_downloads()

    def get(self, digest: str) -> int:
        """Bytes of ``digest`` on disk (0 when none)."""
        return self.written.get(digest, 0)

    def set(self, digest: str, written: int) -> None:
        """Record ``written`` bytes of ``digest``; never goes back (two pulls may share a blob)."""
        if written > self.get(digest):
            self.written = {**self.written, digest: written}
            self._store.write_downloads(self.written)

    def drop(self, digests: Iterable[str]) -> None:
        """Forget these blobs: their model is complete and counted whole."""
        gone = set(digests)
        if gone & self.written.keys():
            self.written = {k: v for k, v in self.written.items() if k not in gone}
            self._store.write_downloads(self.written)

    def prune(self) -> int:
        """Forget every unfinished blob, as Ollama does when it starts; returns how many."""
        count = len(self.written)
        self.written = {}
        self._store.write_downloads({})
        return count
