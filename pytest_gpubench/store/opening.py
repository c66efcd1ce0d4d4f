"""Which store a location names, opened: the one door every reader and writer comes through.

The plugin, ``gpubench`` commands, resume and plan estimates open their store here,
never a concrete class. A location is one of:

* a SQLite file path (the embedded default, the manifest);
* ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``postgres://``): one database
  many machines share (:mod:`.postgres_store`, the ``[postgresql]`` extra);
* ``git+URL`` (``git+file:///srv/results.git``, ``git+ssh://...``): seed 002's results
  repository, for teams without a database (:mod:`.git_store`), with a SQLite manifest
  beside it for everything the repository does not hold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import UsageProblem
from .base import Store
from .redaction import redact

__all__ = ["POSTGRES_SCHEMES", "StoreKind", "open_store", "redact", "store_exists", "store_kind"]

#: ``scheme://...`` (or ``scheme:/...``, what ``Path`` makes of it): a location that names
#: a server, not a file. Two letters at least, so ``C:/...`` stays a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
POSTGRES_SCHEMES = ("postgresql", "postgres")
_SUPPORTED = ("a SQLite file path (for example reports/manifest.db), postgresql://USER@HOST/DB, "
              "or git+URL of a results repository (git+file:///srv/results.git)")

StoreKind = str  # "sqlite" | "postgresql" | "git"


def store_kind(location: str | Path) -> StoreKind:
    """``sqlite``, ``postgresql`` or ``git``; another URL scheme is a ``UsageProblem`` naming what is supported."""
    found = _URL.match(str(location))
    if not found:
        return "sqlite"
    scheme = found[1].lower()
    if scheme in POSTGRES_SCHEMES:
        return "postgresql"
    if scheme.startswith("git+"):
        return "git"
    raise UsageProblem(f"store {found[1]}://...: not a store this version knows; a store is {_SUPPORTED}")


def open_store(location: str | Path, *, read_only: bool = False, **options: Any) -> Store:
    """The store at ``location``, created as needed.

    ``options`` tune the SQLite file (``busy_timeout``, ``retry_seconds``: see
    :class:`~.manifest.Manifest`); the other stores take what applies to them and
    ignore the rest. ``read_only``: for a command that only reads (report, export, status,
    browse, plan): a SQLite file is opened ``mode=ro`` and must already be a current manifest
    (else :class:`~pytest_gpubench.errors.NotAManifest` or
    :class:`~pytest_gpubench.errors.MigrationNeeded`, the file unchanged). A server store
    (PostgreSQL, git) keeps its own rules: it is reached as for writing.
    """
    kind = store_kind(location)
    if kind == "postgresql":
        from .postgres_store import PostgresStore  # psycopg is loaded only for such a store

        return PostgresStore.open(str(location), **options)
    if kind == "git":
        from .git_store import GitStore

        return GitStore.open(str(location), **options)
    from .sqlite_store import SqliteStore  # sqlite-utils is loaded only when a store is opened

    return SqliteStore.open(Path(location), read_only=read_only, **options)


def store_exists(location: str | Path) -> bool:
    """Whether ``location`` already holds a store: looking must never create one.

    A server store (PostgreSQL, git) is there when it answers; it is reached, not
    created, and a store that cannot be reached raises its problem (with the URL's
    password hidden), not "missing".
    """
    kind = store_kind(location)
    if kind == "postgresql":
        from .postgres_store import PostgresStore

        return PostgresStore.exists(str(location))
    if kind == "git":
        from .git_store import GitStore

        return GitStore.exists(str(location))
    return Path(location).is_file()
