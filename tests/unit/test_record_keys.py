"""The record-key policy (store/records.py): what each kind of cell is called in the store."""

from __future__ import annotations

import pytest

from pytest_gpubench.store.records import (
    distinct_keys,
    file_name,
    marked_test_key,
    matrix_key,
    key_of,
    numbered_key,
    row_id,
)

CELL = "RTX_4090-vastai-qwen2:7b"


def test_a_matrix_cell_is_its_test_id_and_a_marked_test_adds_its_name():
    assert matrix_key(CELL) == CELL
    assert marked_test_key(CELL, "test_fast") == f"{CELL}@test_fast"


def test_only_keys_two_files_share_get_the_file_stem():
    keys = [CELL, CELL, "A100_80GB-vastai-qwen2:7b"]
    sources = ["matrix/gpubench_quick.yaml", "/abs/other/gpubench_seed.yaml", "matrix/gpubench_quick.yaml"]
    assert distinct_keys(keys, sources) == [f"{CELL}@gpubench_quick", f"{CELL}@gpubench_seed",
                                           "A100_80GB-vastai-qwen2:7b"]


def test_distinct_keys_refuses_a_source_list_of_another_length():
    with pytest.raises(ValueError):
        distinct_keys([CELL, CELL], ["one.yaml"])


def test_a_taken_key_is_numbered_from_two():
    assert numbered_key(CELL, set()) == CELL
    assert numbered_key(CELL, {CELL}) == f"{CELL}@2"
    assert numbered_key(CELL, {CELL, f"{CELL}@2"}) == f"{CELL}@3"


def test_row_ids_and_file_names():
    assert row_id("20261125T000000Z-abc123", CELL) == f"20261125T000000Z-abc123/{CELL}"
    namespaced = "RTX_4090-vastai-ns/model:7b"  # a key may hold "/" itself
    assert key_of(row_id("run-1", namespaced), "run-1") == namespaced
    assert file_name(f"{CELL}@test_x[1]") == "RTX_4090-vastai-qwen2_7b_test_x_1_"
