"""llama.cpp's server (``runtime: llamacpp``): ``llama-server -m {model} --alias {model} --host {host} --port {port}
-np {parallel} {args}``.

The model is a GGUF file on the instance (``-m``, a path); ``--alias`` makes
``/v1/models`` and the results name it as the matrix does. Checked against
llama.cpp's server README: ``--port`` (default 8080) on ``--host`` (default
127.0.0.1; given anyway, ``runtime.host`` may change it); ``-np``/``--parallel`` is the
number of slots (requests decoded at once); ``GET /health`` answers 503 ``{"error": {"message": "Loading model", ...}}``
while the model loads and 200 ``{"status": "ok"}`` after (the server listens
first); ``--version`` prints ``version: BUILD (COMMIT)`` on stderr; ``/v1/models``
lists ``{id, object: "model", owned_by: "llamacpp", meta}``. It has no
tensor-parallel flag (``--split-mode`` spreads layers over GPUs). Everything else is
:class:`~.openai_server.OpenAIServerRuntime`.
"""

from __future__ import annotations

from typing import ClassVar

from ..runtime_facts import SandboxImitation
from .openai_server import LaunchSpec, OpenAIServerRuntime, declare

LLAMACPP = LaunchSpec(
    name="llamacpp",
    program="llama-server",
    argv=("llama-server", "-m", "{model}", "--alias", "{model}", "--host", "{host}", "--port", "{port}", "-np",
          "{parallel}", "{args}"),
    version_command="llama-server --version",
    version_pattern=r"version: (\d+ \([0-9a-f]+\))",
    install_hint="use an image with llama.cpp's server (such as ghcr.io/ggml-org/llama.cpp:server-cuda) "
                 "or build llama-server first",
    tensor_parallel_flag=None,
)


class LlamacppRuntime(OpenAIServerRuntime):
    """llama.cpp's server on one instance (see the module docstring)."""

    name: ClassVar[str] = "llamacpp"
    spec: ClassVar[LaunchSpec] = LLAMACPP


#: The sandbox's ``llama-server`` launcher stand-in imitates it.
RUNTIME = declare(LlamacppRuntime, sandbox=SandboxImitation(program="llama-server", stand_in="llama-server"))
