"""The ``gpubench`` command.

``gpubench sandbox`` serves the emulated GPU Shopper cloud standalone, for
other clients (curl, the GPU Shopper CLI, CI pipelines) to rent from for free.

``gpubench cleanup [--manifest PATH] [--api URL] [--dry-run]`` releases the GPU
sessions that dead runs of the manifest left running (see ``cleanup.py``).

``gpubench export --format json|csv [--run RUN|last] [--manifest PATH] [-o FILE]``
writes stored results; ``gpubench upload [--run RUN|last] [--manifest PATH] [--api URL]``
POSTs results to GPU Shopper's ``/api/v1/benchmarks``.

Exit status: 0 done, 1 the work failed (an upload did not go through), 2 a usage
problem (bad arguments, no manifest, unknown run). Problems are one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from .settings import DEFAULT_API

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A problem to report in one line, with the exit status to end with."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


def default_manifest() -> Path:
    """``GPUBENCH_MANIFEST``, else ``<GPUBENCH_REPORTS or reports>/manifest.db``, as the plugin does."""
    if os.environ.get("GPUBENCH_MANIFEST"):
        return Path(os.environ["GPUBENCH_MANIFEST"])
    return Path(os.environ.get("GPUBENCH_REPORTS") or "reports") / "manifest.db"


def _open_manifest(path: str | None):
    from .manifest import Manifest

    where = Path(path) if path else default_manifest()
    if not where.is_file():
        raise CommandError(f"no manifest at {where} (run pytest with the plugin first, or pass --manifest PATH)")
    try:
        return Manifest(where, busy_timeout=5, retry_seconds=10)
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file: say so in one line
        raise CommandError(f"cannot read the manifest {where}: {exc}") from None


def _resolve_run(manifest, run: str | None) -> str | None:
    """``None`` (all runs), ``last`` (the latest), or a run id the manifest knows."""
    if run is None:
        return None
    known = manifest.run_ids()
    if run == "last":
        if not known:
            raise CommandError(f"the manifest {manifest.path} has no runs yet")
        return known[0]
    if run not in known:
        recent = ", ".join(known[:3]) or "none"
        raise CommandError(f"no run {run!r} in the manifest {manifest.path} (most recent: {recent})")
    return run


def _export(args: argparse.Namespace) -> int:
    from .export import export_results

    with _open_manifest(args.manifest) as manifest:
        run_id = _resolve_run(manifest, args.run)
        if args.output in (None, "-"):
            count = export_results(manifest, run_id, args.format, sys.stdout)
            target = "stdout"
        else:
            target_path = Path(args.output)
            try:
                target_path.parent.mkdir(parents=True, exist_ok=True)
                with open(target_path, "w", encoding="utf-8", newline="") as out:
                    count = export_results(manifest, run_id, args.format, out)
            except OSError as exc:
                raise CommandError(f"cannot write {target_path}: {exc.strerror or exc}", EXIT_FAILED) from None
            target = str(target_path)
    scope = f"run {run_id}" if run_id else "all runs"
    print(f"exported {count} result{'s' * (count != 1)} of {scope} to {target} ({args.format})", file=sys.stderr)
    return EXIT_OK


async def _upload_async(manifest, run_id: str | None, api: str, token: str | None):
    from .errors import ApiUnreachable
    from .export import upload_pending
    from .shopper import ShopperClient

    client = ShopperClient(api, token=token)
    try:
        try:
            await client.wait_ready(attempts=5, interval=1.0)
        except ApiUnreachable as exc:
            raise CommandError(
                f"{exc.message}; the results stay pending: run `gpubench upload` again", EXIT_FAILED
            ) from None
        return await upload_pending(manifest, client, run_id)
    finally:
        await client.aclose()


def _upload(args: argparse.Namespace) -> int:
    api = args.api or os.environ.get("GPUBENCH_API_BASE") or DEFAULT_API
    token = os.environ.get("GPUBENCH_API_TOKEN") or None
    with _open_manifest(args.manifest) as manifest:
        run_id = _resolve_run(manifest, args.run)
        if run_id is not None:
            # Naming a run asks for its results to be uploaded, whether or not the
            # run itself was started with --gpubench-upload.
            manifest.request_uploads(run_id)
        pending = manifest.pending_uploads(run_id)
        if not pending:
            hint = "" if run_id else " (name a run to upload it: gpubench upload --run last)"
            print(f"nothing to upload{hint}", file=sys.stderr)
            return EXIT_OK
        uploaded, failed = asyncio.run(_upload_async(manifest, run_id, api, token))
    for benchmark_id, error in failed.items():
        print(f"failed {benchmark_id}: {error}", file=sys.stderr)
    print(f"uploaded {len(uploaded)} of {len(pending)} result{'s' * (len(pending) != 1)} to {api}"
          + (f"; {len(failed)} failed and stay pending: run `gpubench upload` again" if failed else ""),
          file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


async def _cleanup_async(manifest, apis: list[str], token: str | None, dry_run: bool):
    from .cleanup import CleanupReport, clean
    from .errors import ApiUnreachable
    from .shopper import ShopperClient

    report = CleanupReport(dry_run=dry_run)
    for api in apis:
        client = ShopperClient(api, token=token)
        try:
            try:
                await client.wait_ready(attempts=5, interval=1.0)
                reachable = client
            except ApiUnreachable as exc:
                reachable = None
                report.notes.append(f"cannot reach the API: {exc.message}")
            report.merge(await clean(manifest, reachable, api=api, released_by="gpubench cleanup",
                                     reason="its run's process went away", dry_run=dry_run))
        finally:
            await client.aclose()
    return report


def _cleanup(args: argparse.Namespace) -> int:
    from .cleanup import apis_to_visit

    token = os.environ.get("GPUBENCH_API_TOKEN") or None
    with _open_manifest(args.manifest) as manifest:
        default = os.environ.get("GPUBENCH_API_BASE") or DEFAULT_API
        apis = [args.api] if args.api else apis_to_visit(manifest, default)
        report = asyncio.run(_cleanup_async(manifest, apis, token, args.dry_run))
    for line in report.lines():
        print(line)
    print(f"gpubench cleanup: {report.summary()}")
    return EXIT_FAILED if report.failed else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubench",
        description="pytest-gpubench tools. Benchmarks themselves run with pytest: pytest matrix/ --gpubench-sandbox",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("sandbox", help="serve the emulated GPU Shopper cloud (see `gpubench sandbox --help`)",
                        add_help=False)
    manifest_help = "the SQLite manifest (default $GPUBENCH_MANIFEST or reports/manifest.db)"

    export = commands.add_parser("export", help="write stored results as JSON or CSV",
                                 description="Write stored results: JSON (a list of GPU Shopper BenchmarkResult "
                                             "objects) or CSV (one flattened row per result).")
    export.add_argument("--format", choices=("json", "csv"), default="json", help="output format (default json)")
    export.add_argument("--run", metavar="RUN|last", help="only this run (default: every run)")
    export.add_argument("--manifest", metavar="PATH", help=manifest_help)
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(handler=_export)

    upload = commands.add_parser("upload", help="POST results to GPU Shopper /api/v1/benchmarks",
                                 description="POST results to GPU Shopper's /api/v1/benchmarks. Without --run, "
                                             "retries every upload asked for (pytest --gpubench-upload) that has "
                                             "not gone through; with --run, uploads that run's results not yet "
                                             "uploaded. Token: $GPUBENCH_API_TOKEN.")
    upload.add_argument("--run", metavar="RUN|last", help="upload this run's results (default: retry pending ones)")
    upload.add_argument("--manifest", metavar="PATH", help=manifest_help)
    upload.add_argument("--api", metavar="URL", help=f"API base URL (default $GPUBENCH_API_BASE or {DEFAULT_API})")
    upload.set_defaults(handler=_upload)

    cleanup = commands.add_parser(
        "cleanup", help="release GPU sessions that dead runs of this manifest left running",
        description="Release the GPU sessions this manifest's runs own (a session id it recorded, or a "
                    "consumer_id gpubench-<its run id>-...) that are still active although their run's "
                    "process is gone (killed, crashed, timed out): done, then DELETE if still active. "
                    "Runs still going on, and sessions it does not own, are never touched. Every "
                    "release is recorded in the manifest. Token: $GPUBENCH_API_TOKEN.")
    cleanup.add_argument("--manifest", metavar="PATH", help=manifest_help)
    cleanup.add_argument("--api", metavar="URL",
                         help="only this API (default: the API each run used, else $GPUBENCH_API_BASE or "
                              f"{DEFAULT_API})")
    cleanup.add_argument("--dry-run", action="store_true", help="say what would be released; change nothing")
    cleanup.set_defaults(handler=_cleanup)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sandbox"]:
        from .sandbox.server import main as sandbox_main

        return sandbox_main(args[1:])
    parser = _parser()
    parsed = parser.parse_args(args)
    if parsed.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return parsed.handler(parsed)
    except CommandError as exc:
        print(f"gpubench {parsed.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"gpubench {parsed.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
