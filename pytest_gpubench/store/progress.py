"""The seed-000 progress file: one line per event, written as a cell goes along.

::

    [2026-02-07T10:00:05Z] STATUS: INVENTORY_QUERY offers_found=12 selected_offer_id=vastai-12345 price=2.50
    [2026-02-07T10:08:00Z] PROGRESS: requests=5 tokens=1250 output_tokens_per_second=41.2 errors=0
    [2026-02-07T10:09:30Z] ERROR: stage=model_pull message="pull failed: no space left"
    [2026-02-07T10:13:06Z] RESULTS: {"model":"llama3:70b","avg_tokens_per_second":41.6}

Seed 000 defines this format, and seed tooling may parse it, so the progress file keeps the seed's
tokens where the seed names them, for every runtime: the stage that installs and starts the runtime
is ``runtime_setup`` everywhere else but ``ERROR: stage=ollama_install`` here (errors.SEED_STAGE_NAMES),
and its end is ``STATUS: OLLAMA_INSTALLED ... runtime=NAME``. Lines the seed does not define
(``SYSTEM_INFO``, ``HEAVY_IMAGE``, ``RUNTIME_RESTART``, ...) use today's names. The reader maps the
seed's stage names back (:attr:`ProgressLine.stage`).

Formatting rules (the reader, :func:`read_progress`, undoes them):

* Timestamps are UTC, to the second, with a ``Z``: the seed shows no offset, which
  leaves a reader guessing; UTC matches the manifest and orders lines from machines
  and xdist workers in different zones.
* Values: ``int`` as is; ``bool`` as ``true`` / ``false``; ``None`` as nothing
  (``key=``); money floats (a key with a ``price``, ``cost`` or ``usd`` word, such as
  ``price``, ``cost_usd``, ``price_per_hour``) with 2 decimals (``price=2.50``);
  other floats with 1 decimal (``output_tokens_per_second=41.6``) unless below 1 in size, where they
  keep 3 significant digits (``error_rate=0.0526``); enums as their value. (A cell's
  last line, ``COMPLETED``/``FAILED``..., gives its ``cost`` as text with 4 decimals,
  the figure the terminal summary shows: a short cell costs well under a cent.)
* Text without spaces, quotes or backslashes is written bare; anything else, and
  the empty string, in double quotes with ``\\`` and ``"`` escaped by a backslash.
  Newlines and other control characters become spaces, so every record is one line.
  ``ERROR:`` messages are always quoted, as in the seed.
* ``RESULTS:`` is compact, ASCII-only JSON on one line; NaN and infinities become null.
* Any value containing ``-----BEGIN`` or ``PRIVATE KEY`` is written as
  ``[REDACTED]``: the SSH key must never reach this file, even by mistake.

Where a cell's file is: ``<progress folder>/<run id>/<record key as a file name>.log``
(:func:`cell_progress_path`). A store row's ``progress_file`` says where it was written, for
people; the plugin never follows it (a shared store's rows are anyone's to write): cleanup
finds a cell's file from the configured folder and the cell's ids (:func:`existing_progress_file`).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict

from ..errors import Stage, current_stage_name, seed_stage_name
from ..ids import InvalidId, path_under
from ..errors import one_line as _one_line
from .record_keys import file_name

__all__ = ["ProgressLine", "ProgressWriter", "REDACTED", "cell_progress_path", "existing_progress_file",
           "format_value", "read_progress"]

REDACTED = "[REDACTED]"
_SECRET_MARKERS = ("-----BEGIN", "PRIVATE KEY")
_MONEY_KEY = re.compile(r"(?:^|_)(?:price|cost|usd)(?:_|$)", re.IGNORECASE)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_LABEL = re.compile(r"[A-Z][A-Z0-9_]*")
_BARE = re.compile(r'[^\s"\\]+')
_RECORD = re.compile(
    r"^\[(?P<ts>[^\]]+)\] (?P<kind>STATUS|PROGRESS|ERROR|RESULTS):(?: (?P<body>.*))?$"
)

Kind = Literal["STATUS", "PROGRESS", "ERROR", "RESULTS"]


def _is_secret(text: str) -> bool:
    return any(marker in text for marker in _SECRET_MARKERS)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _format_float(key: str, value: float) -> str:
    if _MONEY_KEY.search(key):
        return f"{value:.2f}"
    if value != 0 and abs(value) < 1:
        return f"{value:.3g}"
    return f"{value:.1f}"


def format_value(key: str, value: Any) -> str:
    """The text of ``key=value`` right of the ``=``, by the rules in the module docstring."""
    if value is None:
        return ""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _format_float(key, value)
    text = _one_line(str(value))
    if _is_secret(text):
        return REDACTED
    return text if _BARE.fullmatch(text) else _quote(text)


def _format_fields(fields: Mapping[str, Any]) -> str:
    parts = []
    for key, value in fields.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"progress field name {key!r} is not a plain identifier")
        parts.append(f"{key}={format_value(key, value)}")
    return " ".join(parts)


def _json_safe(value: Any) -> Any:
    """Redact secrets and non-finite floats anywhere in a JSON-able structure."""
    if isinstance(value, str):
        return REDACTED if _is_secret(value) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def cell_progress_path(folder: str | Path, run_id: str, record_key: str) -> Path:
    """``<folder>/<run>/<cell>.log``: the run id must be an id (:mod:`pytest_gpubench.ids`;
    :class:`~pytest_gpubench.ids.InvalidId` otherwise), the record key becomes a file name
    (:func:`~.record_keys.file_name`, which ``.log`` ends): the path never leaves ``folder``."""
    return path_under(folder, run_id, what="run id") / f"{file_name(record_key)}.log"


def existing_progress_file(folder: str | Path | None, run_id: str, record_key: str | None) -> Path | None:
    """The progress file of a cell of another process (cleanup's), to read or append to; None when
    there is none to touch.

    Derived from the configured ``folder`` (resolved) and the cell's ids, never from a path a store
    row names: None when ``folder`` is None, the run id is not an id, the run's folder is missing
    or is a symlink, or the file is a symlink or not a regular file. Write to it with
    ``ProgressWriter(path, follow_symlinks=False)``.
    """
    if folder is None or not record_key:
        return None
    try:
        path = cell_progress_path(Path(folder).resolve(), run_id, record_key)
    except (InvalidId, OSError):
        return None
    run_folder = path.parent
    if run_folder.is_symlink() or not run_folder.is_dir() or path.is_symlink():
        return None
    if path.exists() and not path.is_file():
        return None
    return path


def _append_no_follow(path: str, flags: int) -> int:
    """``open``'s opener for a file that must not be a symlink (its last part)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


class ProgressWriter:
    """Appends seed-000 progress lines to ``path``; safe to share between threads.

    The parent directories are created, the file is opened for appending and every
    line is flushed as it is written, so ``tail -f`` and a crash both see whole
    lines. Every method returns the line it wrote (without the newline).
    ``clock`` (returning a datetime) exists for tests. With ``follow_symlinks=False`` (a file of
    another process, found by :func:`existing_progress_file`) the folder must exist and a symlink
    in the file's place is refused when the file is opened (``OSError``).
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], datetime] = _utc_now,
                 follow_symlinks: bool = True) -> None:
        self.path = Path(path)
        if follow_symlinks:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._opener = None if follow_symlinks else _append_no_follow
        self._clock = clock
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def status(self, label: str | Enum, /, **fields: Any) -> str:
        """``STATUS: LABEL key=value ...``; the label is upper-cased (``INVENTORY_QUERY``)."""
        text = str(label.value if isinstance(label, Enum) else label).upper()
        if not _LABEL.fullmatch(text):
            raise ValueError(f"status label {label!r} must be a word like INVENTORY_QUERY")
        body = _format_fields(fields)
        return self._write("STATUS", f"{text} {body}" if body else text)

    def progress(self, **fields: Any) -> str:
        """``PROGRESS: metric=value ...``."""
        return self._write("PROGRESS", _format_fields(fields))

    def error(self, stage: Stage | str, message: str) -> str:
        """``ERROR: stage=STAGE message="..."``; ``stage`` must be a stage, written as seed 000 names it
        (``Stage.RUNTIME_SETUP`` as ``ollama_install``: see the module docstring)."""
        name = seed_stage_name(stage)
        text = _one_line(str(message))
        if _is_secret(text):
            text = REDACTED
        return self._write("ERROR", f"stage={name} message={_quote(text)}")

    def results(self, obj: BaseModel | Mapping[str, Any]) -> str:
        """``RESULTS: {json}``, compact and on one line, from a pydantic model or a dict."""
        data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
        body = json.dumps(_json_safe(data), separators=(",", ":"), default=str)
        return self._write("RESULTS", body)

    def close(self) -> None:
        """Close the file; a later write opens it again."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, kind: Kind, body: str) -> str:
        stamp = self._clock()
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        stamp = stamp.astimezone(timezone.utc)
        line = f"[{stamp:%Y-%m-%dT%H:%M:%S}Z] {kind}:" + (f" {body}" if body else "")
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8", buffering=1, newline="\n", opener=self._opener)
            # One write per line: with O_APPEND, lines from several writers never interleave.
            self._file.write(line + "\n")
            self._file.flush()
        return line


# ----------------------------------------------------------------------------- reading


class ProgressLine(BaseModel):
    """One parsed line of a progress file.

    ``label`` is the STATUS word; ``fields`` holds the ``key=value`` pairs (values as
    text, ``None`` for ``key=``); ``message`` is an ERROR's message; ``data`` is the
    parsed RESULTS JSON; ``raw`` the line as it was.
    """

    model_config = ConfigDict(frozen=True)

    kind: Kind
    timestamp: datetime
    label: str | None = None
    fields: dict[str, str | None] = {}
    message: str | None = None
    data: Any = None
    raw: str

    @property
    def stage(self) -> str | None:
        """The stage of an ERROR line, by today's name (the seed's ``ollama_install`` is ``runtime_setup``)."""
        name = self.fields.get("stage")
        return current_stage_name(name) if name else name


def _parse_fields(text: str) -> dict[str, str | None]:
    fields: dict[str, str | None] = {}
    i, end = 0, len(text)
    while i < end:
        if text[i] == " ":
            i += 1
            continue
        match = _KEY.match(text, i)
        if not match or text[match.end() : match.end() + 1] != "=":
            raise ValueError(f"expected key=value at column {i}")
        key, i = match.group(), match.end() + 1
        if i < end and text[i] == '"':
            i += 1
            chars = []
            while True:
                if i >= end:
                    raise ValueError(f"unterminated quoted value for {key}")
                char = text[i]
                if char == "\\" and i + 1 < end:
                    chars.append(text[i + 1])
                    i += 2
                elif char == '"':
                    i += 1
                    break
                else:
                    chars.append(char)
                    i += 1
            if i < end and text[i] != " ":
                raise ValueError(f"text after the quoted value of {key}")
            fields[key] = "".join(chars)
        else:
            stop = text.find(" ", i)
            stop = end if stop < 0 else stop
            fields[key] = text[i:stop] or None
            i = stop
    return fields


def _parse_line(line: str) -> ProgressLine:
    match = _RECORD.match(line)
    if not match:
        raise ValueError("not a progress record")
    stamp = match["ts"]
    timestamp = datetime.fromisoformat(stamp[:-1] + "+00:00" if stamp.endswith("Z") else stamp)
    kind, body = match["kind"], match["body"] or ""
    if kind == "RESULTS":
        try:
            data = json.loads(body)
        except RecursionError:  # nested past the interpreter's limit: as malformed as bad JSON
            raise ValueError("RESULTS JSON nested too deep") from None
        return ProgressLine(kind=kind, timestamp=timestamp, data=data, raw=line)
    label = None
    if kind == "STATUS":
        label, _, body = body.partition(" ")
        if not _LABEL.fullmatch(label):
            raise ValueError(f"bad status label {label!r}")
    fields = _parse_fields(body)
    message = fields.get("message") if kind == "ERROR" else None
    return ProgressLine(
        kind=kind, timestamp=timestamp, label=label, fields=fields, message=message, raw=line
    )


def read_progress(path: str | Path, *, strict: bool = False, follow_symlinks: bool = True) -> list[ProgressLine]:
    """Parse a progress file back into :class:`ProgressLine` records.

    A last line cut short (a writer killed mid-line, a file copied while written) is
    dropped when it does not parse. Other lines that are not progress records (output
    of some other tool mixed in) are skipped, or raise ``ValueError`` with
    ``strict=True``. ``follow_symlinks=False`` refuses a symlink (``OSError``).
    """
    if follow_symlinks:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    else:
        with open(path, encoding="utf-8", errors="replace",
                  opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW)) as handle:
            text = handle.read()
    lines = text.split("\n")
    # split() leaves "" after a final newline; otherwise the last piece is unterminated.
    unterminated = lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(_parse_line(line.rstrip("\r")))
        except ValueError as exc:
            if strict:
                raise ValueError(f"{path}:{number}: {exc}: {line[:120]!r}") from exc
    if unterminated.strip():
        try:
            records.append(_parse_line(unterminated))
        except ValueError:
            pass
    return records
