"""Property-based tests of the parsers of files that others may write (issue 21): matrix
files, hosts.yaml, runners files, seed 004's model_presets.yaml and progress files. Any
bytes (invalid UTF-8 included), any YAML (non-mapping documents, nulls, huge numbers, deep
nesting, anchors) and any mutation of a valid file: a clean result or the project's own
error in one line naming the file, never another exception type, a traceback or a hang."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, strategies as st

from parser_properties import PARSER_SETTINGS, assert_one_line, within
from pytest_gpubench.run.cleanup import stage_reached
from pytest_gpubench.cloud.hosts_inventory import load_inventory
from pytest_gpubench.commands.plan import stage_seconds
from pytest_gpubench.errors import InventoryError, MatrixError, RunnersError
from pytest_gpubench.matrix.cells import load_matrix
from pytest_gpubench.matrix.datasets import load_dataset
from pytest_gpubench.matrix.runners import load_runners
from pytest_gpubench.matrix.worker_presets import load_presets
from pytest_gpubench.store.progress import ProgressLine, read_progress

ROOT = Path(__file__).resolve().parents[2]
QUICK = yaml.safe_load((ROOT / "matrix" / "gpubench_quick.yaml").read_text())
PRESETS = yaml.safe_load((ROOT / "matrix" / "model_presets.yaml").read_text())
HOSTS = {"hosts": {"lab1": {"address": "10.0.0.5", "port": 2222, "user": "bench", "key_file": "id_test",
                            "gpu": "RTX 4090", "gpus": 2, "price_per_hour": 0.4, "tags": ["lab"]},
                   "lab2": {"address": "lab2.example", "agent": True, "gpu": "A100 80GB"}},
         "local": {"price_per_hour": 0.1}}
RUNNERS = {"phases": {"nightly": {"reruns": 2, "gpus": ["RTX 4090"]}, "seed": {"models": ["qwen2"]}},
           "runners": {"box-a": {"phase": "nightly", "gpus": ["RTX 4090"]}, "default": {"phase": "seed"}}}

_names = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every example (hypothesis runs a test's examples in one call)."""
    path = tmp_path_factory.mktemp("parsers")
    (path / "id_test").write_text("KEY")
    return path


def fresh(folder: Path, name: str, content: bytes) -> Path:
    """A file of its own for each example: the loaders cache by path and modification time."""
    path = folder / f"{next(_names)}-{name}"
    path.write_bytes(content)
    return path


# ------------------------------------------------------------------ strategies

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**20, max_value=10**400),
    st.floats(), st.text(max_size=12), st.sampled_from(["", "0", "-1", "1e999", "~", "null", "24h", "5m"]),
)
yaml_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
#: Pieces of YAML syntax, glued into text that is rarely valid and often nearly so.
yaml_pieces = st.sampled_from([
    "matrix:", "hosts:", "phases:", "runners:", "models:", "workload:", "\n", "\n  ", "  - ", "- ", ": ", "[", "]",
    "{", "}", ",", "&a ", "*a", "!!binary ", "!!python/object:os.system ", "? ", "|\n  ", ">-\n  ", "'", '"',
    "#", "---\n", "...\n", "\t", "gpu: RTX 4090", "provider: vastai", "model: qwen2:7b", "<<: *a", "\x00", "\ufeff",
    "1e400", ".nan", "-.inf", "99999999999999999999999999", "null", "~", "é", "\U0001f600",
])
yaml_texts = st.lists(yaml_pieces, max_size=30).map("".join)


def mutated(base: dict) -> st.SearchStrategy[dict]:
    """``base`` with one value somewhere in it (or a key of a mapping) replaced by any YAML value."""
    @st.composite
    def build(draw: st.DrawFn) -> dict:
        doc = copy.deepcopy(base)
        node: object = doc
        while True:
            keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = node[key]  # type: ignore[index]
            if not isinstance(child, (dict, list)) or not child or draw(st.booleans()):
                if isinstance(node, dict) and draw(st.integers(0, 5)) == 0:
                    node[draw(st.text(max_size=10))] = draw(yaml_values)  # an unknown key
                else:
                    node[key] = draw(yaml_values)  # type: ignore[index]
                break
            node = child
        return doc
    return build()


def dumped(value: object) -> bytes:
    return yaml.safe_dump(value, allow_unicode=True).encode()


documents = lambda base: st.one_of(  # noqa: E731 - one strategy per file kind
    mutated(base).map(dumped),
    yaml_values.map(dumped),
    yaml_texts.map(lambda text: text.encode()),
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda text: text.encode("utf-16")),
)


def check(load, path: Path, error: type[Exception]) -> None:
    """``load(path)`` returns, or raises ``error`` in one line naming the file; nothing else."""
    try:
        with within():
            load(path)
    except error as exc:
        assert_one_line(str(exc), str(path))


# ------------------------------------------------------------------ matrix files

DEEP = b"matrix: " + b"[" * 3000 + b"]" * 3000
#: A deep document whose end is not YAML: libyaml fails, then the pure-Python composer says
#: what is wrong, and ran out of Python stack on the way (RecursionError).
DEEP_BROKEN = b"matrix: " + b"[" * 3000 + b"}"


@PARSER_SETTINGS
@given(content=documents(QUICK))
@example(content=DEEP_BROKEN)
@example(content=b"\xff\xfematrix: []")
@example(content=b"- 1\n- 2\n")
@example(content=b"matrix: ~\n")
def test_any_matrix_file_loads_or_says_what_is_wrong_in_one_line(folder, content):
    check(load_matrix, fresh(folder, "gpubench_x.yaml", content), MatrixError)


def test_a_matrix_nested_past_the_c_stack_is_an_error_not_a_crash():
    # 30,000 levels overflowed libyaml's composer (C recursion): the interpreter died with
    # SIGSEGV, taking pytest with it. A child process, so that main's crash fails only this test.
    code = ("import sys; from pytest_gpubench.matrix.cells import parse_matrix\n"
            "from pytest_gpubench.errors import MatrixError\n"
            "try:\n    parse_matrix('matrix: ' + '[' * 30000 + ']' * 30000, 'deep.yaml')\n"
            "except MatrixError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("deep.yaml: line 1: invalid YAML: nested deeper than 100 levels"), done.stdout


# ------------------------------------------------------------------ hosts.yaml


@PARSER_SETTINGS
@given(content=documents(HOSTS).filter(lambda b: _utf8(b)))
@example(content=b"hosts: " + b"[" * 3000 + b"}")
# YAML that does not parse: a MatrixError, which the hosts provider (catching InventoryError) let through.
@example(content=b"hosts: [\n")
@example(content=b"hosts: {lab1: {address: a, agent: true, gpu: T4, gpus: 1e400, port: 99999999999999999999}}")
def test_any_utf8_hosts_file_loads_or_says_what_is_wrong_in_one_line(folder, content):
    check(load_inventory, fresh(folder, "hosts.yaml", content), InventoryError)


def _utf8(content: bytes) -> bool:
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("content", [b"\xff\xfehosts: {}", b"hosts:\n  lab\xe9: {}\n"])
def test_a_hosts_file_that_is_not_utf8_says_so_in_one_line(folder, content):
    check(load_inventory, fresh(folder, "hosts.yaml", content), InventoryError)


# ------------------------------------------------------------------ runners files


@PARSER_SETTINGS
@given(content=documents(RUNNERS).filter(lambda b: _utf8(b)))
@example(content=b"phases: " + b"[" * 3000 + b"}")
@example(content=b"phases: [\n")  # a MatrixError, not the file's own RunnersError
def test_any_utf8_runners_file_loads_or_says_what_is_wrong_in_one_line(folder, content):
    check(load_runners, fresh(folder, "runners.yaml", content), RunnersError)


# ------------------------------------------------------------------ seed 004's model presets


@PARSER_SETTINGS
@given(content=documents(PRESETS))
# Not UTF-8: UnicodeDecodeError (a ValueError) came out of the loader raw.
@example(content=b"models:\n  \xff: {}\n")
# Nested deeper than the pure-Python YAML parser's recursion: RecursionError.
@example(content=b"models: " + b"[" * 3000 + b"]" * 3000)
def test_any_presets_file_loads_or_says_what_is_wrong_in_one_line(folder, content):
    check(load_presets, fresh(folder, "model_presets.yaml", content), MatrixError)


# ------------------------------------------------------------------ progress files

stamps = st.one_of(
    st.datetimes().map(lambda d: d.isoformat() + "Z"), st.sampled_from([
        "2026-02-07T10:00:05Z", "2026-02-07T10:00:05", "2026-02-07T10:00:05+05:00", "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00", "not a time", "", "2026-13-40T99:99:99Z"]))
kinds = st.sampled_from(["STATUS", "PROGRESS", "ERROR", "RESULTS", "OTHER", ""])
bodies = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["INVENTORY_QUERY", "SSH_CONNECTED", "BENCHMARK_START", "MODEL_PULLED", "SESSION_REUSED",
                              "CLEANUP", "a=b", 'msg="x y"', 'q="\\', "by=me", "=", "k=", " ", '"', "stage=ssh_wait",
                              "{", "}", "[" * 50, "null", "\x00", "\ufffd"]), max_size=6).map(" ".join),
    st.sampled_from(['{"a":1}', "[" * 100000, "1e999999", '{"a":' * 3000]),
)
progress_lines = st.builds(lambda stamp, kind, body: f"[{stamp}] {kind}: {body}", stamps, kinds, bodies)
progress_files = st.one_of(
    st.lists(progress_lines, max_size=8).map(lambda lines: "\n".join(lines).encode()),
    st.binary(max_size=200),
)
#: What the cleanup and ``gpubench plan`` make of a progress file, as they read it.
readers = [read_progress, lambda path: stage_seconds(read_progress(path)), stage_reached]


@PARSER_SETTINGS
@given(content=progress_files)
# A RESULTS line nested deeper than json's recursion: RecursionError out of the reader.
@example(content=b"[2026-02-07T10:00:05Z] RESULTS: " + b"[" * 100000 + b"\n")
# Timestamps with and without a zone: stage_seconds mixed naive and aware times.
@example(content=b"[2026-02-07T10:00:05] STATUS: INVENTORY_QUERY\n[2026-02-07T10:00:09Z] STATUS: SSH_CONNECTED\n")
@example(content=b"[0001-01-01T00:00:00+01:00] STATUS: INVENTORY_QUERY\n")
def test_any_progress_file_reads_to_records_and_its_readers_never_raise(folder, content):
    path = fresh(folder, "progress.log", content)
    for read in readers:
        with within():
            read(str(path))
    lines = read_progress(path)
    assert all(isinstance(line, ProgressLine) and "\n" not in line.raw for line in lines)
    try:
        with within():
            read_progress(path, strict=True)
    except ValueError as exc:  # strict: the first line that is not a record, by file and number
        assert_one_line(str(exc).split(": ", 1)[0] + ": ...", str(path))


# ------------------------------------------------------------------ datasets (prompts: {dataset: ...})

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
records = st.one_of(
    st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=20), json_values)},
                          optional={"answer": json_values}),
    st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries(
        {"from": st.sampled_from(["human", "gpt", "user", "system", 5]), "value": json_values}), max_size=3)}),
    json_values,
)
dataset_files = st.one_of(
    st.lists(records, max_size=5).map(lambda items: "\n".join(json.dumps(i) for i in items).encode()),
    st.lists(records, max_size=5).map(lambda items: json.dumps(items).encode()),
    st.binary(max_size=100),
    st.lists(st.sampled_from(['{"prompt": "a"}', "[", "]", ",", "\n", '{"prompt":', '"x"}', "\u2028", "\ufeff",
                              "\r\n", "null", '{"a\\nb": 1}']), max_size=10).map(lambda p: "".join(p).encode()),
)
dataset_specs = st.fixed_dictionaries({}, optional={
    "field": st.sampled_from(["prompt", "text"]), "output_tokens": st.just("dataset"),
    "output_field": st.sampled_from(["answer", "prompt"]), "limit": st.integers(1, 3), "seed": st.integers(0, 3)})


@PARSER_SETTINGS
@given(content=dataset_files, spec=dataset_specs)
# Nested past json's recursion: RecursionError, not the ValueError the workload makes an error of.
@example(content=b'{"prompt": ' + b"[" * 100_000 + b"\n", spec={})
@example(content=b"[" * 100_000, spec={})
# A key with a line break, named in the error: the message was two lines.
@example(content=b'{"a\\nb": 1}\n', spec={})
def test_any_dataset_gives_prompts_or_one_line_naming_the_file(folder, content, spec):
    path = fresh(folder, "data.jsonl", content)
    try:
        with within():
            prompts, source = load_dataset({"dataset": path.name, **spec}, folder)
    except ValueError as exc:  # the workload's validator makes it the matrix's one-line error
        assert_one_line(str(exc), str(path))
        return
    assert prompts and all(isinstance(p.text, str) and p.text.strip() for p in prompts)


def test_a_jsonl_record_holding_a_line_separator_is_one_record(folder):
    # JSON strings may hold U+2028 as it is; str.splitlines() broke the line there and the
    # valid record read as invalid JSON.
    path = fresh(folder, "data.jsonl", '{"prompt": "a\u2028b"}\n{"prompt": "c\x85d"}\n'.encode())
    prompts, _ = load_dataset({"dataset": path.name}, folder)
    assert [p.text for p in prompts] == ["a\u2028b", "c\x85d"]
