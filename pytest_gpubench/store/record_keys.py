"""Record keys: the one place that says what a cell is called in the store.

A *record key* names a cell within a run; the store's *row id* is ``{run_id}/{key}``.
Everything that keeps or finds a cell (collection, the recorder, resume, the importer,
progress files) builds its key here, so the policy has one owner:

- a matrix cell is its test id: ``RTX_4090-vastai-qwen2:7b`` (see ``matrix.selection.cell_id``);
- a cell of a Python test marked ``@pytest.mark.gpubench`` adds the test's name:
  ``RTX_4090-vastai-qwen2:7b@test_fast``, so two tests over one cell keep two rows;
- a key that two matrix files of one run both produce adds the file's stem:
  ``RTX_4090-vastai-qwen2:7b@gpubench_quick``; a unique key stays plain;
- an imported result whose key is taken in its import adds a count: ``...@2``, ``...@3``;
- a progress file is named after its key with every character other than letters,
  digits, ``-``, ``_`` and ``.`` replaced by ``_``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Sequence
from pathlib import Path

#: Joins a cell id to what tells two records of it apart (a test, a matrix file, a count).
SEPARATOR = "@"


def matrix_key(cell_id: str) -> str:
    """The key of a matrix file's cell: its test id."""
    return cell_id


def marked_test_key(cell_id: str, test_name: str) -> str:
    """The key of a cell of a marked Python test: ``{cell_id}@{test_name}``."""
    return f"{cell_id}{SEPARATOR}{test_name}"


def distinct_keys(keys: Sequence[str], sources: Sequence[str]) -> list[str]:
    """``keys`` with each repeated one suffixed by its source file's stem (``@gpubench_quick``).

    Two matrix files of one run may hold the same cell; their rows must not merge.
    ``sources[i]`` is the file ``keys[i]`` came from.
    """
    counts = Counter(keys)
    return [f"{key}{SEPARATOR}{Path(source).stem}" if counts[key] > 1 else key
            for key, source in zip(keys, sources, strict=True)]


def numbered_key(key: str, taken: Container[str]) -> str:
    """``key``, or ``key@2``, ``key@3``... : the first one not in ``taken``."""
    candidate, n = key, 1
    while candidate in taken:
        n += 1
        candidate = f"{key}{SEPARATOR}{n}"
    return candidate


def row_id(run_id: str, key: str) -> str:
    """The store's id of a cell record: ``{run_id}/{key}``."""
    return f"{run_id}/{key}"


def key_of(row_id_: str, run_id: str) -> str:
    """The record key of ``row_id_``, a row id of ``run_id`` (the inverse of :func:`row_id`)."""
    return row_id_.removeprefix(f"{run_id}/")


def file_name(key: str) -> str:
    """``key`` as a file name: anything but letters, digits, ``-_.`` becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
