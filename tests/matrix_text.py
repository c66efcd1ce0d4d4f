"""A matrix written from a test's text into ``gpubench_NAME.yaml`` and loaded, or the message
of the MatrixError it raises (the file's name is in it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import load_cells

ONE_ROW = """
matrix:
  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}
"""


def load_matrix(tmp_path: Path, head: str, rows: str = ONE_ROW, *, name: str):
    """The cells of a matrix named ``name`` whose text is ``head`` then ``rows``."""
    path = tmp_path / f"gpubench_{name}.yaml"
    path.write_text(f"name: {name}\n" + head + rows)
    return load_cells(path)


def matrix_error(tmp_path: Path, head: str, rows: str = ONE_ROW, *, name: str) -> str:
    """The message of the MatrixError that loading such a matrix raises."""
    with pytest.raises(MatrixError) as caught:
        load_matrix(tmp_path, head, rows, name=name)
    return str(caught.value)
