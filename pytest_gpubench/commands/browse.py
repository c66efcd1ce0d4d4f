"""``gpubench browse``: the manifest in Datasette, every table and column described.

Datasette (https://datasette.io) is an optional dependency, the ``[browse]`` extra.
The metadata it shows (titles, descriptions, default sort orders, facets and a few
canned queries) is generated from :mod:`.manifest_docs`, for the tables and columns
the file really has, so a manifest made by an older version is browsed as it is.

The manifest is opened read-only and never upgraded or locked: a run may be
writing to it at that moment (see :func:`serve`).
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ..errors import SEED_STAGE_NAMES, CommandProblem, Stage
from ..store.data_dictionary import TABLES, schema_of

INSTALL_HINT = "pip install 'pytest-gpubench[browse]'"
DEFAULT_PORT = 8001  # Datasette's own default


def read_schema(path: Path) -> dict[str, list[str]]:
    """The tables and columns of the manifest at ``path``, read through a read-only connection.

    Raises :class:`CommandProblem` when there is no file, it is not a manifest, or it needs
    ``gpubench migrate`` (an older version's file is left as it is: Datasette serves it read-only).
    """
    from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest
    from ..store.sqlite import ManifestStore

    if not path.is_file():
        raise CommandProblem(f"no manifest at {path} (run pytest with the plugin first, or pass --manifest PATH)")
    try:
        store = ManifestStore(path, busy_timeout=5, read_only=True)
    except (NotAManifest, MigrationNeeded, ManifestTooNew) as exc:
        raise CommandProblem(str(exc)) from None
    except sqlite3.Error as exc:
        raise CommandProblem(f"cannot read the manifest {path}: {exc}") from None
    try:
        return schema_of(store.db.conn)
    finally:
        store.close()


# ------------------------------------------------------------------ metadata

def _stage_order(column: str) -> str:
    """An SQL expression ranking ``column`` by the order of the stages (enum values, not user input)."""
    whens = " ".join(f"WHEN '{stage.value}' THEN {rank}" for rank, stage in enumerate(Stage, start=1))
    return f"CASE {_stage_today(column)} {whens} ELSE {len(Stage) + 1} END"


def _stage_today(column: str) -> str:
    """An SQL expression for ``column``'s stage name by today's name: a row an older version wrote with
    the seed's name (``ollama_install``) groups with today's (errors.SEED_STAGE_NAMES; no user input)."""
    whens = " ".join(f"WHEN '{seed}' THEN '{stage.value}'" for stage, seed in SEED_STAGE_NAMES.items())
    return f"CASE {column} {whens} ELSE {column} END"


#: name -> (the tables it reads, its Datasette canned query).
_QUERIES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "leaderboard": (("benchmarks",), {
        "title": "Leaderboard: output tokens/s per model, GPU and provider",
        "description": (
            "Every stored result grouped by model, GPU type and provider, fastest first within each model. "
            "output_tokens_per_second is output throughput (output tokens / measured duration), "
            "decode_tokens_per_second the per-request mean decode rate; USD per million output tokens at the "
            "offer's price."
        ),
        "sql": (
            "SELECT model, gpu_type, provider, count(*) AS results,\n"
            "  round(avg(output_tokens_per_second), 1) AS avg_output_tokens_per_second,\n"
            "  round(max(output_tokens_per_second), 1) AS best_output_tokens_per_second,\n"
            "  round(avg(decode_tokens_per_second), 1) AS avg_decode_tokens_per_second,\n"
            "  round(avg(p50_ttft_ms), 1) AS avg_ttft_p50_ms,\n"
            "  round(min(cost_per_million_tokens), 4) AS best_usd_per_million_tokens,\n"
            "  round(avg(price_per_hour), 4) AS avg_price_per_hour\n"
            "FROM benchmarks\n"
            "WHERE output_tokens_per_second IS NOT NULL OR decode_tokens_per_second IS NOT NULL\n"
            "GROUP BY model, gpu_type, provider\n"
            "ORDER BY model, avg_output_tokens_per_second DESC, avg_decode_tokens_per_second DESC"
        ),
    }),
    "failures_by_stage": (("benchmark_manifest",), {
        "title": "Failures by stage",
        "description": (
            "Cells that failed, ended partial or were skipped, grouped by the stage where it happened (in stage "
            "order) and the reason, with the latest message of each group."
        ),
        "sql": (
            f"SELECT {_stage_today('failure_stage')} AS failure_stage, status, failure_reason, count(*) AS cells,\n"
            "  group_concat(DISTINCT gpu_type) AS gpu_types,\n"
            "  group_concat(DISTINCT provider) AS providers,\n"
            "  group_concat(DISTINCT model) AS models,\n"
            "  max(coalesce(completed_at, created_at)) AS latest,\n"
            "  error_message AS latest_message  -- SQLite: a bare column comes from the max() row\n"
            "FROM benchmark_manifest\n"
            "WHERE status IN ('failed', 'partial', 'skipped')\n"
            "GROUP BY 1, status, failure_reason\n"
            f"ORDER BY {_stage_order('failure_stage')}, cells DESC"
        ),
    }),
    "spend_per_run": (("runs", "benchmark_manifest", "attempts"), {
        "title": "Spend per run",
        "description": (
            "Per run, newest first: cells, successes, sessions rented and the GPU spend in USD (price x session "
            "lifetime, summed over the provisioning attempts, which carry the whole bill of a shared session; "
            "the cells' own cost_usd when a run has no attempts), with GPU Shopper's own billed figure."
        ),
        "sql": (
            "SELECT r.run_id, r.started_at, r.finished_at, r.status,\n"
            "  (SELECT count(*) FROM benchmark_manifest m WHERE m.run_id = r.run_id) AS cells,\n"
            "  (SELECT count(*) FROM benchmark_manifest m WHERE m.run_id = r.run_id AND m.status = 'success')"
            " AS succeeded,\n"
            "  coalesce(\n"
            "    nullif((SELECT count(DISTINCT a.session_id) FROM attempts a WHERE a.run_id = r.run_id), 0),\n"
            "    (SELECT count(DISTINCT m.session_id) FROM benchmark_manifest m WHERE m.run_id = r.run_id))"
            " AS sessions,\n"
            "  round(coalesce(\n"
            "    (SELECT sum(a.cost_usd) FROM attempts a WHERE a.run_id = r.run_id),\n"
            "    (SELECT sum(m.cost_usd) FROM benchmark_manifest m WHERE m.run_id = r.run_id), 0), 4) AS spend_usd,\n"
            "  round((SELECT sum(a.api_cost_usd) FROM attempts a WHERE a.run_id = r.run_id), 4) AS api_billed_usd\n"
            "FROM runs r\n"
            "ORDER BY r.started_at DESC"
        ),
    }),
}


def datasette_metadata(db_name: str, schema: dict[str, list[str]], source: str = "") -> dict[str, Any]:
    """Datasette's metadata for the manifest served as database ``db_name`` with this ``schema``.

    Only tables and columns that exist are described, sorted by or faceted on, and
    only the canned queries whose tables all exist are offered, so an older file
    browses without errors.
    """
    tables: dict[str, Any] = {}
    for table, doc in TABLES.items():
        present = schema.get(table)
        if present is None:
            continue
        entry: dict[str, Any] = {
            "title": doc.title,
            "description": doc.description,
            "columns": {column: doc.columns[column] for column in present if column in doc.columns},
        }
        if doc.sort in present:
            entry["sort"] = doc.sort
        if doc.sort_desc in present:
            entry["sort_desc"] = doc.sort_desc
        facets = [column for column in doc.facets if column in present]
        if facets:
            entry["facets"] = facets
        tables[table] = entry
    queries = {name: dict(query) for name, (needs, query) in _QUERIES.items() if all(t in schema for t in needs)}
    where = f" ({source})" if source else ""
    return {
        "title": "pytest-gpubench results",
        "description": (
            f"The pytest-gpubench manifest{where}: every run, every matrix cell's outcome, every benchmark "
            "result with its requests and GPU telemetry, and every provisioning attempt with its cost."
        ),
        "databases": {
            db_name: {
                "title": "pytest-gpubench manifest",
                "description": (
                    "Start with benchmark_manifest (one row per cell: status, failure stage, headline "
                    "figures, cost) or the canned queries below. Times are ISO-8601 UTC; money is USD."
                ),
                "tables": tables,
                "queries": queries,
            }
        },
    }


# -------------------------------------------------------------------- serving

def _datasette_cli():
    try:
        from datasette.cli import cli
    except ImportError:
        raise CommandProblem(f"Datasette is not installed: {INSTALL_HINT}") from None
    return cli


def listen_port(host: str, port: int) -> int:
    """``port`` if it is free on ``host``, or a free port when ``port`` is 0.

    A port chosen here is handed to Datasette, which binds it a moment later; the
    system hands out ephemeral ports in turn, so another program taking it in
    between is very unlikely. Choosing it here lets the URL be printed (and a
    browser opened) with the real port; Datasette's own ``-p 0`` cannot do either.
    """
    if not 0 <= port <= 65535:
        raise CommandProblem(f"--port must be 0-65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise CommandProblem(
            f"cannot listen on {host}: {exc.strerror}; pass --host with an address of this machine"
        ) from None
    with socket.socket(family, kind, proto) as sock:
        # As uvicorn binds, so that a port left in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise CommandProblem(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass --port N (--port 0 picks a free one)"
            ) from None
        return sock.getsockname()[1]


class _Stopped(Exception):
    """SIGTERM arrived: stop serving as Ctrl-C does."""


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """Turn SIGTERM into :class:`_Stopped`, so the temporary metadata is removed on the way out.

    uvicorn handles SIGTERM itself while serving, and re-raises it once it has shut
    down; without a handler of ours the process would then die on the spot.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise _Stopped()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def url_of(host: str, port: int, path: str = "") -> str:
    """``http://host:port/path``, with an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/{path}"


def serve(
    manifest: Path,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    open_browser: bool = True,
    extra_args: Sequence[str] = (),
    out: TextIO | None = None,
) -> int:
    """Serve ``manifest`` with Datasette until stopped (Ctrl-C, SIGTERM); returns an exit status.

    Datasette runs in this process (so stopping this pid stops the server), through
    its own command line, so ``extra_args`` are any ``datasette serve`` options.

    The file is opened as a plain (mutable) database, not with ``-i``: Datasette then
    reads it through ``mode=ro`` connections, which never write or take a write
    lock, and which read through the WAL as SQLite readers do, so a run writing to
    the manifest at the same time is not disturbed and its new rows show up on the
    next page load. ``-i`` opens it ``immutable=1``: SQLite then skips locking and
    ignores the ``-wal`` file, so the rows a live run has not checkpointed yet
    (possibly whole tables) are missing and a checkpoint under the reader can give
    wrong results or "database disk image is malformed"; Datasette also counts
    every table's rows at start-up for immutable files.
    """
    out = out or sys.stdout
    cli = _datasette_cli()
    schema = read_schema(manifest)
    db_name = manifest.stem  # the name Datasette gives a file: its stem
    port = listen_port(host, port)
    metadata = datasette_metadata(db_name, schema, source=str(manifest))
    with tempfile.TemporaryDirectory(prefix="gpubench-browse-") as tmp:
        metadata_file = Path(tmp) / "metadata.json"
        metadata_file.write_text(json.dumps(metadata, indent=2), encoding="utf-8")
        args = ["serve", str(manifest), "--metadata", str(metadata_file), "--host", host, "--port", str(port)]
        if open_browser:
            args.append("--open")
        args.extend(extra_args)
        print(f"gpubench browse: serving {manifest} read-only at {url_of(host, port, db_name)} "
              "(Ctrl-C to stop)", file=out, flush=True)
        try:
            with _sigterm_stops():
                status = cli.main(args=args, prog_name="datasette", standalone_mode=False)
        except (KeyboardInterrupt, _Stopped):
            print("gpubench browse: stopped", file=out, flush=True)
            return 0
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            # click's usage errors (a bad extra argument) and Datasette's start-up errors
            # are ClickExceptions with a message for a person; anything else is named.
            message = exc.format_message() if hasattr(exc, "format_message") else f"{type(exc).__name__}: {exc}"
            raise CommandProblem(f"Datasette: {message}") from None
    return status if isinstance(status, int) else 0
