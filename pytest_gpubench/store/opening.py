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

#: ``scheme://...`` (or ``scheme:/...``, what ``Path`` makes of it): a location that names
#: a server, not a file. Two letters at least, so ``C:/...`` stays a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def _sqlite_path(location: str | Path) -> Path:
    """``location`` as the SQLite file it must be; a URL is a ``UsageProblem`` saying what is supported."""
    found = _URL.match(str(location))
    if found:
        raise UsageProblem(f"store {found[1]}://...: only a SQLite file path is supported as a store "
                           "(for example reports/manifest.db)")
    return Path(location)


def open_store(location: str | Path, **options: Any) -> Store:
    """The store at ``location``, created as needed; ``options`` tune the SQLite file
    (``busy_timeout``, ``retry_seconds``: see :class:`~.manifest.Manifest`).

    A URL (``postgresql://...``) is refused with what is supported, not opened as a
    file of that name.
    """
    path = _sqlite_path(location)
    from .sqlite_store import SqliteStore  # sqlite-utils is loaded only when a store is opened

    return SqliteStore.open(path, **options)


def store_exists(location: str | Path) -> bool:
    """Whether ``location`` already holds a store: looking must never create one. A URL
    is refused as :func:`open_store` refuses it, not reported as missing."""
    return _sqlite_path(location).is_file()
