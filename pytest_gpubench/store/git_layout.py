"""The results repository's files (seed 002's layout), read and written in a work tree.

```
data/phase/<run>.txt                 one line per cell not yet done: its file-name-safe key
data/runs/claims/<run>/<cell>.json   who runs the cell: holder, since, lease_expires_at
data/runs/<run>/<cell>.json          the cell's outcome and its BenchmarkResult JSON
```

``<run>`` and ``<cell>`` are :func:`~.records.file_name` of the run id and the
record key. The JSON files also carry the cell's identity (run, key, GPU, provider,
model), so a machine that never collected a cell still shows it whole. This module
knows files only; git is :mod:`.git_repo`'s, and what a claim means :mod:`.git_store`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..ids import InvalidId, shown_id
from .records import file_name

__all__ = ["CLAIMS", "ClaimFile", "Layout", "RepoCell", "ResultFile", "run_dir"]

PHASES = Path("data/phase")
RUNS = Path("data/runs")
CLAIMS = RUNS / "claims"


def run_dir(run_id: str) -> str:
    """The file name of a run's TODO file, claims and results folder (``claims`` is taken).

    A run id that starts with ``.`` (``..`` would put the run's results beside ``data/runs``) is
    :class:`~pytest_gpubench.ids.InvalidId`: run ids are checked where they enter, this holds anyway.
    """
    name = file_name(run_id)
    if not name or name.startswith("."):
        raise InvalidId(f"run id {shown_id(run_id)} cannot name a folder of the results repository")
    return f"{name}_" if name == CLAIMS.name else name


class _File(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ClaimFile(_File):
    """``data/runs/claims/<run>/<cell>.json``: the cell is running, held by ``holder``."""

    holder: str
    #: The host of the holder: worker names (``main``, ``gw0``) repeat from machine to machine.
    host: str = ""
    #: When the holder started the cell (ISO 8601).
    since: str
    #: Seconds since the epoch; None: held until finished (or the file is deleted by hand).
    lease_expires_at: float | None = None
    #: The cell's identity (:class:`~.records.CellRecord` fields: row_id, run_id, cell_id, gpu_type...).
    cell: dict[str, Any] = {}


class ResultFile(_File):
    """``data/runs/<run>/<cell>.json``: the cell is done; ``cell`` holds its identity and outcome
    (status, worker, completed_at, failure stage/reason, headline figures), ``result`` its
    BenchmarkResult (None when it produced none: a failure, a skip)."""

    cell: dict[str, Any]
    result: dict[str, Any] | None = None
    #: The host whose worker (``cell["worker"]``) ran it.
    host: str = ""

    @property
    def status(self) -> str:
        return str(self.cell.get("status") or "success")


class RepoCell(_File):
    """What the repository says about one cell."""

    run: str
    key: str
    todo: bool = False
    claim: ClaimFile | None = None
    result: ResultFile | None = None


class Layout:
    """The layout's files under a work tree ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: Something was written since the flag was last cleared: there is a commit to make.
        self.changed = False

    # ------------------------------------------------------------------ paths

    def todo_path(self, run: str) -> Path:
        return self.root / PHASES / f"{run}.txt"

    def claim_path(self, run: str, key: str) -> Path:
        return self.root / CLAIMS / run / f"{key}.json"

    def result_path(self, run: str, key: str) -> Path:
        return self.root / RUNS / run / f"{key}.json"

    # ------------------------------------------------------------------ reading

    def todo(self, run: str) -> list[str]:
        path = self.todo_path(run)
        return [line.strip() for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def claim(self, run: str, key: str) -> ClaimFile | None:
        return _read(self.claim_path(run, key), ClaimFile)

    def result(self, run: str, key: str) -> ResultFile | None:
        return _read(self.result_path(run, key), ResultFile)

    def runs(self) -> list[str]:
        """Every run the repository has a TODO file, claims or results of."""
        found = {path.stem for path in (self.root / PHASES).glob("*.txt")}
        found |= {path.name for path in (self.root / RUNS).glob("*") if path.is_dir() and path != self.root / CLAIMS}
        found |= {path.name for path in (self.root / CLAIMS).glob("*") if path.is_dir()}
        return sorted(found)

    def cells(self, run: str) -> list[RepoCell]:
        """The run's cells: TODO order first, then claimed and finished ones by name."""
        todo = self.todo(run)
        keys = dict.fromkeys(todo)
        for folder in (self.root / CLAIMS / run, self.root / RUNS / run):
            keys.update(dict.fromkeys(sorted(path.stem for path in folder.glob("*.json"))))
        return [self.cell(run, key, todo=key in todo) for key in keys]

    def cell(self, run: str, key: str, *, todo: bool | None = None) -> RepoCell:
        return RepoCell(run=run, key=key, todo=key in self.todo(run) if todo is None else todo,
                        claim=self.claim(run, key), result=self.result(run, key))

    # ------------------------------------------------------------------ writing (True: changed)

    def add_todo(self, run: str, key: str) -> bool:
        lines = self.todo(run)
        if key in lines:
            return False
        _write_lines(self.todo_path(run), [*lines, key])
        self.changed = True
        return True

    def remove_todo(self, run: str, key: str) -> bool:
        lines = self.todo(run)
        if key not in lines:
            return False
        _write_lines(self.todo_path(run), [line for line in lines if line != key])
        self.changed = True
        return True

    def write_claim(self, run: str, key: str, claim: ClaimFile) -> bool:
        return self._note(_write_json(self.claim_path(run, key), claim.model_dump(mode="json")))

    def remove_claim(self, run: str, key: str) -> bool:
        return self._note(_remove(self.claim_path(run, key)))

    def write_result(self, run: str, key: str, result: ResultFile) -> bool:
        return self._note(_write_json(self.result_path(run, key), result.model_dump(mode="json")))

    def remove_result(self, run: str, key: str) -> bool:
        return self._note(_remove(self.result_path(run, key)))

    def _note(self, changed: bool) -> bool:
        self.changed = self.changed or changed
        return changed


def _read(path: Path, model: type[_File]) -> Any:
    if not path.is_file():
        return None
    try:
        return model.model_validate_json(path.read_text())
    except ValueError:
        # A file edited by hand into something else: it still says the cell is taken.
        return model.model_validate({"holder": "unreadable", "since": "", "cell": {"status": "failed"}})


def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


def _write_json(path: Path, value: dict[str, Any]) -> bool:
    text = json.dumps(value, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def _remove(path: Path) -> bool:
    if not path.is_file():
        return False
    path.unlink()
    return True
