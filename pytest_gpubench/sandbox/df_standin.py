"""The ``df`` program of a sandbox instance, and the emulated disk it shows in GNU df's formats.

An instance has one filesystem (``overlay`` on ``/``, as in a Vast.ai container)
whose size and use come from the instance file and the Ollama stand-in's state (the
emulated disk, below); every existing path is on it. What the host's own disks hold never
shows. Supported: ``df [-P] [-k] [-h|-H] [-T] [-a] [-l] [PATH...]`` and their long
forms. Output follows GNU coreutils: a header, then one row per PATH (one row
without PATH), columns padded to their widest cell (the first at least 14 wide),
block counts in KiB rounded up, ``Use%`` (``Capacity`` with ``-P``) rounded up. A
PATH that does not exist is ``df: PATH: No such file or directory`` on stderr and
exit status 1, the other rows still printed.

Run as ``python -m pytest_gpubench.sandbox.df_standin ARGS`` (the instance's ``df``
wrapper script does that).

**The emulated disk**: how big it is, what fills it, and how a full one fails. The disk is the instance file's ``disk`` (the session's ``disk_gb`` or the
provider's default). Used space is the system (image and OS) plus every pulled
model plus the blobs of pulls not finished; ``df`` on the instance reports it and
the Ollama stand-in's pull stops when it is full, with Ollama's own error.

Nothing here touches the host's real disk: sizes are bookkeeping in the state
directory, shared by the processes of one instance.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .instance_spec import DiskSpec, InstanceSpec, load_instance_spec
from .standin_answer import Answer
from .standin_state import StateStore

# ------------------------------------------------------------ the emulated disk

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


# ------------------------------------------------------------ the program

MOUNT_POINT = "/"
_SHORT = {"P": "portability", "k": "kilo", "h": "human", "H": "si", "T": "type", "a": "all", "l": "local"}
_LONG = {
    "--portability": "portability",
    "--human-readable": "human",
    "--si": "si",
    "--print-type": "type",
    "--all": "all",
    "--local": "local",
}
_TRY = "Try 'df --help' for more information."
USAGE = """Usage: df [OPTION]... [FILE]...
Show information about the file system on which each FILE resides,
or all file systems by default.

  -a, --all             include pseudo, duplicate, inaccessible file systems
  -h, --human-readable  print sizes in powers of 1024 (e.g., 1023M)
  -H, --si              print sizes in powers of 1000 (e.g., 1.1G)
  -k                    like --block-size=1K
  -l, --local           limit listing to local file systems
  -P, --portability     use the POSIX output format
  -T, --print-type      print file system type
      --help        display this help and exit
      --version     output version information and exit

(gpubench sandbox: the instance's emulated disk)
"""


class UsageError(Exception):
    """A bad command line: the message, then the ``Try`` line, exit status 1."""


@dataclass
class Options:
    posix: bool = False
    human_base: int | None = None  # 1024 for -h, 1000 for -H, None for KiB blocks
    show_type: bool = False
    paths: tuple[str, ...] = ()


def parse_args(argv: Sequence[str]) -> Options | str:
    """The options, or ``"help"``/``"version"``; raises :class:`UsageError`."""
    options = Options()
    paths: list[str] = []
    only_paths = False
    for arg in argv:
        if only_paths or arg == "-" or not arg.startswith("-"):
            paths.append(arg)
        elif arg == "--":
            only_paths = True
        elif arg in ("--help", "--version"):
            return arg[2:]
        elif arg.startswith("--"):
            if arg not in _LONG:
                raise UsageError(f"unrecognized option '{arg}'")
            _apply(options, _LONG[arg])
        else:
            for letter in arg[1:]:
                if letter not in _SHORT:
                    raise UsageError(f"invalid option -- '{letter}'")
                _apply(options, _SHORT[letter])
    options.paths = tuple(paths)
    return options


def _apply(options: Options, name: str) -> None:
    # The last of -h, -H and -k wins, as in GNU df.
    if name == "portability":
        options.posix = True
    elif name == "kilo":
        options.human_base = None
    elif name == "human":
        options.human_base = 1024
    elif name == "si":
        options.human_base = 1000
    elif name == "type":
        options.show_type = True


def human_size(n_bytes: int, base: int) -> str:
    """GNU's ``-h``/``-H`` form: rounded up, one decimal below 10 (``4.2G``, ``15G``)."""
    suffixes = "KMGTPE" if base == 1024 else "kMGTPE"
    if n_bytes < base:
        return str(n_bytes)
    value, unit = Fraction(n_bytes), -1
    while value >= base and unit < len(suffixes) - 1:
        value /= base
        unit += 1
    if value < 10:
        tenths = math.ceil(value * 10)
        if tenths < 100:
            return f"{tenths // 10}.{tenths % 10}{suffixes[unit]}"
        value = Fraction(10)
    whole = math.ceil(value)
    if whole >= base and unit < len(suffixes) - 1:
        return f"1.0{suffixes[unit + 1]}"
    return f"{whole}{suffixes[unit]}"


def table(usage: DiskUsage, filesystem: str, options: Options, rows: int) -> str:
    """The header and ``rows`` identical rows for the one filesystem, GNU-aligned."""
    total_k = math.ceil(usage.total / 1024)
    used_k = min(math.ceil(usage.used / 1024), total_k)
    avail_k = total_k - used_k
    percent = "-" if total_k == 0 else f"{math.ceil(Fraction(used_k * 100, total_k))}%"
    if options.human_base:
        sizes = [human_size(k * 1024, options.human_base) for k in (total_k, used_k, avail_k)]
        headers = ["Size", "Used", "Avail"]
    else:
        sizes = [str(k) for k in (total_k, used_k, avail_k)]
        headers = ["1024-blocks" if options.posix else "1K-blocks", "Used", "Available"]
    header = ["Filesystem", *(["Type"] if options.show_type else []), *headers,
              "Capacity" if options.posix else "Use%", "Mounted on"]
    row = [filesystem, *([filesystem] if options.show_type else []), *sizes, percent, MOUNT_POINT]
    # GNU's minimum widths: Filesystem 14, Type 4, numbers 5, Use% 4; "Mounted on" unpadded.
    minimum = [14, *([4] if options.show_type else []), 5, 5, 5, 4, 0]
    left = {0, 1} if options.show_type else {0}
    widths = [max(m, len(h), len(r)) for m, h, r in zip(minimum, header, row, strict=True)]
    lines = []
    for cells in [header] + [row] * rows:
        padded = [
            cell if i == len(cells) - 1 else cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        lines.append(" ".join(padded))
    return "\n".join(lines) + "\n"


def one_shot(argv: Sequence[str], environ: Mapping[str, str], cwd: str | None = None) -> Answer:
    """The whole answer to ``df argv``; relative PATHs are looked up in ``cwd``
    (None: this process's working directory)."""
    try:
        options = parse_args(argv)
    except UsageError as exc:
        return Answer(stderr=f"df: {exc}\n{_TRY}\n", status=1)
    if options == "help":
        return Answer(stdout=USAGE)
    if options == "version":
        return Answer(stdout="df (GNU coreutils) 9.1 (gpubench sandbox)\n")
    assert isinstance(options, Options)
    try:
        spec = load_instance_spec(environ)
    except RuntimeError as exc:
        return Answer(stderr=f"df: {exc}\n", status=1)
    status, rows, errors = 0, 0, []
    for path in options.paths or (MOUNT_POINT,):
        if os.path.exists(os.path.join(cwd, path) if cwd is not None and path else path):
            rows += 1
        else:
            errors.append(f"df: {path}: No such file or directory\n")
            status = 1
    out = table(read_disk_usage(spec), spec.disk.filesystem, options, rows) if rows else ""
    return Answer(stdout=out, stderr="".join(errors), status=status)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the emulated disk like ``df``; returns the exit status."""
    return one_shot(list(sys.argv[1:] if argv is None else argv), os.environ).emit()


if __name__ == "__main__":
    sys.exit(main())
