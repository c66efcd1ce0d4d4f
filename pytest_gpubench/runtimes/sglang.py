"""SGLang (``runtime: sglang``): ``python3 -m sglang.launch_server --model-path {model} --host {host} --port {port}
--max-running-requests {parallel} {args}``.

Checked against SGLang's docs (server arguments, quick start, native APIs): the model
is ``--model-path`` (a Hugging Face repo id or a local folder); the server listens on
``--port`` (default 30000) of ``--host`` (default 127.0.0.1; given anyway, ``runtime.host``
may change it); ``--max-running-requests`` caps the requests batched at once; ``--tp-size``
(``--tp``) is tensor parallelism;
``GET /health`` answers 200 once the server is ready; the version is
``sglang.__version__`` (``python3 -c "import sglang; print(sglang.__version__)"``, the
docs' own check); ``/v1/models`` lists ``{id, object: "model", owned_by: "sglang",
root, max_model_len}``. Everything else is :class:`~.openai_server.OpenAIServerRuntime`.
"""

from __future__ import annotations

from typing import ClassVar

from ..runtime_facts import SandboxImitation
from .openai_server import LaunchSpec, OpenAIServerRuntime, declare

SGLANG = LaunchSpec(
    name="sglang",
    program="sglang.launch_server",
    argv=("python3", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "{host}", "--port", "{port}",
          "--max-running-requests", "{parallel}", "{args}"),
    version_command="python3 -c 'import sglang; print(sglang.__version__)'",
    version_pattern=r"(\d+\.\d+[.\w+-]*)",
    install_hint="use an image with SGLang installed (such as lmsysorg/sglang) or install it with "
                 "`pip install sglang` first",
    tensor_parallel_flag="--tp-size",
    process_word="sglang",  # python3 -m sglang.launch_server: the interpreter is the first word
)


class SglangRuntime(OpenAIServerRuntime):
    """SGLang on one instance (see the module docstring)."""

    name: ClassVar[str] = "sglang"
    spec: ClassVar[LaunchSpec] = SGLANG


#: The sandbox imitates it with an ``sglang`` package on the instance's ``PYTHONPATH`` whose
#: ``launch_server`` runs its ``sglang`` launcher stand-in.
RUNTIME = declare(SglangRuntime, sandbox=SandboxImitation(program="sglang", stand_in="sglang", kind="python-package"))
