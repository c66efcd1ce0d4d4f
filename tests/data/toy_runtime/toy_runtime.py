"""A runtime defined outside the package: ``runtime: toy``, one module plus its registration.

``toy-serve`` is an OpenAI-API server whose command line is vLLM's (``toy-serve serve MODEL
--host H --port P --max-num-seqs N``); the sandbox imitates it with its vLLM launcher stand-in
under the name ``toy-serve``. Its registration is the entry point beside this file
(``toy_runtime-0.dist-info/entry_points.txt``: group ``pytest_gpubench.runtimes``,
``toy = toy_runtime:RUNTIME``), found by ``importlib.metadata`` once this folder is on
``sys.path``, as an installed distribution's would be. tests/e2e/test_toy_runtime.py holds it
to the exported contract and runs a cell of it end to end.
"""

from __future__ import annotations

from typing import ClassVar

from pytest_gpubench.runtime_facts import SandboxImitation
from pytest_gpubench.runtimes.openai_server import LaunchSpec, OpenAIServerRuntime, declare

TOY = LaunchSpec(
    name="toy",
    program="toy-serve",
    argv=("toy-serve", "serve", "{model}", "--host", "{host}", "--port", "{port}", "--max-num-seqs", "{parallel}",
          "{args}"),
    version_command="toy-serve --version",
    version_pattern=r"(\d+\.\d+[.\w+-]*)",
    install_hint="install toy-serve first",
    tensor_parallel_flag="--tensor-parallel-size",
)


class ToyRuntime(OpenAIServerRuntime):
    """toy-serve on one instance: everything is :class:`OpenAIServerRuntime`'s."""

    name: ClassVar[str] = "toy"
    spec: ClassVar[LaunchSpec] = TOY


RUNTIME = declare(ToyRuntime, sandbox=SandboxImitation(program="toy-serve", stand_in="vllm"))
