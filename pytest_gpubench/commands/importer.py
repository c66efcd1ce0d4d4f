"""``gpubench import``: result files into the manifest, each result once.

Files are read by :mod:`.import_formats` (the format is told from the content).
Every result not already in the manifest becomes one ``benchmark_manifest`` row
(``success``, or ``partial`` for an unfinished checkpoint) and one ``benchmarks``
row, in a run of their own (``import-<UTC time>-<random>``) whose ``argv`` and
``matrix_files`` say where they came from; so ``gpubench export``, ``gpubench
report`` and ``--gpubench-compare`` see them like measured ones. Cell ids are
formed as the plugin forms them (``RTX_4090-vastai-qwen2:7b``), so a later run's
``--gpubench-compare`` can find an imported result as its baseline.

**Duplicates.** A result's identity is its ``id`` when its file gives one (every
``gpubench export`` and GPU Shopper result has one), else a UUID of its normalized
content (:func:`.import_formats.content_id`), which also becomes its benchmark id.
A result whose identity the manifest knows, as a stored benchmark id or as the
``remote_id`` an upload got, is skipped, and so is one seen earlier in the same
import: importing a file twice, or exporting and importing back, adds nothing.

A file is imported whole or not at all; a bad file is one line naming it, the
field and what is allowed, and the other files still import.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..gpuinfo import gpu_type_of
from ..errors import CommandProblem, ImportProblem
from .import_formats import Parsed, parse_document
from ..store.base import Store
from ..store.sqlite import refuse_secrets
from ..measure.results import BenchmarkResult
from ..matrix.selection import cell_id
from ..store.records import matrix_key, numbered_key, row_id
from ..settings import new_run_id

__all__ = ["Assumed", "FileOutcome", "ImportReport", "expand_paths", "import_files",
           "read_file"]

# The seed-000 script's numbers come from bc, which writes 0.5 as ".5": not JSON.
_BC_FRACTION = re.compile(r"(?<=[:\[,])(\s*-?)\.(\d)")


@dataclass(frozen=True)
class Assumed:
    """What to take for results whose file does not say (``--gpu``, ``--provider``, ...).

    Seed-000 results have no provider or price, seed-001 checkpoints not even a GPU,
    and without a price there is no cost per token. A value the file states is
    never replaced.
    """

    gpu: str | None = None
    provider: str | None = None
    price_per_hour: float | None = None
    location: str | None = None

    def apply(self, result: BenchmarkResult) -> BenchmarkResult:
        """``result`` with its missing GPU name, provider, price and location filled in."""
        update: dict[str, Any] = {}
        if self.gpu and not result.hardware.gpu_name:
            update["hardware"] = result.hardware.model_copy(update={"gpu_name": self.gpu})
        if self.provider and not result.provider:
            update["provider"] = self.provider
        if self.price_per_hour and not result.price_per_hour:
            update["price_per_hour"] = self.price_per_hour
        if self.location and not result.location:
            update["location"] = self.location
        return result.model_copy(update=update) if update else result


@dataclass
class FileOutcome:
    """What became of one file: its formats, the rows it added, its duplicates, or its problem."""

    path: Path
    formats: list[str] = field(default_factory=list)
    #: (row id, status) of each result imported (or that would be, in a dry run)
    imported: list[tuple[str, str]] = field(default_factory=list)
    #: the run that already holds each duplicate
    duplicates: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    problem: str | None = None

    def line(self, dry_run: bool) -> str:
        """One line for the terminal: the file, its format, and what happened."""
        if self.problem is not None:
            return f"{self.path}: {self.problem}"
        count = len(self.imported)
        verb = "would import" if dry_run else "imported"
        text = f"{self.path}: {', '.join(self.formats)}: {verb} {_plural(count, 'result')}"
        partial = sum(1 for _, status in self.imported if status == "partial")
        if partial:
            text += f" ({partial} as partial)"
        if self.details:
            text += f" [{'; '.join(self.details)}]"
        if self.duplicates:
            text += f"; {'would skip' if dry_run else 'skipped'} {_duplicates(self.duplicates)}"
        return text


@dataclass
class ImportReport:
    """Every file's outcome, and the run the results went into (``None`` when none did)."""

    run_id: str | None
    dry_run: bool
    files: list[FileOutcome] = field(default_factory=list)

    @property
    def failed(self) -> list[FileOutcome]:
        """The files that could not be imported."""
        return [f for f in self.files if f.problem is not None]

    def summary(self) -> str:
        """``imported N results from M files (formats) into run R; skipped D duplicates (...); failed F files``."""
        read = [f for f in self.files if f.problem is None]
        imported = sum(len(f.imported) for f in read)
        formats = sorted({fmt for f in read for fmt in f.formats})
        verb = "would import" if self.dry_run else "imported"
        text = f"{verb} {_plural(imported, 'result')} from {_plural(len(read), 'file')}"
        if formats:
            text += f" ({', '.join(formats)})"
        if self.run_id and imported:
            text += f" {'into a new run' if self.dry_run else f'into run {self.run_id}'}"
        duplicates = [run for f in read for run in f.duplicates]
        text += f"; {'would skip' if self.dry_run else 'skipped'} {_duplicates(duplicates)}"
        text += f"; failed {_plural(len(self.failed), 'file')}"
        if self.dry_run:
            text += "; nothing was written (dry run)"
        return text


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _duplicates(runs: list[str]) -> str:
    """``2 duplicates (already in run R)``, or ``(already in runs R1 (1), R2 (2))``."""
    text = _plural(len(runs), "duplicate")
    if not runs:
        return text
    counts = Counter(runs)
    if len(counts) == 1:
        return f"{text} (already in run {runs[0]})"
    return f"{text} (already in runs {', '.join(f'{run} ({n})' for run, n in counts.items())})"


# ---------------------------------------------------------------------- the files


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files as given, and each directory's ``*.json`` files (sorted, not recursive).

    A path that does not exist, or a directory without a JSON file, is an
    :class:`CommandProblem`.
    """
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise CommandProblem(f"{path}: a directory without *.json files: nothing to import")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise CommandProblem(f"{path}: no such file or directory")
    return files


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(text: str) -> Any:
    """The JSON value of ``text``; an :class:`ImportProblem` saying where it is not JSON.

    Control characters inside strings are accepted (seed 000's ``gpu_info`` holds a
    newline per GPU), and so are bc's ``.5`` numbers; ``NaN`` and ``Infinity`` are not.
    """
    try:
        return json.loads(text, strict=False, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        error = exc
    except ValueError as exc:
        raise ImportProblem((), f"not JSON: {exc}") from None
    repaired = _BC_FRACTION.sub(r"\g<1>0.\2", text)
    if repaired != text:
        try:
            return json.loads(repaired, strict=False, parse_constant=_no_constant)
        except ValueError:
            pass
    raise ImportProblem((), f"not JSON: {error.msg} at line {error.lineno} column {error.colno}")


def read_file(path: Path) -> list[Parsed]:
    """Every result in the file at ``path``; an :class:`ImportProblem` when it has a bad one."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ImportProblem((), f"cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ImportProblem((), "not JSON: not UTF-8 text") from None
    if not text.strip():
        raise ImportProblem((), "an empty file: no JSON in it")
    return parse_document(load_json(text))


# ----------------------------------------------------------------------- importing


@dataclass
class _Importer:
    """One ``gpubench import``: its run (started with the first result stored) and what it saw."""

    store: Store | None
    assumed: Assumed
    dry_run: bool
    argv: list[str]
    sources: list[str]
    run_id: str = field(default_factory=lambda: f"import-{new_run_id()}")
    started: bool = False
    #: identity -> the run holding it, for results seen earlier in this import
    seen: dict[str, str] = field(default_factory=dict)
    cells: set[str] = field(default_factory=set)

    def holder(self, key: str) -> str | None:
        if key in self.seen:
            return self.seen[key]
        known = self.store.known_result(key) if self.store is not None else None
        return known.run_id if known is not None else None

    def prepare(self, parsed: Parsed) -> tuple[BenchmarkResult, str, str, str]:
        """The result to store (id set, gaps filled) and its GPU type, provider and model."""
        result = self.assumed.apply(parsed.result).model_copy(update={"id": parsed.key})
        # The plugin's gpu_type is the inventory's name ("RTX 4090"), not nvidia-smi's.
        gpu_type = gpu_type_of(result.hardware.gpu_name) or "unknown"
        # Nothing that looks like key material goes in, as for measured results.
        refuse_secrets({"result": result.model_dump_json()})
        return result, gpu_type, result.provider or "unknown", result.model.name

    def import_file(self, path: Path) -> FileOutcome:
        outcome = FileOutcome(path)
        try:
            items = read_file(path)
            prepared = [(parsed, *self.prepare(parsed)) for parsed in items]
        except (ImportProblem, ValueError) as exc:  # ValueError: refuse_secrets
            outcome.problem = str(exc)
            return outcome
        outcome.formats = list(dict.fromkeys(parsed.format for parsed in items))
        for parsed, result, gpu_type, provider, model in prepared:
            holder = self.holder(parsed.key)
            if holder is not None:
                outcome.duplicates.append(holder)
                continue
            try:
                row_id = self.keep(path, parsed, result, gpu_type, provider, model)
            except (sqlite3.Error, ValueError, KeyError) as exc:  # the store refused it: say so, go on
                outcome.problem = f"storing {parsed.where or 'it'} failed after {len(outcome.imported)} imported: {exc}"
                return outcome
            self.seen[parsed.key] = self.run_id
            outcome.imported.append((row_id, parsed.status))
            if parsed.detail:
                outcome.details.append(parsed.detail)
        return outcome

    def keep(self, path: Path, parsed: Parsed, result: BenchmarkResult, gpu_type: str, provider: str,
             model: str) -> str:
        """One cell and its result in the store (nothing in a dry run); returns the row id."""
        # Two results of one cell in one import keep two rows.
        cell = numbered_key(matrix_key(cell_id(gpu_type, provider, model, result.test_config.concurrent_reqs or 1)),
                            self.cells)
        self.cells.add(cell)
        row = row_id(self.run_id, cell)
        if self.dry_run or self.store is None:
            return row
        if not self.started:
            self.store.start_run(self.run_id, argv=self.argv, matrix_files=self.sources)
            self.started = True
        self.store.add_cell(self.run_id, cell, gpu_type=gpu_type, provider=provider, model=model,
                            matrix_file=str(path))
        self.store.add_result(row, result, parsed.records, unpriced=not result.price_per_hour)
        fields: dict[str, Any] = {
            "status": parsed.status,
            **_times(result),
            "imported_from": f"{_place(path, parsed.where)} ({parsed.format})",
        }
        if parsed.status == "partial":
            fields.update(
                failure_stage="benchmark",
                failure_reason="checkpoint",
                error_message=f"imported from a {parsed.format} ({parsed.detail}): the benchmark had not finished",
            )
        self.store.update_cell(row, **fields)
        return row

    def finish(self, status: str) -> None:
        if self.started and self.store is not None:
            self.store.finish_run(self.run_id, status)


def _place(path: Path, where: str) -> str:
    """``results.json``, ``results.json[2]`` or ``answer.json:benchmarks[0]``."""
    if not where or where.startswith("["):
        return f"{path}{where}"
    return f"{path}:{where}"


def _times(result: BenchmarkResult) -> dict[str, str]:
    """``started_at`` / ``completed_at`` from the result's own time, as far as it is known.

    Go's zero time (year 1) is what a Go client sends for "not set": no times then.
    """
    finished = result.timestamp
    if finished.year <= 1:
        return {}
    times = {"completed_at": finished.isoformat(timespec="milliseconds")}
    try:
        started = finished - timedelta(seconds=result.results.duration_seconds)
    except OverflowError:  # an absurd duration: leave the start unknown
        return times
    return {"started_at": started.isoformat(timespec="milliseconds"), **times}


def import_files(
    paths: Sequence[str | Path],
    store: Store | None,
    *,
    assumed: Assumed = Assumed(),
    dry_run: bool = False,
    argv: Sequence[str] | None = None,
) -> ImportReport:
    """Import every result of ``paths`` (files, or directories of ``*.json``) into ``store``.

    ``store`` may be ``None`` in a dry run (no manifest file yet: only duplicates
    within the files are found). A dry run reads and checks everything and writes
    nothing. Bad files are reported in their :class:`FileOutcome`, never raised;
    a path that does not exist is an :class:`CommandProblem`, before anything is read.
    """
    if store is None and not dry_run:
        raise ValueError("a store is needed unless dry_run")
    files = expand_paths(paths)
    importer = _Importer(store, assumed, dry_run, list(argv if argv is not None else sys.argv),
                         [str(p) for p in paths])
    report = ImportReport(run_id=importer.run_id, dry_run=dry_run)
    status = "interrupted"
    try:
        for path in files:
            report.files.append(importer.import_file(path))
        status = "imported"
    finally:
        importer.finish(status)
    if not importer.started and not dry_run:
        report.run_id = None
    return report
