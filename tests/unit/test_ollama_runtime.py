import pytest

from pytest_gpubench.errors import StageError
from pytest_gpubench.runtimes.ollama import check_model_name, parse_ollama_host, with_tag


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ("127.0.0.1", 11434)),
        ("127.0.0.1:34261", ("127.0.0.1", 34261)),
        ("http://10.0.0.5:8000/", ("10.0.0.5", 8000)),
        ("0.0.0.0", ("127.0.0.1", 11434)),  # listening everywhere: reach it on loopback
        ("0.0.0.0:11500", ("127.0.0.1", 11500)),
        ("[::1]:11434", ("::1", 11434)),
        ("ollama.internal", ("ollama.internal", 11434)),
    ],
)
def test_ollama_host_parsed_as_ollama_does(value, expected):
    assert parse_ollama_host(value) == expected


@pytest.mark.parametrize("name", ["qwen2:7b", "deepseek-r1:70b", "library/llama3:8b-instruct-q4_0", "phi3"])
def test_plain_model_names_pass(name):
    assert check_model_name(name) == name


@pytest.mark.parametrize("name", ["qwen2:7b; rm -rf /", "$(id)", "a b", "x:`id`", "m\nn", "../etc", ""])
def test_anything_shell_or_path_like_is_refused(name):
    with pytest.raises(StageError, match="refusing model name"):
        check_model_name(name)


def test_bare_name_means_latest():
    assert with_tag("qwen2") == "qwen2:latest"
    assert with_tag("qwen2:7b") == "qwen2:7b"
    assert with_tag("registry.local:5000/ns/model") == "registry.local:5000/ns/model:latest"
