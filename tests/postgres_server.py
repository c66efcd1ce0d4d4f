"""A real PostgreSQL server for the tests (a pytest plugin, registered by tests/conftest.py).

``postgres_server`` (session): the URL of a server and a superuser: ``GPUBENCH_TEST_POSTGRES_URL``
when set (CI's ``.ci/run`` starts one), else one this session starts itself: ``initdb``
in a temporary directory, ``pg_ctl start`` on 127.0.0.1 and a free port, durability off
(``fsync``, ``synchronous_commit``, ``full_page_writes``: a test database is thrown away).
PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres``
system user and runs as it. Each xdist worker starts its own (measured: about 1.5 s of
initdb and start on this machine), stopped at the end of the session.

``shared_store`` (function): where a test's controllers share a store, of the kind its
``store_kind`` parameter names (``sqlite``: a file, ``postgresql``: a fresh schema, ``git``: a
bare repository); each test picks the kinds worth its time.

``postgres_url`` (function): a fresh, empty store location on that server for one test: a
schema of its own (the URL sets ``search_path``), dropped after it. A schema takes
milliseconds where ``CREATE DATABASE`` took 0.3 to 0.6 s here (a checkpoint each). Without PostgreSQL installed both skip, unless ``GPUBENCH_REQUIRE_POSTGRES=1``
(CI), which makes them fail.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

__all__ = ["postgres_server", "postgres_url", "schema_url", "shared_store"]

_USER = "gpubench"


def _require_or_skip(reason: str) -> None:
    if os.environ.get("GPUBENCH_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"GPUBENCH_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _binaries() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(folder, "initdb").exists() and Path(folder, "pg_ctl").exists():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user() -> list[str]:
    """The command prefix that runs a PostgreSQL program as a user it accepts (never root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def schema_url(server: str, schema: str) -> str:
    """``server``'s URL with ``schema`` first on the search path (libpq's ``options``)."""
    parts = urlsplit(server)
    query = "&".join(filter(None, [parts.query, f"options=-csearch_path%3D{schema}"]))
    return urlunsplit(parts._replace(query=query))


def _start(binaries: Path, folder: Path) -> tuple[str, list[str]]:
    """Start a throwaway cluster under ``folder``; its URL and the command that stops it."""
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir()
    prefix = _as_server_user()
    if prefix:
        shutil.chown(folder, "postgres")
        shutil.chown(sockets, "postgres")
        folder.chmod(0o700)
    subprocess.run([*prefix, str(binaries / "initdb"), "-D", str(data), "-U", _USER, "-A", "trust",
                    "--no-sync", "-E", "UTF8", "--locale", "C"], check=True, capture_output=True, text=True)
    port = _free_port()
    options = (f"-h 127.0.0.1 -p {port} -k {sockets} -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off -c max_connections=200")
    subprocess.run([*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-t", "60",
                    "-l", str(folder / "server.log"), "start"], check=True, capture_output=True, text=True)
    stop = [*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
    return f"postgresql://{_USER}@127.0.0.1:{port}/postgres", stop


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL server (database ``postgres``) whose user may create databases."""
    given = os.environ.get("GPUBENCH_TEST_POSTGRES_URL")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _require_or_skip("psycopg is not installed (pip install -e '.[postgresql]')")
    if given:
        yield given
        return
    binaries = _binaries()
    if binaries is None:
        _require_or_skip("PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="gpubench-pg-"))
    try:
        url, stop = _start(binaries, folder)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        _require_or_skip(f"could not start PostgreSQL: {exc.stderr or exc}")
    try:
        yield url
    finally:
        subprocess.run(stop, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The URL of a fresh, empty schema for one test (see the module's docstring)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{name}"')
    yield schema_url(postgres_server, name)
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def shared_store(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The location of a store the test's controllers share, of kind ``store_kind`` (a parameter
    the test gives: ``@pytest.mark.parametrize("store_kind", ["postgresql"])``)."""
    if store_kind == "postgresql":
        return request.getfixturevalue("postgres_url")
    if store_kind == "git":
        return f"git+file://{tmp_path}/results.git"
    if store_kind == "sqlite":
        return str(tmp_path / "shared.db")
    raise ValueError(f"no store kind {store_kind!r}: sqlite, postgresql or git")
