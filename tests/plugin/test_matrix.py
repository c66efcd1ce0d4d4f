"""Matrix files: schema, expansion, ids, filters, VRAM needs and error messages."""

from __future__ import annotations

import copy
import json
import math
import pickle
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from pytest_gpubench.runtime_facts import BUILT_IN
from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import (
    KNOWN_PROVIDERS,
    MODEL_VRAM_GB,
    PROMPT_SETS,
    QUALITY_PROMPTS,
    SEED_PROMPTS,
    Cell,
    Prompt,
    Runs,
    Slo,
    Thresholds,
    Workload,
    cell_id,
    cell_selected,
    expand,
    gpu_matches,
    infer_parameters_b,
    infer_vram_gb,
    load_cells,
    load_matrix,
    model_matches,
    model_ref,
    model_vram_gb,
    normalize_gpu,
    provider_matches,
    select_cells,
)
from pytest_gpubench.options import parse_duration

MATRIX_DIR = Path(__file__).resolve().parents[2] / "matrix"
SEED = MATRIX_DIR / "gpubench_seed.yaml"
QUICK = MATRIX_DIR / "gpubench_quick.yaml"

ONE_ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"


def write(tmp_path: Path, text: str, name: str = "gpubench_test.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cells_of(tmp_path: Path, text: str) -> list[Cell]:
    return load_cells(write(tmp_path, text))


def k_select(cells: list[Cell], *words: str) -> list[str]:
    """What ``pytest -k "w1 and w2"`` keeps: case-insensitive substrings of id or keywords."""
    def hit(cell: Cell, word: str) -> bool:
        names = {cell.cell_id, *cell.keywords}
        return any(word.lower() in name.lower() for name in names)

    return [c.cell_id for c in cells if all(hit(c, w) for w in words)]


# ------------------------------------------------------------------ shipped matrices


SEED_ROWS = [  # seed 001's "Planned Test Matrix", row by row
    ("RTX 3090", "vastai", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("RTX 3090", "tensordock", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("RTX 4090", "vastai", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("RTX 4090", "tensordock", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("RTX 5090", "vastai", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("A100 80GB", "vastai", ["qwen2:7b", "deepseek-r1:14b", "deepseek-r1:32b"]),
    ("H200 NVL", "vastai", ["deepseek-r1:70b"]),
    ("RTX 5060 Ti", "vastai", ["qwen2:1.5b"]),
    ("RTX 5070", "vastai", ["qwen2:1.5b"]),
]


def test_every_shipped_matrix_loads_and_the_runtimes_example_has_a_cell_per_runtime():
    for path in sorted(MATRIX_DIR.glob("gpubench_*.yaml")):
        assert expand(load_matrix(path)), path
    cells = expand(load_matrix(MATRIX_DIR / "gpubench_runtimes.yaml"))
    started_here = sorted(name for name in BUILT_IN if name != "openai")  # openai needs the user's endpoint
    assert sorted({c.runtime for c in cells}) == started_here
    assert [c.cell_id for c in cells if c.launch is not None and c.launch.entrypoint] == [
        "RTX_4090-vastai-qwen2:1.5b-c4-runtime_vllm-entrypoint"]


def test_seed_matrix_is_seed_001_table():
    matrix = load_matrix(SEED)
    cells = expand(matrix)
    assert matrix.name == "seed"
    assert len(matrix.rows) == 9
    assert len(cells) == 21
    expected = [
        (r, gpu, provider, model)
        for r, (gpu, provider, models) in enumerate(SEED_ROWS)
        for model in models
    ]
    assert [(c.row, c.gpu, c.provider, c.model) for c in cells] == expected


def test_seed_matrix_workload_and_offer():
    cells = load_cells(SEED)
    for cell in cells:
        w = cell.workload
        assert (w.duration, w.max_tokens, w.warmup_requests) == (300, 256, 1)
        assert (w.progress_interval, w.checkpoint_every) == (60, 10)
        assert w.prompts == SEED_PROMPTS
        assert cell.offer.max_price is None
        bar = 0.2 if cell.provider == "tensordock" else 0.5
        assert cell.offer.min_availability_confidence == bar
        # TensorDock offers always report 0.3: they must clear their bar
        if cell.provider == "tensordock":
            assert 0.3 > cell.offer.min_availability_confidence
    assert sum(c.provider == "tensordock" for c in cells) == 6


def test_seed_prompts_are_seed_000s_ten_in_order():
    assert len(SEED_PROMPTS) == 10
    assert SEED_PROMPTS[0].startswith("Write a Python function to implement binary search")
    assert SEED_PROMPTS[4] == "Debug this code: for i in range(10): print(i"
    assert SEED_PROMPTS[-1].startswith("How does garbage collection work")


def test_quick_matrix():
    cells = load_cells(QUICK)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b",
        "RTX_4090-vastai-qwen2:1.5b",
        "RTX_3090-vastai-qwen2:7b",
        "A100_80GB-vastai-qwen2:7b",
    ]
    for cell in cells:
        w = cell.workload
        assert (w.duration, w.max_tokens, w.warmup_requests, w.progress_interval) == (6, 64, 1, 2)
        assert w.prompts == SEED_PROMPTS
        assert cell.matrix_name == "quick"
    seed = load_cells(SEED)
    assert {c.gpu for c in cells} <= {c.gpu for c in seed}
    assert {c.model for c in cells} <= {c.model for c in seed}


# ------------------------------------------------------------------------- cell ids


def test_ids_match_the_documented_examples():
    ids = [c.cell_id for c in load_cells(SEED)]
    for example in (
        "RTX_4090-vastai-qwen2:7b",
        "A100_80GB-vastai-deepseek-r1:32b",
        "H200_NVL-vastai-deepseek-r1:70b",
        "RTX_5060_Ti-vastai-qwen2:1.5b",
        "RTX_3090-tensordock-deepseek-r1:14b",
    ):
        assert example in ids


def test_ids_are_unique_stable_and_safe_in_node_ids():
    first = [c.cell_id for c in load_cells(SEED)]
    assert first == [c.cell_id for c in load_cells(SEED)]
    assert len(set(first)) == len(first)
    for cid in first:
        assert not any(bad in cid for bad in (" ", "::", "/", "[", "]"))


def test_id_does_not_depend_on_row_order(tmp_path):
    a = cells_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, mistral:7b]}
        """)
    b = cells_of(tmp_path, """\
        matrix:
          - {gpu: RTX 3090, provider: vastai, model: phi3:mini}
          - {gpu: RTX 4090, provider: vastai, models: [mistral:7b, qwen2:7b]}
        """)
    assert {c.cell_id for c in a} <= {c.cell_id for c in b}


def test_id_of_namespaced_model_and_bare_name():
    assert cell_id("RTX 4090", "vastai", "library/qwen2:7b") == "RTX_4090-vastai-library_qwen2:7b"
    assert cell_id("RTX  4090", "Vast.ai", "llama3") == "RTX_4090-vastai-llama3"


def test_k_style_selection():
    cells = load_cells(SEED)
    deepseek = k_select(cells, "deepseek")
    assert len(deepseek) == 13 and all("deepseek-r1" in cid for cid in deepseek)
    assert k_select(cells, "4090", "vastai") == [
        "RTX_4090-vastai-qwen2:7b",
        "RTX_4090-vastai-deepseek-r1:14b",
        "RTX_4090-vastai-deepseek-r1:32b",
    ]
    assert len(k_select(cells, "32b")) == 6
    assert k_select(cells, "70b") == ["H200_NVL-vastai-deepseek-r1:70b"]
    # the compact GPU name works through cell.keywords
    assert len(k_select(cells, "RTX4090")) == 6
    assert k_select(cells, "rtx5060ti") == ["RTX_5060_Ti-vastai-qwen2:1.5b"]


def test_keywords():
    cell = load_cells(QUICK)[0]
    assert {"RTX4090", "qwen2:7b", "qwen2"} <= cell.keywords
    assert cell.reuse_group == "RTX_4090-vastai"


# -------------------------------------------------------------------------- filters


@pytest.mark.parametrize("wanted", ["RTX4090", "RTX 4090", "rtx 4090", "RTX-4090", "rtx_4090"])
def test_gpu_matches_ignoring_case_spaces_hyphens(wanted):
    assert gpu_matches(wanted, "RTX 4090")


@pytest.mark.parametrize("wanted,gpu_type", [
    ("A100", "A100 80GB"), ("RTX 4090", "RTX 4090 D"), ("4090", "RTX 4090"), ("", "RTX 4090"),
])
def test_gpu_matches_is_exact(wanted, gpu_type):
    assert not gpu_matches(wanted, gpu_type)


def test_normalize_gpu():
    assert normalize_gpu("RTX 5060 Ti") == "rtx5060ti"
    assert normalize_gpu("A100_80GB") == normalize_gpu("a100-80gb") == "a10080gb"


def test_provider_matches():
    assert provider_matches("vastai", "vastai")
    assert provider_matches("Vast.ai", "vastai")
    assert provider_matches("TensorDock", "tensordock")
    assert not provider_matches("vast", "vastai")
    assert not provider_matches("", "vastai")


@pytest.mark.parametrize("wanted,model,expected", [
    ("deepseek-r1", "deepseek-r1:14b", True),
    ("deepseek-r1", "deepseek-r1:70b", True),
    ("deepseek-r1:32b", "deepseek-r1:14b", False),
    ("deepseek-r1:32b", "deepseek-r1:32b", True),
    ("DeepSeek-R1:32B", "deepseek-r1:32b", True),
    ("deepseek", "deepseek-r1:14b", False),
    ("llama3", "llama3", True),
    ("llama3:latest", "llama3", True),
    ("llama3", "llama3:latest", True),
    ("llama3:latest", "llama3:8b", False),
    ("qwen2", "qwen2:1.5b", True),
    ("qwen2:7b", "qwen2:7b-instruct", False),
])
def test_model_matches(wanted, model, expected):
    assert model_matches(wanted, model) is expected


def test_model_ref():
    assert model_ref("llama3") == "llama3:latest"
    assert model_ref("qwen2:7b") == "qwen2:7b"
    assert model_ref("ns/model") == "ns/model:latest"


def test_cell_selected():
    cells = load_cells(SEED)
    ids = lambda **f: [c.cell_id for c in cells if cell_selected(c, **f)]  # noqa: E731
    assert len(ids()) == 21
    assert len(ids(gpus=["RTX4090"])) == 6
    assert ids(gpus=["A100"]) == []
    assert len(ids(gpus=["A100 80GB"])) == 3
    assert len(ids(providers=["tensordock"])) == 6
    assert len(ids(models=["deepseek-r1"])) == 13
    assert ids(gpus=["rtx-4090"], providers=["TensorDock"], models=["deepseek-r1:32b"]) == [
        "RTX_4090-tensordock-deepseek-r1:32b"
    ]
    assert len(ids(gpus=["RTX4090", "RTX 3090"], models=["qwen2:7b"])) == 4
    assert len(ids(gpus=["RTX4090,RTX3090"])) == 12
    assert len(select_cells(cells, providers=["vastai"])) == 15


# ----------------------------------------------------------------------------- VRAM


def test_vram_table_is_seed_000s():
    assert dict(MODEL_VRAM_GB) == {
        "llama3:8b": 8, "llama3:70b": 48, "mistral:7b": 8, "phi3:mini": 4, "phi3:medium": 16,
        "codellama:34b": 24, "deepseek-r1:14b": 12, "deepseek-r1:32b": 24, "deepseek-r1:70b": 48,
    }


def test_inference_rule_reproduces_the_table():
    sized = {m: gb for m, gb in MODEL_VRAM_GB.items() if infer_parameters_b(m) is not None}
    # phi3:mini and phi3:medium name no size in their tag: the table alone covers them
    assert set(MODEL_VRAM_GB) - set(sized) == {"phi3:mini", "phi3:medium"}
    for model, gb in sized.items():
        params = infer_parameters_b(model)
        assert max(4, math.ceil(params * 0.65 / 4) * 4) == gb, model
        assert infer_vram_gb(model) == gb, model


@pytest.mark.parametrize("model,params,gb", [
    ("qwen2:7b", 7, 8), ("qwen2:1.5b", 1.5, 4), ("x:0.5b", 0.5, 4), ("y:8x7b", 56, 40),
    ("smollm:135m", 0.135, 4), ("llama3:8b-instruct-q4_K_M", 8, 8), ("qwen3:30b-a3b", 30, 20),
    ("gemma2:27b", 27, 20), ("hf.co/org/Model-GGUF:14B", 14, 12), ("llama3.1:405b", 405, 264),
])
def test_vram_inferred_from_tag(model, params, gb):
    assert infer_parameters_b(model) == pytest.approx(params)
    assert infer_vram_gb(model) == gb


@pytest.mark.parametrize("model,params,gb", [
    ("llama-7b", 7, 8), ("Qwen/Qwen2.5-7B-Instruct", 7, 8), ("deepseek-r1:70b", 70, 48),
    ("mixtral-8x7b", 56, 40), ("meta-llama/Llama-3.1-70B-Instruct", 70, 48), ("Qwen/Qwen3-30B-A3B", 30, 20),
    ("qwen2.5-0.5b-instruct-q4_k_m.gguf", 0.5, 4), ("llama-7b:latest", 7, 8),
    ("hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", 3, 4),
    # the tag, more specific than the name, wins where both state a size
    ("llama-70b:8b", 8, 8),
])
def test_vram_inferred_from_the_name_when_the_tag_states_no_size(model, params, gb):
    """Issue 23 item 9: the size is read wherever the name states it, not only after ':'."""
    assert infer_parameters_b(model) == pytest.approx(params)
    assert infer_vram_gb(model) == gb


@pytest.mark.parametrize("model", ["phi4", "llama3:latest", "phi3:mini-4k", "x:q4_0", "x:4bit", "phi3:mini",
                                   "Qwen/Qwen2.5-Instruct", "org-7b/model", "gpt2-medium", "model-v1.5b2"])
def test_no_size_in_tag(model):
    """A size glued to other letters or digits is none, nor is the organisation before the last '/'."""
    assert infer_vram_gb(model) is None


def test_model_vram_gb_prefers_override_then_table():
    assert model_vram_gb("phi3:medium") == 16
    assert model_vram_gb("qwen2:7b") == 8
    assert model_vram_gb("qwen2:7b", {"qwen2:7b": 6}) == 6
    assert model_vram_gb("phi4") is None


def test_per_model_override_in_file(tmp_path):
    cells = cells_of(tmp_path, """\
        models:
          qwen2:7b: {vram_gb: 6}
          phi4: {vram_gb: 12}
          deepseek-r1:70b: {vram_gb: 80}
        matrix:
          - gpu: RTX 4090
            provider: vastai
            models: [qwen2:7b, phi4, qwen2:1.5b]
          - {gpu: H200 NVL, provider: vastai, model: deepseek-r1:70b}
        """)
    assert [c.vram_gb for c in cells] == [6, 12, 4, 80]
    assert cells[1].model_ref == "phi4:latest"


# ------------------------------------------------------------------ overrides, merging


def test_defaults_without_workload_or_offer(tmp_path):
    (cell,) = cells_of(tmp_path, ONE_ROW)
    w = cell.workload
    assert (w.duration, w.max_tokens, w.warmup_requests, w.progress_interval) == (300, 256, 1, 60)
    assert w.checkpoint_every == 10 and w.prompts == SEED_PROMPTS
    assert cell.offer.max_price is None and cell.offer.min_availability_confidence == 0.5
    assert cell.ollama_install is None and cell.runtime == "ollama"
    assert cell.matrix_name == "test"  # from gpubench_test.yaml
    assert cell.source.endswith("gpubench_test.yaml") and cell.row == 0


def test_runtime_is_a_name_or_a_mapping_and_rows_override_it_key_by_key(tmp_path):
    cells = cells_of(tmp_path, """\
        runtime: {name: Ollama, ollama_install: "echo file"}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, runtime: {ollama_install: "echo row"}}
          - {gpu: RTX 3080, provider: vastai, model: qwen2:7b, runtime: ollama}
        """)
    assert [(c.runtime, c.ollama_install) for c in cells] == [
        ("ollama", "echo file"), ("ollama", "echo row"), ("ollama", "echo file")]
    (alone,) = cells_of(tmp_path, "runtime: ollama\n" + ONE_ROW)
    assert (alone.runtime, alone.ollama_install) == ("ollama", None)


def test_row_workload_and_offer_merge_over_file(tmp_path):
    cells = cells_of(tmp_path, """\
        name: merge
        workload: {duration: 5m, max_tokens: 100, prompts: [a, b]}
        offer:
          max_price: 1.5
          min_availability_confidence: {default: 0.5, tensordock: 0.2}
        runtime: {ollama_install: "curl -fsSL https://example.test/install.sh | sh"}
        matrix:
          - gpu: RTX 4090
            providers: [vastai, tensordock]
            model: qwen2:7b
            workload: {duration: 120}
            offer: {max_price: 0.6}
          - gpu: RTX 3090
            providers: [vastai, tensordock]
            model: qwen2:7b
            offer: {max_price: null, min_availability_confidence: {tensordock: 0.1}}
          - gpu: A100 80GB
            providers: [vastai, tensordock]
            model: qwen2:7b
            offer: {min_availability_confidence: 0.4}
        """)
    got = [(c.workload.duration, c.workload.max_tokens, c.offer.max_price,
            c.offer.min_availability_confidence) for c in cells]
    assert got == [
        (120, 100, 0.6, 0.5), (120, 100, 0.6, 0.2),
        (300, 100, None, 0.5), (300, 100, None, 0.1),
        (300, 100, 1.5, 0.4), (300, 100, 1.5, 0.4),  # a plain number: every provider
    ]
    assert all(c.workload.prompts == ("a", "b") for c in cells)
    assert all(c.ollama_install.startswith("curl") for c in cells)
    assert all(c.matrix_name == "merge" for c in cells)


def test_plain_number_confidence_applies_to_all_providers(tmp_path):
    cells = cells_of(tmp_path, """\
        offer: {min_availability_confidence: 0.25}
        matrix:
          - {gpu: RTX 4090, providers: [vastai, tensordock, bluelobster], model: qwen2:7b}
        """)
    assert {c.offer.min_availability_confidence for c in cells} == {0.25}


def test_provider_spellings_are_normalised(tmp_path):
    cells = cells_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, providers: [Vast.ai, TensorDock], model: qwen2:7b}
        """)
    assert [c.provider for c in cells] == ["vastai", "tensordock"]


def test_cells_are_frozen_and_hashable():
    cell = load_cells(QUICK)[0]
    with pytest.raises(ValidationError):
        cell.gpu = "RTX 3090"
    with pytest.raises(ValidationError):
        cell.workload.duration = 1
    assert len(set(load_cells(QUICK))) == 4


@pytest.mark.parametrize("text,seconds", [
    ("5m", 300), ("90s", 90), ("1h", 3600), ("1h30m", 5400), ("2m30s", 150), ("1.5m", 90),
    ("300", 300), (" 10 s ", 10), (45, 45), (2.5, 2.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_duration_strings_in_file(tmp_path):
    (cell,) = cells_of(tmp_path, """\
        workload: {duration: 5m, progress_interval: 30s}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {duration: 1h}}
        """)
    assert (cell.workload.duration, cell.workload.progress_interval) == (3600, 30)
    assert cell.workload.duration_minutes == 60


# --------------------------------------------------------------------------- errors


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text, "gpubench_bad.yaml")
    with pytest.raises(MatrixError) as info:
        load_cells(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": ")
    assert "\n" not in message
    return message


def assert_all_in(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


def test_error_yaml_syntax_has_line(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - gpu: RTX 4090\n    provider: [vastai\n")
    assert_all_in(msg, "gpubench_bad.yaml", "line 4", "invalid YAML", "expected ',' or ']'")


def test_error_duplicate_yaml_key(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - gpu: RTX 4090\n    gpu: RTX 3090\n")
    assert_all_in(msg, "line 3", "duplicate key 'gpu'", "first at line 2")


def test_error_file_missing(tmp_path):
    with pytest.raises(MatrixError, match="cannot read the file"):
        load_matrix(tmp_path / "gpubench_none.yaml")


@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "a list"), ("just text\n", "'just text'")])
def test_error_top_level_not_mapping(tmp_path, text, kind):
    msg = error_of(tmp_path, text)
    assert_all_in(msg, "top level must be a mapping", "`matrix:`", kind)


def test_error_empty_file(tmp_path):
    assert_all_in(error_of(tmp_path, "# nothing\n"), "the file is empty", "`matrix:`")


def test_error_unknown_top_level_key(tmp_path):
    msg = error_of(tmp_path, "matrx: []\n")
    assert_all_in(msg, ": matrx: unknown key", "did you mean 'matrix'", "allowed keys: name, "
                  "description, workload, offer, runtime, models, matrix", "line 1")


def test_error_unknown_row_workload_key(tmp_path):
    msg = error_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - gpu: RTX 3090
            provider: vastai
            model: qwen2:7b
            workload: {durration: 5}
        """)
    assert_all_in(msg, "matrix[1].workload.durration: unknown key", "did you mean 'duration'",
                  "allowed keys: duration, max_tokens, warmup_requests, progress_interval, "
                  "checkpoint_every, prompts", "line 6")


def test_error_unknown_row_key(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, modle: qwen2:7b}\n")
    assert_all_in(msg, "matrix[0].modle: unknown key", "allowed keys: gpu, provider, providers, "
                  "model, models, workload, offer")


def test_error_wrong_type(tmp_path):
    msg = error_of(tmp_path, "workload: {max_tokens: lots}\n" + ONE_ROW)
    assert_all_in(msg, "workload.max_tokens: must be a whole number from 1 to 131072", "'lots'")


def test_error_row_not_mapping(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - RTX 4090\n")
    assert_all_in(msg, "matrix[0]: must be a mapping", "'RTX 4090'", "line 2")


def test_error_missing_gpu(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {provider: vastai, model: qwen2:7b}\n")
    assert_all_in(msg, "matrix[0].gpu: required key is missing", "line 2")


@pytest.mark.parametrize("value,shown", [("-5", "-5"), ("0", "0"), ("48h", "'48h'"),
                                         ("3d", "'3d'"), ("soon", "'soon'"), ("true", "true")])
def test_error_bad_duration(tmp_path, value, shown):
    msg = error_of(tmp_path, f"""\
        matrix:
          - {{gpu: RTX 4090, provider: vastai, model: qwen2:7b}}
          - {{gpu: RTX 3090, provider: vastai, model: qwen2:7b}}
          - gpu: A100 80GB
            provider: vastai
            model: qwen2:7b
            workload: {{duration: {value}}}
        """)
    assert_all_in(msg, "matrix[2].workload.duration: must be a number of seconds",
                  "'90s', '5m'", "more than 0 and at most 24h", f"got {shown}", "line 7")


def test_error_null_in_row_override(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                             "workload: {max_tokens: null}}\n")
    assert_all_in(msg, "matrix[0].workload.max_tokens: must not be null", "leave the key out")


def test_error_negative_price(tmp_path):
    msg = error_of(tmp_path, "offer: {max_price: -1}\n" + ONE_ROW)
    assert_all_in(msg, "offer.max_price: must be a price in dollars per hour, more than 0",
                  "null for no cap", "got -1")


def test_error_row_price(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                             "offer: {max_price: cheap}}\n")
    assert_all_in(msg, "matrix[0].offer.max_price: must be a price", "'cheap'")


@pytest.mark.parametrize("value,expect", [
    ("1.5", "must be a number from 0 to 1, or a mapping such as {default: 0.5, tensordock: 0.2}"),
    ("{vast: 0.1}", "unknown key 'vast'; allowed keys: default, vastai, tensordock, bluelobster"),
    ("{tensordock: -1}", "must be a number from 0 to 1"),
])
def test_error_confidence(tmp_path, value, expect):
    msg = error_of(tmp_path, f"offer: {{min_availability_confidence: {value}}}\n" + ONE_ROW)
    assert_all_in(msg, "offer.min_availability_confidence: ", expect)


def test_error_empty_prompts(tmp_path):
    msg = error_of(tmp_path, "workload: {prompts: []}\n" + ONE_ROW)
    assert_all_in(msg, "workload.prompts: must be a non-empty list of non-empty strings",
                  "an empty list")


def test_error_blank_prompt(tmp_path):
    msg = error_of(tmp_path, "workload: {prompts: [ok, '  ']}\n" + ONE_ROW)
    assert_all_in(msg, "workload.prompts: must be a non-empty list of non-empty strings", "item 1")


def test_error_row_without_model(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai}\n")
    assert_all_in(msg, "matrix[0]: needs `model: ...` or `models: [...]`", "line 2")


def test_error_row_without_provider(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, model: qwen2:7b}\n")
    assert_all_in(msg, "matrix[0]: needs `provider: ...` or `providers: [...]`")


def test_error_provider_and_providers(tmp_path):
    msg = error_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, providers: [tensordock], model: qwen2:7b}
        """)
    assert_all_in(msg, "matrix[1]: give either `provider` or `providers`, not both", "line 3")


def test_error_empty_models_list(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, models: []}\n")
    assert_all_in(msg, "matrix[0]: `models` is empty; list at least one")


def test_error_empty_matrix(tmp_path):
    msg = error_of(tmp_path, "name: x\nmatrix: []\n")
    assert_all_in(msg, "matrix: the matrix has no rows", "gpu: RTX 4090", "line 2")


def test_error_missing_matrix(tmp_path):
    msg = error_of(tmp_path, "name: x\n")
    assert_all_in(msg, ": matrix: required key is missing")


def test_error_unknown_provider(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, providers: [vastai, vast], "
                             "model: qwen2:7b}\n")
    assert_all_in(msg, "matrix[0].providers[1]: unknown provider 'vast'",
                  "did you mean 'vastai'", "known providers: " + ", ".join(KNOWN_PROVIDERS))


def test_error_bad_model_name(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, "
                             "model: 'qwen2:7b; rm -rf /'}\n")
    assert_all_in(msg, "matrix[0].model: not a valid Ollama model name", "NAME:TAG")


def test_error_bad_gpu_name(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: 'RTX::4090', provider: vastai, model: x:7b}\n")
    assert_all_in(msg, "matrix[0].gpu: must be a GPU name", "'RTX 4090'", "'RTX::4090'")


def test_error_duplicate_cell_names_both_rows(tmp_path):
    msg = error_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b}
          - {gpu: rtx-4090, providers: [tensordock, Vast.ai], models: [qwen2:7b]}
        """)
    assert_all_in(msg, "matrix[2]: duplicate cell", "already in matrix[0] (line 2)",
                  "may appear once", "line 4")


def test_error_duplicate_cell_via_latest(tmp_path):
    msg = error_of(tmp_path, "models: {llama3: {vram_gb: 8}}\nmatrix:\n  - {gpu: RTX 4090, "
                             "provider: vastai, models: [llama3, 'llama3:latest']}\n")
    assert_all_in(msg, "matrix[0]: duplicate cell", "already in matrix[0]")


def test_error_unknown_vram(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, "
                             "models: [qwen2:7b, phi4]}\n")
    assert_all_in(msg, "matrix[0].models[1]: cannot tell how much VRAM 'phi4' needs",
                  "its name states no size such as '7b'", "`models: {phi4: {vram_gb: N}}`")


def test_a_size_in_the_name_collects(tmp_path):
    """docs/runtimes.md's `model: llama-7b` and a Hugging Face repo id need no `models:` entry."""
    cells = cells_of(tmp_path, "runtime: vllm\nmatrix:\n  - {gpu: H100, provider: vastai, "
                               "models: [llama-7b, Qwen/Qwen2.5-7B-Instruct, mixtral-8x7b]}\n")
    assert [(c.model, c.vram_gb) for c in cells] == [
        ("llama-7b", 8), ("Qwen/Qwen2.5-7B-Instruct", 8), ("mixtral-8x7b", 40)]


def test_error_bad_vram_override(tmp_path):
    msg = error_of(tmp_path, "models: {'qwen2:1.5b': {vram_gb: 0}}\n" + ONE_ROW)
    assert_all_in(msg, "models['qwen2:1.5b'].vram_gb: must be a whole number from 1 to 4096")


def test_error_counts_further_problems(tmp_path):
    msg = error_of(tmp_path, "workload: {duration: -1, max_tokens: 0}\nmatrix: 5\n")
    assert_all_in(msg, "workload.duration:", "; and 2 more problems")
    assert "pydantic" not in msg and "validation error" not in msg


def test_error_bad_name(tmp_path):
    msg = error_of(tmp_path, "name: 'my matrix'\n" + ONE_ROW)
    assert_all_in(msg, "name: must be letters, digits", "'my matrix'")


# ---------------------------------------------------------------- load axes and ids


def test_concurrency_axis_expands_to_one_cell_per_value(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {concurrency: [1, 8, 32]}
        matrix:
          - {gpu: RTX 4090, provider: vastai, models: [qwen2:7b, qwen2:1.5b]}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-c8", "RTX_4090-vastai-qwen2:7b-c32",
        "RTX_4090-vastai-qwen2:1.5b", "RTX_4090-vastai-qwen2:1.5b-c8",
        "RTX_4090-vastai-qwen2:1.5b-c32",
    ]
    assert [(c.concurrency, c.rate) for c in cells[:3]] == [(1, None), (8, None), (32, None)]
    # a cell's workload holds only its own load point
    assert [c.workload.concurrency for c in cells[:3]] == [(1,), (8,), (32,)]
    assert all(c.workload.rate is None for c in cells)
    assert {c.reuse_group for c in cells} == {"RTX_4090-vastai"}
    assert cells[1].keywords == cells[0].keywords


def test_single_concurrency_and_row_override(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {concurrency: 4}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {concurrency: [1, 2]}}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b-c4", "RTX_3090-vastai-qwen2:7b", "RTX_3090-vastai-qwen2:7b-c2",
    ]


def test_rate_axis_ids(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {rate: [0.5, 2, 2.5], concurrency: 1}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b-r0.5", "RTX_4090-vastai-qwen2:7b-r2",
        "RTX_4090-vastai-qwen2:7b-r2.5",
    ]
    assert [(c.concurrency, c.rate) for c in cells] == [(1, 0.5), (1, 2.0), (1, 2.5)]
    assert cells[2].workload.rate == (2.5,) and cells[2].workload.concurrency == (1,)


def test_row_rate_over_file_concurrency_of_one(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {concurrency: [1, 8]}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {rate: 3, concurrency: 1}}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-c8", "RTX_3090-vastai-qwen2:7b-r3",
    ]


def test_row_rate_null_drops_the_files_rate(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {rate: 2}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b,
             workload: {rate: null, concurrency: [1, 16]}}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b-r2", "RTX_3090-vastai-qwen2:7b", "RTX_3090-vastai-qwen2:7b-c16",
    ]


def test_existing_ids_have_no_load_suffix():
    for cell in load_cells(SEED) + load_cells(QUICK):
        assert (cell.concurrency, cell.rate) == (1, None)
        assert cell.cell_id == cell_id(cell.gpu, cell.provider, cell.model)
        assert not cell.cell_id.endswith(("-c1", "-r"))


@pytest.mark.parametrize("concurrency,rate,suffix", [
    (1, None, ""), (8, None, "-c8"), (1, 2.5, "-r2.5"), (1, 2.0, "-r2"), (1, 0.00001, "-r0.00001"),
    (1, 1000, "-r1000"),
])
def test_cell_id_load_suffix(concurrency, rate, suffix):
    assert cell_id("RTX 4090", "vastai", "qwen2:7b", concurrency, rate) == (
        "RTX_4090-vastai-qwen2:7b" + suffix)


def test_k_selects_a_load_point(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {concurrency: [1, 8]}
        matrix:
          - {gpu: RTX 4090, providers: [vastai, tensordock], model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {concurrency: 1, rate: 2.5}}
        """)
    assert k_select(cells, "c8") == ["RTX_4090-vastai-qwen2:7b-c8", "RTX_4090-tensordock-qwen2:7b-c8"]
    assert k_select(cells, "r2.5") == ["RTX_3090-vastai-qwen2:7b-r2.5"]


def test_same_model_at_two_loads_in_two_rows_is_no_duplicate(tmp_path):
    cells = cells_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {concurrency: 8}}
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {rate: 1}}
        """)
    assert [c.cell_id for c in cells] == [
        "RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-c8", "RTX_4090-vastai-qwen2:7b-r1",
    ]


def test_error_duplicate_cell_includes_the_load(tmp_path):
    msg = error_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {concurrency: [1, 8]}}
          - {gpu: rtx-4090, provider: vastai, model: qwen2:7b, workload: {concurrency: [8, 32]}}
        """)
    assert_all_in(msg, "matrix[1]: duplicate cell rtx-4090-vastai-qwen2:7b-c8",
                  "/ concurrency 8)", "already in matrix[0] (line 2)", "model and load", "line 3")


@pytest.mark.parametrize("where", ["file", "row"])
def test_error_concurrency_and_rate_in_one_workload(tmp_path, where):
    workload = "{concurrency: [1, 8], rate: 2.5}"
    text = (f"workload: {workload}\n" + ONE_ROW if where == "file" else
            f"matrix:\n  - {{gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {workload}}}\n")
    msg = error_of(tmp_path, text)
    field = "workload: " if where == "file" else "matrix[0].workload: "
    assert_all_in(msg, field + "`concurrency: [1, 8]` and `rate: 2.5` cannot be combined",
                  "Poisson", "only `concurrency: 1` may go with a rate")


@pytest.mark.parametrize("file,row,origins", [
    ("{concurrency: [1, 8]}", "{rate: 2}",
     "`concurrency` comes from the file's workload and `rate` from this row"),
    ("{rate: 2}", "{concurrency: 4}",
     "`concurrency` comes from this row and `rate` from the file's workload"),
])
def test_error_load_axes_conflict_across_file_and_row(tmp_path, file, row, origins):
    msg = error_of(tmp_path, f"""\
        workload: {file}
        matrix:
          - {{gpu: RTX 4090, provider: vastai, model: qwen2:7b}}
          - {{gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {row}}}
        """)
    assert_all_in(msg, "matrix[1].workload: `concurrency:", "`rate: 2`", "cannot be combined",
                  origins, "set `concurrency: 1`, or `rate: null`", "line 4")


@pytest.mark.parametrize("value,shown", [
    ("0", "got 0"), ("2000", "got 2000"), ("1.5", "got 1.5"), ("true", "got true"),
    ("'8'", "got '8'"), ("[]", "got an empty list"), ("[1, x]", "got item 1 is 'x'"),
    ("[1, 8, 8]", "8 is listed twice"),
])
def test_error_bad_concurrency(tmp_path, value, shown):
    msg = error_of(tmp_path, f"workload: {{concurrency: {value}}}\n" + ONE_ROW)
    assert_all_in(msg, "workload.concurrency: must be a whole number of requests in flight from 1 "
                  "to 1024, a non-empty list of them such as [1, 8, 32] (a cell each), or `sweep` for a "
                  "concurrency sweep on one session", shown, "line 1")


@pytest.mark.parametrize("value,shown", [
    ("0", "got 0"), ("-1", "got -1"), ("1001", "got 1001"), ("fast", "got 'fast'"),
    ("[]", "got an empty list"), ("[1, .nan]", "got item 1 is nan"), ("[2, 2.0]", "listed twice"),
])
def test_error_bad_rate(tmp_path, value, shown):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                             f"workload: {{rate: {value}}}}}\n")
    assert_all_in(msg, "matrix[0].workload.rate: must be a number of requests per second, more "
                  "than 0 and at most 1000, a non-empty list of them such as [0.5, 1, 2.5], or `sweep` for a "
                  "saturation sweep", shown)


def test_error_lists_the_new_workload_keys(tmp_path):
    msg = error_of(tmp_path, "workload: {concurrancy: 8}\n" + ONE_ROW)
    assert_all_in(msg, "workload.concurrancy: unknown key (did you mean 'concurrency'?)",
                  "allowed keys: duration, max_tokens, warmup_requests, progress_interval, "
                  "checkpoint_every, prompts, concurrency, rate, sweep, runs, telemetry_interval")


def test_expanded_cells_are_what_validation_would_build(tmp_path):
    """Expansion builds cells without validating them and hands them their id and names:
    the same values as validating the cell and computing each name."""
    cells = cells_of(tmp_path, """\
        workload: {concurrency: [1, 8]}
        offer: {template: 9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6}
        matrix:
          - {gpu: RTX 4090, providers: [vastai, tensordock], models: [library/qwen2:7b, llama3:8b]}
          - {gpu: A100 80GB, provider: vastai, model: qwen2:7b, workload: {rate: [0.5, 2], concurrency: 1},
             reuse: cell, offer: {template: null}, runtime: {ollama_install: "echo row"}}
        """)
    assert len(cells) == 10
    for cell in cells:
        validated = Cell.model_validate(dict(cell))
        assert cell == validated and repr(cell) == repr(validated)
        assert cell.model_fields_set == set(Cell.model_fields) - {"session_part"}
        for name in ("cell_id", "gpu_compact", "reuse_group", "keywords"):
            assert getattr(cell, name) == getattr(validated, name), name
    assert cells[1].cell_id == "RTX_4090-vastai-library_qwen2:7b-c8"
    assert cells[0].reuse_group == "RTX_4090-vastai-t9b2f3c0e8d7a"
    assert cells[-1].cell_id == "A100_80GB-vastai-qwen2:7b-r2" and cells[-1].reuse_group == "A100_80GB-vastai"


def test_prototype_checks_the_fields_once_and_the_values_given_for_each():
    from pytest_gpubench.matrix.prototype import Prototype

    shared = {"ttft_ms": 100.0}
    with pytest.raises(TypeError, match=r"unknown \['p99_ms'\]"):
        Prototype(Slo, shared, varying=("p99_ms",))
    with pytest.raises(TypeError, match=r"missing \['gpu'"):
        Prototype(Cell, {}, varying=())
    class Loose(BaseModel):
        x: int = 0

    with pytest.raises(TypeError, match="not frozen"):
        Prototype(Loose, {}, varying=("x",))
    slos = Prototype(Slo, shared, varying=("e2e_ms",))
    slo = slos.new(e2e_ms=5.0)
    assert slo == Slo(ttft_ms=100.0, e2e_ms=5.0) and slo.model_fields_set == {"ttft_ms", "e2e_ms"}
    with pytest.raises(TypeError, match="expected"):
        slos.new(tpot_ms=5.0)
    # the instances share their fields set: a copy takes its own, assignment is refused
    copied = slo.model_copy(update={"tpot_ms": 1.0})
    assert copied.model_fields_set == {"ttft_ms", "e2e_ms", "tpot_ms"}
    assert slos.new(e2e_ms=1.0).model_fields_set == slo.model_fields_set == {"ttft_ms", "e2e_ms"}
    with pytest.raises(ValidationError):
        slo.tpot_ms = 2.0


# ------------------------------------------------------------------------------ runs


def test_runs_default_is_one():
    (cell,) = load_cells(QUICK)[:1]
    assert cell.runs == Runs(count=1, until_cv=None, min=1, max=1) == cell.workload.runs
    assert str(cell.runs) == "1"


def test_runs_forms(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {runs: 3}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b,
             workload: {runs: {until_cv: 2%, max: 10, min: 3}}}
          - {gpu: A100 80GB, provider: vastai, model: qwen2:7b, workload: {runs: {until_cv: 0.05}}}
        """)
    assert cells[0].runs == Runs.fixed(3) == Runs(count=3, until_cv=None, min=3, max=3)
    assert cells[1].runs == Runs(count=None, until_cv=0.02, min=3, max=10)
    assert cells[2].runs == Runs(count=None, until_cv=0.05, min=3, max=10)  # min 3, max 10 by default
    assert str(cells[1].runs) == "until CV <= 2% (3 to 10 runs)"
    with pytest.raises(ValidationError):
        cells[1].runs.max = 3


def test_runs_finished():
    fixed, adaptive = Runs.fixed(3), Runs(count=None, until_cv=0.02, min=3, max=5)
    assert [fixed.finished(n) for n in (1, 2, 3)] == [False, False, True]
    assert not adaptive.finished(2, cv=0.0)       # below min: keep going whatever the CV
    assert not adaptive.finished(3, cv=0.021)     # CV still above the bar
    assert adaptive.finished(3, cv=0.02)          # at the bar: done
    assert not adaptive.finished(4, cv=None)      # no CV yet
    assert adaptive.finished(5, cv=0.5)           # max reached


@pytest.mark.parametrize("value,expect", [
    ("0", "must be a whole number of runs from 1 to 100, or a mapping such as {until_cv: '2%', "
          "min: 3, max: 10}; got 0"),
    ("101", "got 101"), ("true", "got true"), ("'3'", "got '3'"), ("[3]", "got a list"),
    ("{max: 5}", "`until_cv` is required in the mapping form"),
    ("{until_cv: 2}", "`until_cv` must be a fraction such as 0.02 or a percentage such as '2%', "
                      "more than 0 and at most 100%; got 2"),
    ("{until_cv: 0}", "got 0"), ("{until_cv: '2 percent'}", "got '2 percent'"),
    ("{until_cv: 2%, min: 1}", "`min` must be a whole number of runs from 2 to 100"),
    ("{until_cv: 2%, max: 200}", "`max` must be a whole number of runs from 2 to 100"),
    ("{until_cv: 2%, min: 5, max: 3}", "`min` (5) is more than `max` (3)"),
    ("{until: 2%}", "unknown key 'until' (did you mean 'until_cv'?); allowed keys: until_cv, min, max"),
])
def test_error_bad_runs(tmp_path, value, expect):
    msg = error_of(tmp_path, f"workload: {{runs: {value}}}\n" + ONE_ROW)
    assert_all_in(msg, "workload.runs: ", expect, "line 1")


def test_error_runs_null_in_row(tmp_path):
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                             "workload: {runs: null}}\n")
    assert_all_in(msg, "matrix[0].workload.runs: must not be null")


# --------------------------------------------------------------------------- prompts


def test_prompt_forms(tmp_path):
    (cell,) = cells_of(tmp_path, """\
        workload:
          prompts:
            - Write a haiku about GPUs.
            - {prompt: "What is 2 + 2?", expect: ["4", "four"]}
            - {prompt: "Capital of Italy?", expect: Rome}
            - {prompt: "Say hello."}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
        """)
    prompts = cell.workload.prompts
    assert all(isinstance(p, Prompt) for p in prompts)
    assert [p.text for p in prompts] == ["Write a haiku about GPUs.", "What is 2 + 2?",
                                         "Capital of Italy?", "Say hello."]
    assert [p.expect for p in prompts] == [(), ("4", "four"), ("Rome",), ()]
    assert cell.workload.prompt_payload() == [
        "Write a haiku about GPUs.",
        {"prompt": "What is 2 + 2?", "expect": ["4", "four"]},
        {"prompt": "Capital of Italy?", "expect": ["Rome"]},
        "Say hello.",
    ]
    assert cell.workload.has_expectations and cell.workload.prompt_set is None


def test_prompts_still_serialise_as_their_texts():
    # code that sends list(workload.prompts) as JSON keeps working (texts only)
    workload = Workload(prompts="quality")
    assert json.loads(json.dumps(list(workload.prompts))) == [p.text for p in QUALITY_PROMPTS]
    assert json.loads(json.dumps(workload.prompt_payload()))[0] == {
        "prompt": "What is 15 + 27? Answer with just the number.", "expect": ["42"]}


@pytest.mark.parametrize("name", ["quality", "Quality", " quality "])
def test_built_in_quality_set(tmp_path, name):
    (cell,) = cells_of(tmp_path, f"workload: {{prompts: '{name}'}}\n" + ONE_ROW)
    assert cell.workload.prompts == QUALITY_PROMPTS == PROMPT_SETS["quality"]
    assert cell.workload.prompt_set == "quality"


def test_built_in_seed_set_is_the_default(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {prompts: quality}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {prompts: seed}}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b}
        """)
    assert cells[0].workload.prompts == SEED_PROMPTS == Workload().prompts
    assert cells[0].workload.prompt_set == Workload().prompt_set == "seed"
    assert not cells[0].workload.has_expectations
    assert cells[1].workload.prompt_set == "quality"


def test_quality_prompts_follow_the_gpu_shopper_script():
    by_expect = {p.expect: p.text for p in QUALITY_PROMPTS}
    assert "15 + 27" in by_expect[("42",)]
    assert "Python function" in by_expect[("def", "return")]
    assert "capital of France" in by_expect[("Paris",)]
    assert "primary colors" in by_expect[("red", "blue")]
    assert "haiku" in by_expect[()]  # no expectation: not counted in the match rate
    assert sum(bool(p.expect) for p in QUALITY_PROMPTS) == 4


def test_prompt_matches_any_substring_ignoring_case():
    prompt = Prompt("What is 2 + 2?", expect=("4", "Four"))
    assert prompt.matches("The answer is FOUR.") is True
    assert prompt.matches("2 + 2 = 4") is True
    assert prompt.matches("five") is False
    assert Prompt("Write a haiku.").matches("anything") is None
    code = next(p for p in QUALITY_PROMPTS if "def" in p.expect)
    assert code.matches("DEF square(x):\n    RETURN x * x")


def test_prompt_is_an_immutable_string_value():
    plain, checked = Prompt("a"), Prompt("a", expect=["x"])
    assert plain == "a" and "a" == plain and plain.text == "a" and type(plain.text) is str
    assert checked != "a" and "a" != checked and checked != plain
    assert checked == Prompt("a", ("x",)) and hash(checked) == hash(Prompt("a", ("x",)))
    assert checked.expect == ("x",)
    assert repr(checked) == "Prompt('a', expect=('x',))"
    with pytest.raises(AttributeError):
        checked.expect = ()
    for copied in (pickle.loads(pickle.dumps(checked)), copy.deepcopy(checked)):
        assert copied == checked and copied.expect == ("x",)


def test_workload_round_trips_through_its_dump(tmp_path):
    (cell,) = cells_of(tmp_path, """\
        workload: {prompts: quality, runs: {until_cv: 3%}, rate: 2, telemetry_interval: 10s}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
        """)
    assert Workload.model_validate(cell.workload.model_dump()) == cell.workload
    assert Workload.model_validate_json(cell.workload.model_dump_json()) == cell.workload
    assert "prompts" in Workload.model_json_schema()["properties"]


@pytest.mark.parametrize("value,expect", [
    ("qualty", "unknown prompt set 'qualty' (did you mean 'quality'?); built-in sets: seed, "
               "quality; a single prompt is still a list"),
    ("[{prompt: '  '}]", "item 0: `prompt` must be a non-empty string; got '  '"),
    ("[{expect: [x]}]", "item 0: `prompt` must be a non-empty string; got nothing (null)"),
    ("[ok, {prompt: q, expect: []}]", "item 1: `expect` must be a non-empty string or a "
                                      "non-empty list of them, such as ['4', 'four']; got an empty list"),
    ("[{prompt: q, expect: [4]}]", "got 4 in it"),
    ("[{prompt: q, expect: ['']}]", "got '' in it"),
    ("[{prompt: q, expected: [a]}]", "item 0: unknown key 'expected' (did you mean 'expect'?); "
                                     "allowed keys: prompt, expect"),
    ("[ok, 5]", "item 1: is 5"),
    ("7", "got 7"),
])
def test_error_bad_prompts(tmp_path, value, expect):
    msg = error_of(tmp_path, f"workload: {{prompts: {value}}}\n" + ONE_ROW)
    assert_all_in(msg, "workload.prompts: ", expect, "line 1")


# ------------------------------------------------------------------ telemetry interval


def test_telemetry_interval(tmp_path):
    cells = cells_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {telemetry_interval: 2s}}
        """)
    assert [c.workload.telemetry_interval for c in cells] == [5, 2]
    msg = error_of(tmp_path, "workload: {telemetry_interval: 0}\n" + ONE_ROW)
    assert_all_in(msg, "workload.telemetry_interval: must be a number of seconds", "got 0")


# ------------------------------------------------------------------ SLOs and thresholds


def test_slo_and_thresholds_default_to_none(tmp_path):
    (cell,) = cells_of(tmp_path, ONE_ROW)
    assert cell.slo == Slo() and not cell.slo.is_set
    assert cell.thresholds == Thresholds() and not cell.thresholds.is_set
    assert cell.thresholds.ttft_percentile == 95


def test_slo_and_thresholds_merge_key_by_key(tmp_path):
    cells = cells_of(tmp_path, """\
        workload: {prompts: quality}
        slo: {ttft_ms: 500, tpot_ms: 50}
        thresholds: {min_tps: 40, max_ttft_ms: 800, max_error_rate: 1%, min_match_rate: 0.9}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - gpu: RTX 3090
            providers: [vastai, tensordock]
            model: qwen2:7b
            slo: {e2e_ms: 10000, tpot_ms: null}
            thresholds: {min_tps: 25, ttft_percentile: 99, max_error_rate: 0.05, min_match_rate: null}
        """)
    first, second, third = cells
    assert (first.slo.ttft_ms, first.slo.tpot_ms, first.slo.e2e_ms) == (500, 50, None)
    t = first.thresholds
    assert (t.min_tps, t.max_ttft_ms, t.ttft_percentile, t.max_error_rate, t.min_match_rate) == (
        40, 800, 95, 0.01, 0.9)
    assert (second.slo.ttft_ms, second.slo.tpot_ms, second.slo.e2e_ms) == (500, None, 10000)
    t = second.thresholds
    assert (t.min_tps, t.max_ttft_ms, t.ttft_percentile, t.max_error_rate, t.min_match_rate) == (
        25, 800, 99, 0.05, None)
    assert third.thresholds == second.thresholds and third.slo == second.slo
    with pytest.raises(ValidationError):
        first.thresholds.min_tps = 1
    assert len({first, second, third}) == 3


@pytest.mark.parametrize("text,rate", [("1%", 0.01), ("0.5%", 0.005), ("0", 0.0), ("1", 1.0),
                                       ("100%", 1.0), ("0.25", 0.25)])
def test_threshold_rates_as_fractions_or_percentages(tmp_path, text, rate):
    (cell,) = cells_of(tmp_path, f"thresholds: {{max_error_rate: '{text}'}}\n" + ONE_ROW
                       if text.endswith("%") else f"thresholds: {{max_error_rate: {text}}}\n" + ONE_ROW)
    assert cell.thresholds.max_error_rate == pytest.approx(rate)


@pytest.mark.parametrize("where,text,expect", [
    ("thresholds", "{ttft_percentile: 80}", "thresholds.ttft_percentile: must be one of 50, 90, 95, 99"),
    ("thresholds", "{ttft_percentile: null}", "thresholds.ttft_percentile: must be one of"),
    ("thresholds", "{max_error_rate: 5}", "thresholds.max_error_rate: must be a fraction from 0 to 1 "
                                          "or a percentage such as '1%' (or null for none); got 5"),
    ("thresholds", "{min_match_rate: '90'}", "thresholds.min_match_rate: must be a fraction"),
    ("thresholds", "{min_match_rate: 120%}", "thresholds.min_match_rate: must be a fraction"),
    ("thresholds", "{min_tps: 0}", "thresholds.min_tps: must be a number of tokens per second, "
                                   "more than 0 (or null for none); got 0"),
    ("thresholds", "{max_ttft_ms: fast}", "thresholds.max_ttft_ms: must be a number of milliseconds"),
    ("thresholds", "{min_tp: 4}", "thresholds.min_tp: unknown key (did you mean 'min_tps'?); allowed "
                                  "keys: min_tps, max_ttft_ms, ttft_percentile, max_error_rate, "
                                  "min_match_rate"),
    ("thresholds", "[40]", "thresholds: must be a mapping"),
    ("slo", "{ttft_ms: -1}", "slo.ttft_ms: must be a number of milliseconds, more than 0"),
    ("slo", "{tpot: 5}", "slo.tpot: unknown key (did you mean 'tpot_ms'?); allowed keys: ttft_ms, "
                         "tpot_ms, e2e_ms"),
])
def test_error_bad_slo_and_thresholds(tmp_path, where, text, expect):
    msg = error_of(tmp_path, f"{where}: {text}\n" + ONE_ROW)
    assert_all_in(msg, expect, "line 1")
    row = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                             f"{where}: {text}}}\n")
    assert_all_in(row, "matrix[0]." + expect.split(": ", 1)[0], "line 2")


def test_error_match_rate_without_expectations(tmp_path):
    msg = error_of(tmp_path, """\
        thresholds: {min_match_rate: 0.9}
        workload: {prompts: quality}
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {prompts: [a, b]}}
        """)
    assert_all_in(msg, "matrix[1]: thresholds.min_match_rate is set but no prompt of this row has "
                  "`expect` answers", "`prompts: quality`", "`min_match_rate: null`", "line 5")


def test_top_level_keys_include_slo_and_thresholds(tmp_path):
    msg = error_of(tmp_path, "slos: {}\n" + ONE_ROW)
    assert_all_in(msg, "slos: unknown key (did you mean 'slo'?)", "allowed keys: name, description, "
                  "workload, offer, runtime, models, matrix, slo, thresholds")
    msg = error_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: x:7b, threshold: {}}\n")
    assert_all_in(msg, "matrix[0].threshold: unknown key (did you mean 'thresholds'?)",
                  "model, models, workload, offer, slo, thresholds")


# ------------------------------------------------------------- through pytest itself


def collecting(pytester, monkeypatch, **files: str):
    """Write the matrix ``files`` (``gpubench_x="..."``) and an ini; ``pytest --collect-only -q ARGS`` on them."""
    pytester.makefile(".yaml", **files)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("GPUBENCH_STORE", str(pytester.path / "reports" / "manifest.db"))
    return lambda *args: pytester.runpytest("--collect-only", "-q", *args)


def test_pytest_collects_load_points_and_k_selects_them(pytester, monkeypatch):
    collect = collecting(pytester, monkeypatch, gpubench_load="""
workload: {concurrency: [1, 8], duration: 5s}
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
  - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, workload: {concurrency: 1, rate: 2.5}}
""")
    result = collect()
    result.stdout.fnmatch_lines([
        "gpubench_load.yaml::RTX_4090-vastai-qwen2:7b",
        "gpubench_load.yaml::RTX_4090-vastai-qwen2:7b-c8",
        "gpubench_load.yaml::RTX_3090-vastai-qwen2:7b-r2.5",
    ])
    result = collect("-k", "c8")
    result.stdout.fnmatch_lines(["gpubench_load.yaml::RTX_4090-vastai-qwen2:7b-c8", "*1/3 tests collected*"])


def test_pytest_collects_multi_gpu_cells_and_k_and_gpu_select_them(pytester, monkeypatch):
    collect = collecting(pytester, monkeypatch, gpubench_gpus="""
runtime: vllm
matrix:
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, gpus: 2}
  - {gpu: H200 NVL, provider: vastai, model: qwen2:7b, gpus: 8}
""")
    collect().stdout.fnmatch_lines([
        "gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-runtime_vllm",
        "gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-x2-runtime_vllm",
        "gpubench_gpus.yaml::H200_NVL-vastai-qwen2:7b-x8-runtime_vllm",
    ])
    collect("-k", "x2").stdout.fnmatch_lines(["gpubench_gpus.yaml::RTX_4090-vastai-qwen2:7b-x2-runtime_vllm",
                                              "*1/3 tests collected*"])
    collect("--gpubench-gpu", "RTX4090").stdout.fnmatch_lines([
        "*RTX_4090-vastai-qwen2:7b-runtime_vllm", "*RTX_4090-vastai-qwen2:7b-x2-runtime_vllm", "*2/3 tests collected*"])


# -- the cloud and the runtime in ids and reuse groups -------------------------------


def test_the_default_cloud_and_runtime_keep_todays_ids_and_groups(tmp_path):
    """Naming the defaults changes nothing: existing matrices keep their ids and reuse groups."""
    plain = cells_of(tmp_path, "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, "
                               "workload: {concurrency: [1, 8]}}\n")
    named = cells_of(tmp_path, "cloud: shopper\nruntime: ollama\nmatrix:\n  - {gpu: RTX 4090, provider: vastai, "
                               "model: qwen2:7b, runtime: ollama, workload: {concurrency: [1, 8]}}\n")
    for cells in (plain, named):
        assert [c.cell_id for c in cells] == ["RTX_4090-vastai-qwen2:7b", "RTX_4090-vastai-qwen2:7b-c8"]
        assert {c.reuse_group for c in cells} == {"RTX_4090-vastai"}


def test_another_cloud_is_another_reuse_group_and_id(tmp_path):
    """Two matrix files with the same GPU and marketplace but different ``cloud:`` share no session."""
    row = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, workload: {concurrency: [1, 8]}}\n"
    (shopper,) = {c.reuse_group for c in cells_of(tmp_path, row)}
    moon = cells_of(tmp_path, "cloud: moon\noffer: {template: 9b2f3c0e8d7a4f61}\n" + row)
    assert [c.cell_id for c in moon] == ["RTX_4090-vastai-qwen2:7b-cloud_moon",
                                         "RTX_4090-vastai-qwen2:7b-c8-cloud_moon"]
    assert {c.reuse_group for c in moon} == {"RTX_4090-vastai-t9b2f3c0e8d7a-cloud_moon"} != {shopper}
    for cell in moon:  # expansion hands out what the cell would compute itself
        validated = Cell.model_validate(dict(cell))
        assert (cell.cell_id, cell.reuse_group) == (validated.cell_id, validated.reuse_group)


def test_rows_differing_only_by_runtime_are_two_cells_in_two_groups(tmp_path):
    cells = cells_of(tmp_path, """\
        cloud: moon
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, runtime: vllm}
        """)
    assert [c.cell_id for c in cells] == ["RTX_4090-vastai-qwen2:7b-cloud_moon",
                                          "RTX_4090-vastai-qwen2:7b-runtime_vllm-cloud_moon"]
    assert [c.reuse_group for c in cells] == ["RTX_4090-vastai-cloud_moon", "RTX_4090-vastai-runtime_vllm-cloud_moon"]
    for cell in cells:
        assert Cell.model_validate(dict(cell)).cell_id == cell.cell_id
    msg = error_of(tmp_path, """\
        matrix:
          - {gpu: RTX 4090, provider: vastai, model: qwen2:7b, runtime: vllm}
          - {gpu: rtx-4090, provider: vastai, model: qwen2:7b, runtime: vllm}
        """)
    assert_all_in(msg, "matrix[1]: duplicate cell rtx-4090-vastai-qwen2:7b-runtime_vllm", "once per runtime")
