"""The ``gpubench`` command.

``gpubench sandbox`` serves the emulated GPU Shopper cloud standalone, for
other clients (curl, the GPU Shopper CLI, CI pipelines) to rent from for free.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="gpubench",
        description="pytest-gpubench tools. Benchmarks themselves run with pytest: pytest matrix/ --gpubench-sandbox",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("sandbox", help="serve the emulated GPU Shopper cloud (see `gpubench sandbox --help`)",
                        add_help=False)
    if args[:1] == ["sandbox"]:
        from .sandbox.server import main as sandbox_main

        return sandbox_main(args[1:])
    parsed = parser.parse_args(args)
    if parsed.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
