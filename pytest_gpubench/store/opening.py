"""Which store a location names, opened: the one door every reader and writer comes through.

The plugin, ``gpubench`` commands, resume and plan estimates open their store here,
never a concrete class, so a store of another kind (PostgreSQL, issue 13) is one
more branch here and nothing else changes. Today a location is a SQLite file path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import UsageProblem
from .base import Store

#: ``scheme://...``: a location that names a server, not a file.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def open_store(location: str | Path, **options: Any) -> Store:
    """The store at ``location``, created as needed; ``options`` tune the SQLite file
    (``busy_timeout``, ``retry_seconds``: see :class:`~.manifest.Manifest`).

    A URL (``postgresql://...``) is refused with what is supported, not opened as a
    file of that name.
    """
    text = str(location)
    if _URL.match(text):
        scheme = text.split("://", 1)[0]
        raise UsageProblem(f"store {scheme}://...: only a SQLite file path is supported as a store "
                           "(for example reports/manifest.db)")
    from .sqlite_store import SqliteStore  # sqlite-utils is loaded only when a store is opened

    return SqliteStore.open(Path(text), **options)


def store_exists(location: str | Path) -> bool:
    """Whether ``location`` already holds a store: looking must never create one."""
    return not _URL.match(str(location)) and Path(location).is_file()
