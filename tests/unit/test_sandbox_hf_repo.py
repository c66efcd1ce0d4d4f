"""The sandbox's ``llama-server`` stand-in with llama.cpp's ``-hf REPO[:QUANT]`` (issue 23 item 9).

Real llama.cpp downloads the GGUF from the Hugging Face repo before loading it; with ``-m FILE``
as well (the plugin always passes ``-m {model}``) it reads FILE as the file to fetch from the
repo. The stand-in has no network: the repo or file name stands for the catalog model its
family and size say (docs/sandbox.md), and one that names none fails as an unknown repo's
download does.
"""

from __future__ import annotations

import pytest

from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.openai_launchers import LaunchError, find_catalog_model, hub_names, parse


class Catalog:
    """What :func:`find_catalog_model` asks of an instance: the sandbox catalog's models by name."""

    def __init__(self) -> None:
        self.models = load_catalog().models

    def find_model(self, name: str):
        key = name.strip().lower()
        key = key if ":" in key.rsplit("/", 1)[-1] else key + ":latest"
        return (key, self.models[key]) if key in self.models else None


@pytest.mark.parametrize(("argv", "model", "served"), [
    # the plugin's command line: -m {model} --alias {model}, the repo in runtime.args
    (["-m", "qwen2-7b-instruct-q4_k_m.gguf", "--alias", "qwen2-7b-instruct-q4_k_m.gguf",
      "-hf", "Qwen/Qwen2-7B-Instruct-GGUF"], "qwen2:7b", "qwen2-7b-instruct-q4_k_m.gguf"),
    # a catalog name as the file, as without -hf
    (["-m", "qwen2:1.5b.gguf", "-hf", "someone/anything-GGUF"], "qwen2:1.5b", "qwen2:1.5b.gguf"),
    # no -m: the repo (with its :QUANT) names the model, as newer llama.cpp builds do
    (["-hf", "bartowski/DeepSeek-R1-Distill-Qwen-14B-GGUF:Q4_K_M"], "deepseek-r1:14b",
     "bartowski/DeepSeek-R1-Distill-Qwen-14B-GGUF:Q4_K_M"),
    (["--hf-repo", "Qwen/Qwen2-1.5B-Instruct-GGUF", "--hf-file", "qwen2-1_5b-instruct-q4_0.gguf"], "qwen2:1.5b",
     "Qwen/Qwen2-1.5B-Instruct-GGUF"),
])
def test_hf_repo_serves_the_catalog_model_its_names_say(argv, model, served):
    launch, spec = find_catalog_model(Catalog(), parse("llama-server", argv))
    assert launch.model == model and launch.served_names == (served,)
    assert spec == load_catalog().models[model]


def test_a_repo_that_names_no_catalog_model_fails_as_its_download_would():
    launch = parse("llama-server", ["-m", "phi4-q4.gguf", "-hf", "microsoft/phi-4-gguf"])
    with pytest.raises(LaunchError, match=r"^error: failed to download model from "
                                          r"https://huggingface.co/microsoft/phi-4-gguf/resolve/main/phi4-q4.gguf$"):
        find_catalog_model(Catalog(), launch)


def test_without_hf_a_file_that_is_no_catalog_model_is_not_found_as_before():
    launch = parse("llama-server", ["-m", "models/qwen2-7b-instruct-q4_k_m.gguf"])
    with pytest.raises(LaunchError, match="failed to open GGUF file 'models/qwen2-7b-instruct-q4_k_m.gguf'"):
        find_catalog_model(Catalog(), launch)


def test_no_model_and_no_repo_is_llama_servers_usage_error():
    with pytest.raises(LaunchError, match="no model given"):
        parse("llama-server", ["--port", "8080"])


def test_hub_names_read_family_and_size_most_specific_first():
    assert hub_names("DeepSeek-R1-Distill-Qwen-14B-GGUF:Q4_K_M") == [
        "deepseek-r1-distill-qwen-14b-gguf:q4_k_m", "deepseek-r1-distill-qwen:14b", "deepseek-r1-distill:14b",
        "deepseek-r1:14b", "deepseek:14b"]
    assert hub_names("qwen2:7b.gguf") == ["qwen2:7b"]
    assert hub_names("Qwen/Qwen2-Instruct-GGUF") == ["qwen2-instruct-gguf"]
