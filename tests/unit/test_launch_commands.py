"""What reaches the instance's shell when an OpenAI-server runtime starts its server: validated, then quoted."""

from __future__ import annotations

import shlex

import pytest

from pytest_gpubench.errors import MatrixError, Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.measure.compare import fingerprint, incomparable
from pytest_gpubench.runtimes.llamacpp import LlamacppRuntime
from pytest_gpubench.runtimes.ollama import OllamaRuntime
from pytest_gpubench.runtimes.sglang import SglangRuntime
from pytest_gpubench.runtimes.tgi import TgiRuntime
from pytest_gpubench.runtimes.vllm import VllmRuntime


def argv_of(command: str) -> list[str]:
    """The words of the ``nohup ... >`` part of a serve command, as the shell splits them."""
    words = shlex.split(command.split("; ", 1)[1])
    return words[1:words.index(">")]


def test_the_serve_command_is_vllm_serve_model_port_parallelism_and_the_arguments():
    runtime = VllmRuntime(conn=None, model="Qwen/Qwen2-1.5B-Instruct", args=("--max-model-len", "4096"),
                          remote_port=8000)
    command = runtime.serve_command(runtime.model, 8)
    assert argv_of(command) == ["vllm", "serve", "Qwen/Qwen2-1.5B-Instruct", "--host", "127.0.0.1", "--port", "8000",
                                "--max-num-seqs", "8", "--max-model-len", "4096"]
    assert 'echo $! > "$HOME/.gpubench/vllm-serve.pid"; pid=$!; ' in command  # and its start time beside it
    assert '> "$HOME/.gpubench/vllm-serve.start"; echo 8000 > "$HOME/.gpubench/vllm-serve.port"' in command
    assert command.endswith('echo 8000 > "$HOME/.gpubench/vllm-serve.port"')


def test_an_argument_with_shell_syntax_is_one_quoted_word():
    runtime = VllmRuntime(conn=None, model="qwen2:1.5b", args=("--chat-template", "{{ x }}; rm -rf / $(id)"))
    assert argv_of(runtime.serve_command("qwen2:1.5b", 1))[-1] == "{{ x }}; rm -rf / $(id)"


@pytest.mark.parametrize("model", ["a b", "x;id", "$(id)", "../../etc", "-rf", "a\nb", ""])
def test_a_model_name_a_shell_or_vllm_would_read_otherwise_is_refused(model):
    with pytest.raises(StageError) as info:
        VllmRuntime(conn=None).serve_command(model, 1)
    assert info.value.stage is Stage.MODEL_PULL


@pytest.mark.parametrize("arg", ["line\nbreak", "nul\x00", ""])
def test_an_argument_that_is_not_one_printable_line_is_refused(arg):
    with pytest.raises(StageError) as info:
        VllmRuntime(conn=None, args=(arg,)).serve_command("qwen2:1.5b", 1)
    assert info.value.stage is Stage.RUNTIME_SETUP


ROWS = "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n" \
       "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', runtime: {args: [--enforce-eager]}}\n"


def test_the_matrix_runtime_args_reach_each_cell_and_a_row_may_replace_them():
    text = "runtime: {name: vllm, args: [--max-model-len, '4096']}\n" + ROWS
    first, second = expand(parse_matrix(text, "gpubench_vllm.yaml"))
    assert (first.runtime, first.runtime_args) == ("vllm", ("--max-model-len", "4096"))
    assert (second.runtime, second.runtime_args) == ("vllm", ("--enforce-eager",))
    assert VllmRuntime.for_cell(None, first).args == ("--max-model-len", "4096")


@pytest.mark.parametrize("args", ["'--x 1'", "[1]", "['']", '["a\\nb"]'])
def test_runtime_args_must_be_a_list_of_printable_words(args):
    with pytest.raises(MatrixError) as info:
        parse_matrix(f"runtime: {{name: vllm, args: {args}}}\n" + ROWS, "gpubench_vllm.yaml")
    assert "runtime.args: must be a list of launch arguments" in str(info.value)


@pytest.mark.parametrize(("runtime_class", "argv"), [
    (SglangRuntime, ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2-1.5B-Instruct",
                     "--host", "127.0.0.1", "--port", "23456", "--max-running-requests", "8", "--tp-size", "2"]),
    (TgiRuntime, ["text-generation-launcher", "--model-id", "Qwen/Qwen2-1.5B-Instruct", "--hostname", "127.0.0.1",
                  "--port", "23456",
                  "--max-concurrent-requests", "8", "--tp-size", "2"]),
    (LlamacppRuntime, ["llama-server", "-m", "Qwen/Qwen2-1.5B-Instruct", "--alias", "Qwen/Qwen2-1.5B-Instruct",
                       "--host", "127.0.0.1", "--port", "23456", "-np", "8", "--tp-size", "2"]),
], ids=["sglang", "tgi", "llamacpp"])
def test_each_servers_launch_command_is_its_template_with_model_port_parallelism_and_arguments(runtime_class, argv):
    runtime = runtime_class(conn=None, model="Qwen/Qwen2-1.5B-Instruct", args=("--tp-size", "2"), remote_port=23456)
    command = runtime.serve_command(runtime.model, 8)
    assert argv_of(command) == argv
    name = runtime_class.name
    assert f'> "$HOME/.gpubench/{name}-serve.log" 2>&1' in command
    assert f'echo $! > "$HOME/.gpubench/{name}-serve.pid"; pid=$!; ' in command
    assert command.endswith(f'> "$HOME/.gpubench/{name}-serve.start"; '
                            f'echo 23456 > "$HOME/.gpubench/{name}-serve.port"')


@pytest.mark.parametrize("runtime_class", [SglangRuntime, TgiRuntime, LlamacppRuntime])
def test_every_servers_command_quotes_an_argument_and_refuses_a_model_a_shell_would_read(runtime_class):
    runtime = runtime_class(conn=None, args=("--chat-template", "{{ x }}; rm -rf / $(id)"), remote_port=20000)
    assert argv_of(runtime.serve_command("qwen2:1.5b", 1))[-1] == "{{ x }}; rm -rf / $(id)"
    with pytest.raises(StageError) as info:
        runtime.serve_command("$(id)", 1)
    assert info.value.stage is Stage.MODEL_PULL


def test_runtime_port_reaches_each_cell_and_a_row_may_replace_or_drop_it():
    text = ("runtime: {name: sglang, port: 30000}\n"
            "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n"
            "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', runtime: {port: null}}\n"
            "  - {gpu: RTX 4090, provider: vastai, model: 'llama3:8b', runtime: {name: tgi, port: 8080}}\n")
    first, second, third = expand(parse_matrix(text, "gpubench_ports.yaml"))
    assert (first.runtime, first.runtime_port) == ("sglang", 30000)
    assert (second.runtime, second.runtime_port) == ("sglang", None)
    assert (third.runtime, third.runtime_port) == ("tgi", 8080)
    assert SglangRuntime.for_cell(None, first).port == 30000 and SglangRuntime.for_cell(None, second).port is None


@pytest.mark.parametrize("port", ["0", "65536", "'x'"])
def test_runtime_port_must_be_a_tcp_port(port):
    with pytest.raises(MatrixError) as info:
        parse_matrix(f"runtime: {{name: vllm, port: {port}}}\n" + ROWS, "gpubench_vllm.yaml")
    assert "runtime.port" in str(info.value)


def test_launch_arguments_and_port_are_part_of_the_workload_fingerprint():
    def of(**launch):
        return fingerprint(prompts=["hi"], max_tokens=64, concurrency=1, rate=None, think=None, warmup_requests=1,
                           runtime="vllm", runtime_version="0.10.1.1", **launch)

    plain, eager = of(), of(launch_args=("--enforce-eager",))
    assert "launch" not in plain.fields  # a fingerprint without launch options keeps the hash it had
    assert plain.hash != eager.hash != of(launch_args=("--enforce-eager",), port=8000).hash
    baseline = {"run_id": "r1", "benchmark": {"details": {"fingerprint": plain.model_dump()}}}
    assert incomparable(eager, baseline) == "run r1 differs: launch default launch -> --enforce-eager"


def test_the_matrix_example_of_docs_runtimes_md_parses_into_a_cell_per_runtime():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "runtimes.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cells = expand(parse_matrix(example, "gpubench_runtimes_doc.yaml"))
    assert [(c.runtime, c.runtime_port) for c in cells] == [("vllm", None), ("sglang", None), ("tgi", 3000),
                                                            ("llamacpp", None)]


# ----------------------------------------------- where the servers listen (issue 21 item 4)

HOSTED = ("runtime: {name: vllm, host: 0.0.0.0}\n"
          "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:1.5b'}\n"
          "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', runtime: {name: tgi}}\n"
          "  - {gpu: RTX 4090, provider: vastai, model: 'llama3:8b', runtime: {name: ollama, host: '::1'}}\n")


@pytest.mark.parametrize(("runtime_class", "flag"), [
    (VllmRuntime, "--host"), (SglangRuntime, "--host"), (TgiRuntime, "--hostname"), (LlamacppRuntime, "--host")])
def test_every_server_listens_on_the_instance_loopback_unless_the_matrix_says_otherwise(runtime_class, flag):
    """vLLM and TGI listen on every interface by default: the flag is always given."""
    runtime = runtime_class(conn=None, model="qwen2:1.5b", remote_port=23456)
    words = argv_of(runtime.serve_command("qwen2:1.5b", 1))
    assert words[words.index(flag) + 1] == "127.0.0.1" and words.count(flag) == 1
    assert runtime.endpoint.remote_url == "http://127.0.0.1:23456"
    everywhere = runtime_class(conn=None, model="qwen2:1.5b", remote_port=23456, host="0.0.0.0")
    words = argv_of(everywhere.serve_command("qwen2:1.5b", 1))
    assert words[words.index(flag) + 1] == "0.0.0.0"
    assert everywhere.endpoint.remote_url == "http://127.0.0.1:23456"  # reached on loopback all the same


def test_runtime_host_reaches_each_cell_and_a_row_may_replace_or_keep_it():
    vllm, tgi, ollama = expand(parse_matrix(HOSTED, "gpubench_hosts.yaml"))
    assert (vllm.runtime_host, tgi.runtime_host, ollama.runtime_host) == ("0.0.0.0", "0.0.0.0", "::1")
    assert VllmRuntime.for_cell(None, vllm).host == "0.0.0.0"
    served = OllamaRuntime.for_cell(None, ollama)
    assert served.server_environment(1).startswith("OLLAMA_HOST=[::1]:11434 ")
    assert served.remote_url == "http://[::1]:11434"
    (plain,) = expand(parse_matrix("runtime: ollama\nmatrix:\n  - {gpu: RTX 4090, provider: vastai, "
                                   "model: 'qwen2:1.5b'}\n", "gpubench_plain.yaml"))
    assert plain.runtime_host is None
    assert OllamaRuntime.for_cell(None, plain).server_environment(1).startswith("OLLAMA_HOST=127.0.0.1:11434 ")


@pytest.mark.parametrize("host", ["localhost", "'0.0.0.0; id'", "[1]", "300.1.1.1"])
def test_runtime_host_must_be_an_ip_address(host):
    with pytest.raises(MatrixError) as info:
        parse_matrix(f"runtime: {{name: vllm, host: {host}}}\n" + ROWS, "gpubench_vllm.yaml")
    assert "runtime.host: must be an IP address" in str(info.value)  # a list: "such as '0.0.0.0'; got a list"
