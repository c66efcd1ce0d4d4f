"""Matrix files: schema, expansion, ids, filters, VRAM needs and error messages."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix import (
    KNOWN_PROVIDERS,
    MODEL_VRAM_GB,
    SEED_PROMPTS,
    Cell,
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
    parse_duration,
    provider_matches,
    select_cells,
)

MATRIX_DIR = Path(__file__).resolve().parents[1] / "matrix"
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


@pytest.mark.parametrize("model", ["phi4", "llama3:latest", "phi3:mini-4k", "x:q4_0", "x:4bit"])
def test_no_size_in_tag(model):
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
    assert cell.ollama_install is None
    assert cell.matrix_name == "test"  # from gpubench_test.yaml
    assert cell.source.endswith("gpubench_test.yaml") and cell.row == 0


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
                  "`models: {phi4: {vram_gb: N}}`")


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
