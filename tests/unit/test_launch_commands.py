"""What reaches the instance's shell when VllmRuntime starts ``vllm serve``: validated, then quoted."""

from __future__ import annotations

import shlex

import pytest

from pytest_gpubench.errors import MatrixError, Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.runtimes.vllm import VllmRuntime


def argv_of(command: str) -> list[str]:
    """The words of the ``nohup ... >`` part of a serve command, as the shell splits them."""
    words = shlex.split(command.split("; ", 1)[1])
    return words[1:words.index(">")]


def test_the_serve_command_is_vllm_serve_model_port_parallelism_and_the_arguments():
    runtime = VllmRuntime(conn=None, model="Qwen/Qwen2-1.5B-Instruct", args=("--max-model-len", "4096"),
                          remote_port=8000)
    command = runtime.serve_command(runtime.model, 8)
    assert argv_of(command) == ["vllm", "serve", "Qwen/Qwen2-1.5B-Instruct", "--port", "8000",
                                "--max-num-seqs", "8", "--max-model-len", "4096"]
    assert command.endswith('echo $! > "$HOME/.gpubench/vllm-serve.pid"; echo 8000 > "$HOME/.gpubench/vllm-serve.port"')


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
    assert info.value.stage is Stage.OLLAMA_INSTALL


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
