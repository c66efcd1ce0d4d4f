"""Every YAML example in the docs collects (issue 23 item 9).

Each ```yaml block of docs/*.md and README.md is written under the pytester folder, one
folder per page, and one ``pytest --collect-only`` collects them all (one in-process run,
not one per block). What a block becomes:

- a first line ``# PATH.yaml`` writes it at PATH in its page's folder: a ``gpubench_*.yaml``
  is a matrix, any other a file a matrix names (``# matrix/model_presets.yaml``, ``# hosts.yaml``);
- a mapping with ``matrix:`` is a matrix;
- a list is rows: it becomes the file's ``matrix:``;
- any other mapping is top-level keys: one row is added (:data:`ROW`) to make it a matrix;
- a block after an ``<!-- fragment -->`` line is not collected: it is not a matrix or a file
  one names (a runners file, a piece of a larger one).

Other files the examples name (a CA certificate, a dataset) are provided by :func:`named_files`.

The convention is in docs/matrix.md ("Examples in these docs").
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from tls_helpers import make_loopback_certs

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)
FRAGMENT = "<!-- fragment -->"
NAMED = re.compile(r"#\s*([\w./-]+\.ya?ml)\s*$")
#: The row a block of top-level keys alone gets, to be a matrix.
ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n"


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The page's yaml blocks not marked as fragments."""
    text = page.read_text()
    found = []
    for block in FENCE.finditer(text):
        before = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before == FRAGMENT:
            continue
        found.append(Example(page, text[: block.start()].count("\n") + 1, block.group(1)))
    return found


def as_file(example: Example) -> tuple[str, str]:
    """(path in the page's folder, text) of the file the example is."""
    first = example.text.split("\n", 1)[0]
    if named := NAMED.fullmatch(first.strip()):
        return named.group(1), example.text
    data = yaml.safe_load(example.text)
    name = f"gpubench_line{example.line}.yaml"
    if isinstance(data, dict) and "matrix" in data:
        return name, example.text
    if isinstance(data, list):
        return name, "matrix:\n" + textwrap.indent(example.text, "  ")
    assert isinstance(data, dict), f"{example.where}: a yaml example is neither a matrix, rows nor keys: {data!r}"
    return name, example.text + ROW


def named_files(folder: Path) -> dict[str, bytes]:
    """The files other than YAML the examples name, by their path in the pytester folder."""
    conversation = {"conversations": [{"from": "human", "value": "Why is the sky blue?"},
                                      {"from": "gpt", "value": "Rayleigh scattering."}]}
    return {
        "runtimes/certs/internal-ca.pem": make_loopback_certs(folder).ca.read_bytes(),
        "workloads/data/sharegpt.json": json.dumps([conversation] * 3).encode(),
        "workloads/traces/sample_trace.jsonl": (ROOT / "matrix" / "traces" / "sample_trace.jsonl").read_bytes(),
    }


def test_the_pages_have_examples_and_the_marks_are_read():
    every = [e for page in PAGES for e in examples(page)]
    assert len(every) >= 25
    assert not any(e.text.startswith("phases:") for e in every), "docs/runners.md's runners file is a fragment"
    # the worker example's two files land side by side, as the matrix names its presets file
    runtimes = {as_file(e)[0] for e in examples(ROOT / "docs" / "runtimes.md")}
    assert {"matrix/gpubench_workers.yaml", "matrix/model_presets.yaml"} <= runtimes


def test_every_yaml_example_in_the_docs_collects(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    matrices: dict[str, Example] = {}
    for page in PAGES:
        for example in examples(page):
            name, text = as_file(example)
            path = Path(page.stem) / name
            assert not (pytester.path / path).exists(), f"{example.where}: {path} is written twice"
            (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
            (pytester.path / path).write_text(text)
            if Path(name).name.startswith("gpubench_"):
                matrices[path.as_posix()] = example
    for path, data in named_files(pytester.path / "certs").items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_bytes(data)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    result = pytester.runpytest("--collect-only", "-q")
    output = result.stdout.str() + result.stderr.str()
    collected = {line.split("::", 1)[0] for line in result.stdout.lines if "::" in line}
    missing = [f"{example.where} ({path})" for path, example in matrices.items() if path not in collected]
    assert not missing and result.ret == 0, (
        "docs examples that do not collect: " + ", ".join(missing) + "\n" + output[-6000:])
