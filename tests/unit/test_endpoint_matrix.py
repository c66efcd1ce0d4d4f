"""``runtime: {name: openai, endpoint: URL, ...}``: what a matrix may say of a running endpoint,
the cells it makes, and the errors a bad one gets (file, field, what is allowed)."""

from __future__ import annotations

import pytest

from pytest_gpubench.cloud.provider import Constraints
from pytest_gpubench.errors import MatrixError
from pytest_gpubench.matrix.cells import expand, parse_matrix


def cells(runtime: str, row: str = "{gpu: RTX 4090, model: Qwen/Qwen2.5-0.5B-Instruct}", source: str = "m.yaml"):
    return expand(parse_matrix(f"runtime: {runtime}\nmatrix:\n  - {row}\n", source))


def error(runtime: str, row: str = "{gpu: RTX 4090, model: qwen2:7b}") -> str:
    with pytest.raises(MatrixError) as info:
        cells(runtime, row)
    return str(info.value)


def test_an_endpoint_cell_rents_nothing_and_says_so_in_its_id():
    (cell,) = cells("{name: openai, endpoint: 'https://llm.example.com/v1', api: completions, "
                    "api_key_env: MY_TOKEN, price_per_hour: 1.5}")
    assert (cell.runtime, cell.cloud, cell.provider) == ("openai", "endpoint", "endpoint")
    assert cell.cell_id == "RTX_4090-endpoint-Qwen_Qwen2.5-0.5B-Instruct-runtime_openai"
    spec = cell.endpoint
    assert (spec.url, spec.api, spec.protocol, spec.api_key_env, spec.price_per_hour) == (
        "https://llm.example.com/v1", "completions", "openai-completions", "MY_TOKEN", 1.5)
    assert cell.vram_gb == 0  # an unknown model's VRAM is no question: nothing is rented
    assert Constraints.for_cell(cell).endpoint == spec


def test_defaults_and_a_row_of_its_own():
    (cell,) = cells("{name: openai, endpoint: 'http://127.0.0.1:8000/'}")
    assert (cell.endpoint.url, cell.endpoint.api, cell.endpoint.api_key_env, cell.endpoint.price_per_hour) == (
        "http://127.0.0.1:8000", "chat", None, 0.0)
    # A file of rented cells with one endpoint row: the row's runtime mapping carries its endpoint.
    endpoint_row, rented = expand(parse_matrix(
        "matrix:\n  - {gpu: H100, model: m:7b, runtime: {name: openai, endpoint: 'http://10.0.0.5:8000'}}\n"
        "  - {gpu: H100, provider: vastai, model: m:7b}\n", "m.yaml"))
    assert (endpoint_row.cloud, endpoint_row.endpoint.url) == ("endpoint", "http://10.0.0.5:8000")
    assert (rented.cloud, rented.provider, rented.endpoint) == ("shopper", "vastai", None)
    assert endpoint_row.reuse_group != rented.reuse_group


def test_the_ca_file_is_relative_to_the_matrix_file(tmp_path):
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (cell,) = cells("{name: openai, endpoint: 'https://h', ca_file: ca.pem}", source=str(tmp_path / "m.yaml"))
    assert cell.endpoint.ca_file == str((tmp_path / "ca.pem").resolve())
    assert "no such file" in error("{name: openai, endpoint: 'https://h', ca_file: missing.pem}")


@pytest.mark.parametrize(("endpoint", "says"), [
    ("'127.0.0.1:8000'", "absolute http:// or https:// URL"),
    ("'/v1'", "absolute http:// or https:// URL"),
    ("'ftp://host/v1'", "absolute http:// or https:// URL"),
    ("''", "must be the server's URL"),
    ("42", "must be the server's URL"),
    ("'http://host:99999'", "invalid port"),
    ("'http://host/v1?key=x'", "without '?' or '#'"),
    ("'http://host name:80'", "without spaces"),
])
def test_a_bad_url_is_refused_with_what_is_allowed(endpoint, says):
    message = error(f"{{name: openai, endpoint: {endpoint}}}")
    assert "m.yaml: runtime.endpoint: " in message and says in message


def test_a_url_with_credentials_is_refused_without_repeating_them():
    message = error("{name: openai, endpoint: 'https://alice:hunter2@llm.example.com'}")
    assert "credentials" in message and "api_key_env" in message
    assert "hunter2" not in message and "alice" not in message


@pytest.mark.parametrize(("runtime", "field", "says"), [
    ("{name: openai}", "runtime", "give its `endpoint: URL`"),
    ("openai", "runtime", "give its `endpoint: URL`"),
    ("{name: vllm, endpoint: 'http://h'}", "runtime", "goes with `name: openai`"),
    ("{endpoint: 'http://h'}", "runtime", "goes with `name: openai`"),
    ("{name: openai, endpoint: 'http://h', args: [--x]}", "runtime", "starts nothing"),
    ("{name: openai, endpoint: 'http://h', api: responses}", "runtime.api", "'chat' or 'completions'"),
    ("{name: openai, endpoint: 'http://h', api_key_env: 'sk-abc123'}", "runtime.api_key_env",
     "name of an environment variable"),
    ("{name: openai, endpoint: 'http://h', price_per_hour: -1}", "runtime.price_per_hour", "from 0 to 100"),
])
def test_a_runtime_mapping_that_does_not_add_up_is_refused(runtime, field, says):
    message = error(runtime)
    assert f"m.yaml: {field}: " in message and says in message, message


def test_a_rented_row_still_needs_its_provider():
    message = error("ollama", "{gpu: RTX 4090, model: qwen2:7b}")
    assert "matrix[0]: needs `provider: ...` or `providers: [...]` (line 3)" in message
