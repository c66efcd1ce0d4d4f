"""Before collection: does this run have matrix files, and is it a run at all?

Light on purpose (standard library and pytest only): the plugin asks both questions
in every pytest run of an environment where it is installed.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .stash import MATRIX_ARGS_KEY, SETTINGS_KEY

#: Directories never searched for matrix files, whatever ``norecursedirs`` says.
_NEVER = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox", ".nox",
          ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages"}


def is_matrix_file(name: str, patterns: Iterable[str]) -> bool:
    """A ``.yaml``/``.yml`` file name that matches one of ``patterns`` (ini ``gpubench_files``)."""
    return name.endswith((".yaml", ".yml")) and any(fnmatch.fnmatch(name, p) for p in patterns)


def runs_matrix_files(config: pytest.Config) -> bool:
    """Whether the command line names matrix files, or directories holding some.

    Directories are searched as pytest collects them: ``norecursedirs`` (and
    virtualenvs, caches, VCS metadata) are skipped, and the search stops at the
    first matrix file. The answer is computed once per run.
    """
    known = config.stash.get(MATRIX_ARGS_KEY, None)
    if known is None:
        known = config.stash[MATRIX_ARGS_KEY] = _scan(config)
    return known


def _scan(config: pytest.Config) -> bool:
    return next(iter(matrix_files(config)), None) is not None


def matrix_files(config: pytest.Config) -> Iterator[Path]:
    """The matrix files the command line names, or that its directories hold, as pytest
    would collect them: ``norecursedirs`` (and virtualenvs, caches, VCS metadata) are
    skipped. Lazy: a caller that needs only the first stops the walk there."""
    patterns = list(config.getini("gpubench_files"))
    try:
        skip = list(config.getini("norecursedirs"))
    except ValueError:
        skip = []
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        if path.is_file():
            if is_matrix_file(path.name, patterns):
                yield path
        elif path.is_dir():
            yield from _matrix_files_under(path, patterns, skip)


def _matrix_files_under(root: Path, patterns: list[str], skip: list[str]) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if is_matrix_file(name, patterns):
                yield Path(folder) / name
        dirs[:] = [d for d in dirs if d not in _NEVER and not d.endswith(".egg-info")
                   and not any(fnmatch.fnmatch(d, pattern) for pattern in skip)]


def real_run(config: pytest.Config) -> bool:
    """False for the modes that only show something: ``--collect-only``, ``--fixtures``,
    ``--fixtures-per-test``, ``--setup-plan``, ``--markers``, ``--help``, ``--version``.

    Nothing but a real run starts a sandbox, writes to the manifest or creates
    report directories and progress files.
    """
    option = config.option
    return not any(getattr(option, name, False) for name in (
        "collectonly", "showfixtures", "show_fixtures_per_test", "setupplan", "markers", "help", "version"))


def only_shows_options(config: pytest.Config) -> bool:
    """``--help``, ``--version``, ``--markers``: pytest configures, then prints; nothing is collected."""
    option = config.option
    return any(getattr(option, name, False) for name in ("help", "version", "markers"))


def filter_hint_lines(config: pytest.Config) -> list[str]:
    """What to tell a user whose ``--gpubench-gpu/provider/model`` selected no cell: the
    values the command line's matrix files do hold (and the close names). Empty when
    no filter was given."""
    from ..errors import MatrixError
    from ..matrix.cells import load_cells
    from ..run.hints import no_match_message

    settings = config.stash[SETTINGS_KEY]
    if not (settings.gpu or settings.provider or settings.model):
        return []
    cells: list[Any] = []
    for path in matrix_files(config):
        try:
            cells += load_cells(path)
        except MatrixError:
            continue  # reported at collection already
    message = no_match_message(cells, settings.gpu, settings.provider, settings.model)
    return (message or "").splitlines()
