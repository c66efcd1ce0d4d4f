"""The ``gpubench`` command.

``gpubench sandbox`` serves the emulated GPU Shopper cloud standalone, for
other clients (curl, the GPU Shopper CLI, CI pipelines) to rent from for free.

``gpubench sandbox hosts [NAME[=GPU[*COUNT]]...]`` starts sandbox machines for ``cloud: hosts``
(real SSH on loopback, no API) and prints ``GPUBENCH_HOSTS=<hosts.yaml>`` (``sandbox/server.py``);
``gpubench sandbox local [GPU[*COUNT]]`` prints the ``export`` lines that give a shell stand-in
GPUs and Ollama for ``cloud: local``.

``gpubench cleanup [--store PATH|URL] [--api URL] [--reports DIR] [--dry-run]`` releases, through
the API it is given, the GPU sessions that dead runs of the manifest left running (see ``cleanup.py``).

``gpubench export --format json|csv [--run RUN|last] [--store PATH|URL] [-o FILE]``
writes stored results; ``gpubench export --to PATH|URL [--run RUN|last]`` copies the
store's rows into another store, SQLite <-> PostgreSQL (see ``store/export.py``);
``gpubench upload [--run RUN|last] [--store PATH|URL] [--api URL]``
POSTs results to GPU Shopper's ``/api/v1/benchmarks``.

``gpubench report [--run RUN|last ...] [--store PATH|URL] [--reports DIR] [--target-interactivity TOKS]``
writes ``BENCHMARK_REPORT.md`` and ``index.html`` from the manifest (see ``report/gather.py``), and
one PNG per frontier chart when matplotlib is installed; ``gpubench export --points`` writes the
frontier points. ``--compare RUN_A RUN_B`` or ``--compare-stores STORE_A STORE_B`` adds a Comparison
section, printed too and written as ``comparison.json`` (see ``report/comparison.py``).

``gpubench browse [--store PATH] [--port N] [--host H] [--no-open] [-- DATASETTE_ARGS]``
serves the manifest read-only in Datasette (the ``[browse]`` extra; see ``browse.py``).

``gpubench import FILE_OR_DIR... [--store PATH|URL] [--dry-run] [--gpu/--provider/--price/--location]``
brings result files (seed-000 results, seed-001 checkpoints, GPU Shopper BenchmarkResult
JSON) into the manifest, each result once (see ``importer.py``).

``gpubench plan PATH... [--gpu/--provider/--model X] [-k EXPR] [--api URL | --sandbox] [-n N] [--json]``
prices the cells pytest would run against the live inventory, renting nothing (see ``plan.py``).

``gpubench offers [--gpu X] [--provider Y] [--api URL | --sandbox] [--json]`` lists what can
be rented now: price, VRAM, availability confidence, location (see ``offers_cli.py``).

``gpubench migrate [--store PATH]`` brings a manifest an older version wrote up to date; the
commands that only read (report, export, status, browse, plan) open a SQLite manifest read-only
and leave such a file, or one that is not a manifest, as it is, saying so.

``gpubench status [--store LOC] [--run|--phase NAME|last] [--cells] [--json]`` shows per phase
(run) what is done, claimed (by whom, since when) and left (see ``status.py``).

Every command's ``--store PATH|URL`` (default ``$GPUBENCH_STORE``, then ini ``gpubench_store``,
then ``<reports dir>/manifest.db``) is a SQLite file, ``postgresql://...`` or ``git+URL``
(docs/stores.md); ``browse`` serves SQLite only. ``--manifest``, ``$GPUBENCH_MANIFEST`` and ini
``gpubench_manifest`` are its deprecated older names: they still work, with a warning line.

The options a command shares with the plugin (``--store``, ``--api``, ``--reports``, ``--sandbox``,
the filters, ...) come from the plugin's option table without the ``--gpubench-`` prefix, and
resolve as in a run: the flag, then the ``GPUBENCH_*`` variable, then the ini file pytest would
read here (pytest.ini, pyproject.toml, tox.ini, setup.cfg), then the default
(``cli_options.py``).

Exit status: 0 done, 1 the work failed (an upload did not go through), 2 a usage
problem (bad arguments, no manifest, unknown run). Problems are one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import IO

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandProblem, UnknownRun
from .cli_options import add_options, command_settings, pytest_flags, warn_deprecated



def _store_of(args: argparse.Namespace) -> Path | str:
    """The command's store: ``--store`` (or its old name ``--manifest``), else ``GPUBENCH_STORE``,
    else ini ``gpubench_store``, else ``<reports dir>/manifest.db``, resolved as the plugin does."""
    return _location(command_settings(args).store_location)


def _location(given: str) -> Path | str:
    """``--store``/``--manifest`` as given: a URL stays text (a Path would fold its ``//``), a file is a Path."""
    from ..errors import UsageProblem
    from ..store.opening import store_kind

    try:
        return Path(given) if store_kind(given) == "sqlite" else given
    except UsageProblem as exc:
        raise CommandProblem(exc.message) from None


def _open_store(location: Path | str, *, create: bool = False, read_only: bool = False):
    """The store at ``location`` (:func:`_store_of`, or ``export --to``'s); a missing one is a
    ``CommandProblem`` unless ``create``, and so is a file that is not a manifest. ``read_only``
    (the commands that only read): the file is left as it is, and one that is not a manifest, or
    needs ``gpubench migrate``, is refused saying so."""
    from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest, UsageProblem
    from ..store.opening import open_store, redact, store_exists

    where = _location(str(location))
    try:
        exists = store_exists(where)
    except UsageProblem as exc:  # a URL: say what is supported (or unreachable), not that it is missing
        raise CommandProblem(" ".join(filter(None, [exc.message, exc.hint and f"({exc.hint})"]))) from None
    if not create and not exists:
        raise CommandProblem(f"no manifest at {redact(where)} (run pytest with the plugin first, or pass "
                             "--store PATH|URL)")
    try:
        if not read_only and exists and isinstance(where, Path):
            # A writer (upload, cleanup, import, export --to) migrates an older manifest, but never
            # turns another program's SQLite file into one: look before writing.
            try:
                open_store(where, busy_timeout=5, retry_seconds=10, read_only=True).close()
            except MigrationNeeded:
                pass
        return open_store(where, busy_timeout=5, retry_seconds=10, read_only=read_only)
    except (NotAManifest, MigrationNeeded, ManifestTooNew) as exc:
        raise CommandProblem(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file: say so in one line
        raise CommandProblem(f"cannot read the manifest {redact(where)}: {exc}") from None


def _resolve_run(store, run: str | None) -> str | None:
    """``None`` (all runs), ``last`` (the latest), or a run id the store knows."""
    from ..store.opening import resolve_run

    if run is None:
        return None
    try:
        return resolve_run(store, run)
    except UnknownRun as exc:
        raise CommandProblem(exc.message) from None


def _export(args: argparse.Namespace) -> int:
    from ..store.export import export_results

    if args.to:
        return _export_to(args)
    with _open_store(_store_of(args), read_only=True) as store:
        run_id = _resolve_run(store, args.run)
        if args.points:  # every frontier point of the report's curves (report/frontier_view.py)
            from ..report.frontier_view import write_points
            from ..report.gather import build_report

            report = build_report(store, [run_id] if run_id else None)

            def write(out: IO[str]) -> int:
                return write_points(report, args.format, out)
        else:
            def write(out: IO[str]) -> int:
                return export_results(store, run_id, args.format, out)
        if args.output in (None, "-"):
            count = write(sys.stdout)
            target = "stdout"
        else:
            target_path = Path(args.output)
            try:
                target_path.parent.mkdir(parents=True, exist_ok=True)
                with open(target_path, "w", encoding="utf-8", newline="") as out:
                    count = write(out)
            except OSError as exc:
                raise CommandProblem(f"cannot write {target_path}: {exc.strerror or exc}", EXIT_FAILED) from None
            target = str(target_path)
    scope = f"run {run_id}" if run_id else "all runs"
    what = "frontier point" if args.points else "result"
    print(f"exported {count} {what}{'s' * (count != 1)} of {scope} to {target} ({args.format})", file=sys.stderr)
    return EXIT_OK


def _export_to(args: argparse.Namespace) -> int:
    """``gpubench export --to LOCATION``: the store's rows (or one run's) into another store."""
    from ..store.export import copy_store

    with _open_store(_store_of(args), read_only=True) as source:
        run_id = _resolve_run(source, args.run)
        with _open_store(args.to, create=True) as target:
            if target.location == source.location:
                raise CommandProblem(f"--to names the store being exported ({source.location})")
            copied = copy_store(source, target, run_id)
            where = target.location
    scope = f"run {run_id}" if run_id else "all runs"
    print(f"copied {copied['benchmark_manifest']} cell(s), {copied['benchmarks']} result(s) and "
          f"{sum(copied.values())} row(s) in all of {scope} to {where}", file=sys.stderr)
    return EXIT_OK


async def _upload_async(store, run_id: str | None, api: str, token: str | None):
    from ..errors import ApiUnreachable
    from ..store.export import upload_pending
    from ..cloud.shopper_client import ShopperClient

    client = ShopperClient(api, token=token)
    try:
        try:
            await client.wait_ready(attempts=5, interval=1.0)
        except ApiUnreachable as exc:
            raise CommandProblem(
                f"{exc.message}; the results stay pending: run `gpubench upload` again", EXIT_FAILED
            ) from None
        return await upload_pending(store, client, run_id)
    finally:
        await client.aclose()


def _upload(args: argparse.Namespace) -> int:
    from ..errors import redact

    settings = command_settings(args)
    api, token = settings.api, settings.api_token
    with _open_store(_location(settings.store_location)) as store:
        run_id = _resolve_run(store, args.run)
        if run_id is not None:
            # Naming a run asks for its results to be uploaded, whether or not the
            # run itself was started with --gpubench-upload.
            store.request_uploads(run_id)
        pending = store.pending_uploads(run_id)
        if not pending:
            hint = "" if run_id else " (name a run to upload it: gpubench upload --run last)"
            print(f"nothing to upload{hint}", file=sys.stderr)
            return EXIT_OK
        uploaded, failed = asyncio.run(_upload_async(store, run_id, api, token))
    for benchmark_id, error in failed.items():
        print(f"failed {benchmark_id}: {error}", file=sys.stderr)
    print(f"uploaded {len(uploaded)} of {len(pending)} result{'s' * (len(pending) != 1)} to {redact(api)}"
          + (f"; {len(failed)} failed and stay pending: run `gpubench upload` again" if failed else ""),
          file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


async def _cleanup_async(store, settings, dry_run: bool):
    from ..run.cleanup import clean_each, clouds_to_clean
    from ..cloud.registry import build_provider, recorded_settings
    from ..errors import ApiUnreachable
    from ..matrix.cells import DEFAULT_CLOUD
    from ..settings import Settings

    # One pass per cloud the store's runs rented through (installed here), each provider built from
    # the registry and the user's own configuration; a run's record only says which to use.
    providers, notes = {}, []
    try:
        for cloud in clouds_to_clean(store):
            # GPU Shopper's from the API and token alone, as before clouds were recorded.
            own = Settings(api=settings.api, api_token=settings.api_token) if cloud == DEFAULT_CLOUD else settings
            provider = build_provider(cloud, own)
            try:
                await provider.ready(attempts=5)
                providers[cloud] = provider
            except ApiUnreachable as exc:
                await provider.aclose()
                providers[cloud] = None
                notes.append(f"cannot reach the API: {exc.message}" if cloud == DEFAULT_CLOUD
                             else f"cannot reach the {cloud} cloud: {exc.message}")
        report = await clean_each(store, providers, settings_of={c: recorded_settings(c, settings) for c in providers},
                                  api=settings.api, released_by="gpubench cleanup",
                                  reason="its run's process went away", dry_run=dry_run,
                                  progress_dir=settings.progress_dir)
    finally:
        for provider in providers.values():
            if provider is not None:
                await provider.aclose()
    report.notes[:0] = notes
    return report


def _cleanup(args: argparse.Namespace) -> int:
    settings = command_settings(args)
    # The token goes to the API the user configured (--api, GPUBENCH_API_BASE, ini), never to one a
    # store row names (a shared store's rows are anyone's to write): runs recorded against another
    # API are listed, left alone.
    with _open_store(_location(settings.store_location)) as store:
        report = asyncio.run(_cleanup_async(store, settings, args.dry_run))
    for line in report.lines():
        print(line)
    print(f"gpubench cleanup: {report.summary()}")
    return EXIT_FAILED if report.failed else EXIT_OK


def _browse(args: argparse.Namespace) -> int:
    from .browse import serve

    extra = list(args.datasette_args)
    if extra and extra[0] != "--":
        raise CommandProblem(f"unexpected argument {extra[0]!r}: give Datasette's own options after --")
    where = _store_of(args)
    if not isinstance(where, Path):
        from ..store.opening import redact

        raise CommandProblem(f"gpubench browse serves a SQLite manifest (Datasette); {redact(where)} is not one: copy it "
                             "with `gpubench export --to reports/manifest.db` and browse that")
    return serve(where, host=args.host, port=args.port, open_browser=not args.no_open, extra_args=extra[1:])


def _import(args: argparse.Namespace) -> int:
    from .importer import Assumed, expand_paths, import_files
    from ..store.opening import redact, store_exists

    if args.price is not None and args.price < 0:
        raise CommandProblem(f"--price must not be negative, got {args.price}")
    expand_paths(args.paths)  # a path that is not there: before the manifest is created
    where = _store_of(args)
    assumed = Assumed(gpu=args.gpu, provider=args.provider, price_per_hour=args.price, location=args.location)
    # A dry run never creates the manifest; a real import does, like a first pytest run.
    store = None
    if store_exists(where) or not args.dry_run:
        store = _open_store(where, create=True)
    options = [f"--{name}={value}" for name, value in (("gpu", args.gpu), ("provider", args.provider),
                                                        ("price", args.price), ("location", args.location))
               if value is not None]
    try:
        report = import_files(args.paths, store, assumed=assumed, dry_run=args.dry_run,
                              argv=["gpubench", "import", *options, *args.paths])
    finally:
        if store is not None:
            store.close()
    for outcome in report.files:
        print(outcome.line(args.dry_run), file=sys.stdout if outcome.problem is None else sys.stderr)
    print(f"gpubench import: {report.summary()}" + (f" (manifest {redact(where)})" if not args.dry_run else ""))
    return EXIT_FAILED if report.failed else EXIT_OK


def _compare(args: argparse.Namespace, store, targets: tuple[float, ...] = ()) -> tuple[object, object]:
    """``--compare RUN_A RUN_B`` (two runs of ``store``) or ``--compare-stores STORE_A STORE_B`` (every
    run of each): the report of the compared runs (the one store's two; store B's for two stores)
    and the :class:`~pytest_gpubench.report.comparison.RunComparison`. Nothing in common is a usage
    problem that says what each side has."""
    from ..report.comparison import compare_sides
    from ..report.gather import build_report

    if args.compare_stores:
        with _open_store(args.compare_stores[0], read_only=True) as store_a, \
                _open_store(args.compare_stores[1], read_only=True) as store_b:
            for side in (store_a, store_b):
                if not side.run_ids():
                    raise CommandProblem(f"the manifest {side.location} has no runs yet: nothing to compare")
            report_a, report_b = build_report(store_a), build_report(store_b, targets=targets)
            comparison = compare_sides(store_a, report_a.results, store_b, report_b.results,
                                       label_a=f"store {store_a.location}", label_b=f"store {store_b.location}")
            report = report_b
    else:
        run_a, run_b = (_resolve_run(store, run) for run in args.compare)
        if run_a == run_b:
            raise CommandProblem(f"--compare names run {run_a} twice: give two different runs (gpubench status "
                                 "lists them)")
        report_a, report_b = build_report(store, [run_a]), build_report(store, [run_b])
        comparison = compare_sides(store, report_a.results, store, report_b.results,
                                   label_a=f"run {run_a}", label_b=f"run {run_b}")
        report = build_report(store, [run_b, run_a], targets=targets)
    if not comparison.cells:
        raise CommandProblem(comparison.nothing_in_common())
    return report, comparison


def _report(args: argparse.Namespace) -> int:
    from ..report.frontier_view import NO_PNG, write_pngs
    from ..report.gather import COMPARISON_NAME, build_report
    from ..report.gather import write_reports
    from ..report.comparison import comparison_text

    if args.compare and args.compare_stores:
        raise CommandProblem("give --compare RUN_A RUN_B or --compare-stores STORE_A STORE_B, not both")
    if (args.compare or args.compare_stores) and args.run:
        raise CommandProblem("--run does not go with --compare/--compare-stores: they name what is compared")
    if args.output_dir:  # the older name of --reports: given, it wins, as --reports would
        print("gpubench report: warning: --output-dir is deprecated: give the same value to --reports",
              file=sys.stderr)
        args.reports = args.reports or args.output_dir
    settings = command_settings(args)
    directory = settings.reports
    comparison = None
    if args.compare_stores:
        report, comparison = _compare(args, None, settings.target_interactivity)
    else:
        with _open_store(_location(settings.store_location), read_only=True) as store:
            if not store.run_ids():
                raise CommandProblem(f"the manifest {store.location} has no runs yet: nothing to report")
            if args.compare:
                report, comparison = _compare(args, store, settings.target_interactivity)
            else:
                runs = list(dict.fromkeys(_resolve_run(store, run) for run in args.run or []))
                report = build_report(store, runs or None, targets=settings.target_interactivity)
    try:
        markdown, html = write_reports(report, directory, comparison)
        pngs = write_pngs(report, directory)
    except OSError as exc:
        raise CommandProblem(f"cannot write the report to {directory}: {exc.strerror or exc}", EXIT_FAILED) from None
    if comparison is not None:
        print(comparison_text(comparison))
        print(f"gpubench report: compared {len(comparison.cells)} cell(s); wrote {markdown}, {html} and "
              f"{directory / COMPARISON_NAME}")
    else:
        print(f"gpubench report: {report.describe()}; wrote {markdown} and {html}")
    if pngs is None:
        if report.frontiers:
            print(f"gpubench report: {NO_PNG}")
    elif pngs:
        print(f"gpubench report: wrote {len(pngs)} frontier PNG{'s' * (len(pngs) != 1)} in {directory}")
    return EXIT_OK


def _migrate(args: argparse.Namespace) -> int:
    """``gpubench migrate``: bring a manifest an older pytest-gpubench wrote up to date, in place (what
    every run's first write does anyway); a file that is not a manifest is refused, unchanged."""
    from ..errors import ManifestTooNew, MigrationNeeded, NotAManifest
    from ..store.schema import SCHEMA_VERSION
    from ..store.schema import missing_schema
    from ..store.opening import open_store, store_kind

    where = _store_of(args)
    if store_kind(where) != "sqlite":  # a server store migrates its own schema whenever it is opened
        with _open_store(where) as store:
            print(f"gpubench migrate: {store.location} is up to date")
        return EXIT_OK
    if not Path(where).is_file():
        raise CommandProblem(f"no manifest at {where} (pass --store PATH)")
    try:
        with open_store(where, read_only=True, busy_timeout=5, retry_seconds=10):
            print(f"gpubench migrate: {where} is up to date (schema version {SCHEMA_VERSION}); nothing changed")
            return EXIT_OK
    except MigrationNeeded:
        pass
    except (NotAManifest, ManifestTooNew) as exc:  # only a manifest that needs it is migrated
        raise CommandProblem(str(exc)) from None
    with _open_store(where) as store:  # opening for writing migrates (schema.create_schema), in one transaction
        left = missing_schema(store.manifest.db)
    if left:
        raise CommandProblem(f"{where} could not be brought up to date: {'; '.join(left)}", EXIT_FAILED)
    print(f"gpubench migrate: {where} brought up to date (schema version {SCHEMA_VERSION})")
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    """The plan's options go to pytest's collection as the plugin's own flags (``--split-cost`` as
    ``--gpubench-split-cost``): the plugin resolves them, with the environment and the ini file."""
    from .plan import make_plan, render

    warn_deprecated(args)
    plan = make_plan(args.paths, keyword=args.keyword, workers=args.workers, options=pytest_flags(args))
    print(plan.model_dump_json(indent=2) if args.json else "\n".join(render(plan)))
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from .status import show_status

    with _open_store(_store_of(args), read_only=True) as store:
        return show_status(store, _resolve_run(store, args.run), cells=args.cells, as_json=args.json,
                           out=sys.stdout)


def _offers(args: argparse.Namespace) -> int:
    from .offers import list_offers

    if args.api and args.sandbox:
        raise CommandProblem("give --api URL or --sandbox, not both", 2)
    settings = command_settings(args)
    # The sandbox of GPUBENCH_SANDBOX or the ini, unless --api names another API.
    sandbox = settings.sandbox and not args.api
    print(list_offers(settings, sandbox=sandbox, as_json_text=args.json, cloud=args.cloud))
    return EXIT_OK


def _workers(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of workers, 1 or more; got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubench",
        description="pytest-gpubench tools. Benchmarks themselves run with pytest: pytest matrix/ --gpubench-sandbox",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("sandbox", help="serve the emulated GPU Shopper cloud (see `gpubench sandbox --help`)",
                        add_help=False)

    export = commands.add_parser("export", help="write stored results as JSON or CSV",
                                 description="Write stored results: JSON (a list of GPU Shopper BenchmarkResult "
                                             "objects) or CSV (one flattened row per result).")
    export.add_argument("--format", choices=("json", "csv"), default="json", help="output format (default json)")
    export.add_argument("--points", action="store_true",
                        help="write every frontier point instead (one row per load of each GPU / provider / runtime "
                             "of each model and workload, the figures of docs/report.md's Frontiers)")
    export.add_argument("--run", metavar="RUN|last", help="only this run (default: every run)")
    add_options(export, "store")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    export.add_argument("--to", metavar="PATH|URL",
                        help="copy the stored rows (every table; --run: one run's) into this store instead, "
                             "SQLite <-> PostgreSQL; copying again duplicates nothing")
    export.set_defaults(handler=_export)

    upload = commands.add_parser("upload", help="POST results to GPU Shopper /api/v1/benchmarks",
                                 description="POST results to GPU Shopper's /api/v1/benchmarks. Without --run, "
                                             "retries every upload asked for (pytest --gpubench-upload) that has "
                                             "not gone through; with --run, uploads that run's results not yet "
                                             "uploaded. Token: $GPUBENCH_API_TOKEN.")
    upload.add_argument("--run", metavar="RUN|last", help="upload this run's results (default: retry pending ones)")
    add_options(upload, "store")
    add_options(upload, "api")
    upload.set_defaults(handler=_upload)

    cleanup = commands.add_parser(
        "cleanup", help="release GPU sessions that dead runs of this manifest left running",
        description="Release the GPU sessions this manifest's runs own (a session id it recorded, or a "
                    "consumer_id gpubench-<its run id>-...) that are still active although their run's "
                    "process is gone (killed, crashed, timed out): done, then DELETE if still active. "
                    "Runs still going on, and sessions it does not own, are never touched. Every "
                    "release is recorded in the manifest. Token: $GPUBENCH_API_TOKEN.")
    add_options(cleanup, "store", "api", "reports", notes={
        "api": "the API to release through; runs recorded against another API are listed and left alone",
        "reports": "its progress files get a line per release"})
    cleanup.add_argument("--dry-run", action="store_true", help="say what would be released; change nothing")
    cleanup.set_defaults(handler=_cleanup)

    report = commands.add_parser(
        "report", help="write BENCHMARK_REPORT.md and index.html from the manifest",
        description="Write BENCHMARK_REPORT.md and index.html (one self-contained page with charts and sortable "
                    "tables): headline findings, tokens/s and $/M tokens leaderboards, a table per model, "
                    "provider head-to-head, failures by stage and spend. Several runs of one cell: its latest "
                    "successful result is shown. See docs/report.md.")
    report.add_argument("--run", action="append", metavar="RUN|last",
                        help="only this run; repeat for several (default: every run)")
    add_options(report, "store")
    add_options(report, "reports", notes={"reports": "the two files (and the frontier PNGs) are written there"})
    add_options(report, "target_interactivity")
    report.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                        help="compare two runs of the store (run ids or last): the same cells side by side with "
                             "deltas B - A and whether each is beyond the runs' own spread; also written to "
                             "comparison.json and as the reports' Comparison section")
    report.add_argument("--compare-stores", nargs=2, metavar=("STORE_A", "STORE_B"),
                        help="the same comparison between two stores (SQLite paths or URLs), each store's latest "
                             "result of every cell")
    report.add_argument("--output-dir", metavar="DIR", help="deprecated: the older name of --reports")
    report.set_defaults(handler=_report)

    migrate = commands.add_parser(
        "migrate", help="bring a manifest an older pytest-gpubench wrote up to date, in place",
        description="The read-only commands (report, export, status, browse, plan) leave a manifest written by "
                    "an older pytest-gpubench as it is and say it needs this: its columns are renamed and "
                    "filled in and the tables and columns added since are created, in one transaction (a "
                    "pytest run does the same when it opens the file). A file that is not a manifest is "
                    "refused, unchanged. Keep a copy if older versions must still read it.")
    add_options(migrate, "store")
    migrate.set_defaults(handler=_migrate)

    browse = commands.add_parser(
        "browse", help="explore the manifest in Datasette (pip install 'pytest-gpubench[browse]')",
        description="Serve the manifest read-only with Datasette, every table and column described, with "
                    "facets and canned queries (leaderboard, failures by stage, spend per run). Safe while a "
                    "run writes to it. Datasette's own options go after --, e.g. -- --setting "
                    "sql_time_limit_ms 5000.")
    add_options(browse, "store")
    browse.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                        "machine only)")
    browse.add_argument("--port", type=int, default=8001, metavar="N", help="port (default 8001; 0 picks a free one)")
    browse.add_argument("--no-open", action="store_true", help="do not open a web browser")
    browse.add_argument("datasette_args", nargs=argparse.REMAINDER, metavar="-- DATASETTE_ARGS",
                        help="options for `datasette serve`")
    browse.set_defaults(handler=_browse)

    importing = commands.add_parser(
        "import", help="bring existing result files into the manifest (each result once)",
        description="Import result files into the manifest, so export, report and --gpubench-compare see "
                    "them: seed-000 result JSON, seed-001 checkpoints (unfinished ones as partial), GPU Shopper "
                    "BenchmarkResult JSON (one, a list, `gpubench export --format json` output, the API's "
                    "answer). The format is told from the content. A directory imports its *.json files. A "
                    "result already in the manifest (same id, or same content) is skipped. --gpu, --provider, "
                    "--price and --location fill in what a file does not say. See docs/import.md.")
    importing.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="JSON files, or directories of them")
    add_options(importing, "store", notes={"store": "created if missing"})
    importing.add_argument("--dry-run", action="store_true", help="read and check everything; write nothing")
    importing.add_argument("--gpu", metavar="NAME", help="GPU of results whose file names none, e.g. 'RTX 4090'")
    importing.add_argument("--provider", metavar="NAME", help="provider of results whose file names none, e.g. vastai")
    importing.add_argument("--price", type=float, metavar="USD_PER_HOUR",
                           help="price per hour of results whose file states none (gives $/M tokens)")
    importing.add_argument("--location", metavar="WHERE", help="location of results whose file names none")
    importing.set_defaults(handler=_import)

    plan = commands.add_parser(
        "plan", help="what a run would rent, for how long and at what cost (rents nothing)",
        description="For each cell pytest would run (the same paths, -k and filters), the offer it would take "
                    "from the live inventory, its price, expected time and cost; sessions to create (reuse "
                    "groups pay setup once), totals and wall time. Cells without an eligible offer are flagged "
                    "with the reason. Only GET /health and GET /api/v1/inventory are called. See docs/plan.md.")
    plan.add_argument("paths", nargs="+", metavar="PATH", help="matrix files or directories, as for pytest")
    plan.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest's -k expression")
    plan.add_argument("-n", dest="workers", type=_workers, metavar="N",
                      help="also estimate the wall time with pytest -n N, reuse groups split over more "
                           "sessions as such a run would split them")
    add_options(plan, "gpu", "provider", "model", "api", "sandbox", "store", "sessions_per_group", "split_cost",
                notes={"sandbox": "here: started for the listing, stopped after",
                       "store": "here: its finished cells give the stage times"})
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(handler=_plan)

    offers = commands.add_parser(
        "offers", help="what can be rented now: GPUs, prices, VRAM, confidence, location",
        description="List the offers GPU Shopper's inventory has now (GET /api/v1/inventory; rents nothing), "
                    "cheapest first per GPU: price per hour, VRAM, availability confidence (offers at or below "
                    "0.5 are not rented unless the matrix lowers the bar), location and offer id. --gpu and "
                    "--provider match as pytest's filters do (RTX4090 is 'RTX 4090').")
    add_options(offers, "gpu", "provider", "api", "sandbox",
                notes={"gpu": "here: list only its offers", "provider": "here: list only its offers",
                       "sandbox": "here: list its offers (started for the listing, stopped after)"})
    offers.add_argument("--json", action="store_true", help="print the offers as JSON")
    offers.add_argument("--cloud", default="shopper", metavar="NAME",
                        help="the cloud whose offers to list, as a matrix's `cloud:` names it (default: shopper, "
                             "GPU Shopper at --api; a third-party cloud: its entry point's name)")
    offers.set_defaults(handler=_offers)

    from .status import add_parser as add_status_parser

    add_options(add_status_parser(commands, _status), "store")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["sandbox", "hosts"]:  # machines for `cloud: hosts`, no GPU Shopper API
        from ..sandbox.server import hosts_main

        return hosts_main(args[2:])
    if args[:2] == ["sandbox", "local"]:  # stand-in GPUs and Ollama for `cloud: local`
        from ..sandbox.server import local_main

        return local_main(args[2:])
    if args[:1] == ["sandbox"]:
        from ..sandbox.server import main as sandbox_main

        return sandbox_main(args[1:])
    parser = _parser()
    parsed = parser.parse_args(args)
    if parsed.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return parsed.handler(parsed)
    except CommandProblem as exc:
        print(f"gpubench {parsed.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"gpubench {parsed.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
