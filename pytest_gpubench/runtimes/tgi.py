"""Text Generation Inference (``runtime: tgi``): ``text-generation-launcher --model-id {model}
--hostname {host} --port {port} --max-concurrent-requests {parallel} {args}``.

Checked against TGI's launcher reference: ``--model-id`` (a Hugging Face repo id or a
local directory), ``--hostname`` (default 0.0.0.0, every interface: so always given,
127.0.0.1 unless ``runtime.host`` says otherwise), ``--port`` (default 3000), ``--max-concurrent-requests`` (the
router's cap on requests in flight, default 128; more are refused, so it is set to the
cell's concurrency), ``--num-shard`` for tensor parallelism; the launcher downloads
the weights, starts the shards, then the router, which serves ``GET /health`` (200
once ready) and OpenAI's Messages API (``/v1/chat/completions``); ``--version``
prints ``text-generation-launcher X.Y.Z``; ``/v1/models`` lists
``{id: model id, object: "model", owned_by: model id}``. Everything else is
:class:`~.openai_server.OpenAIServerRuntime`.
"""

from __future__ import annotations

from typing import ClassVar

from ..runtime_facts import ImageServer, SandboxImitation
from .openai_server import LaunchSpec, OpenAIServerRuntime, declare

TGI = LaunchSpec(
    name="tgi",
    program="text-generation-launcher",
    argv=("text-generation-launcher", "--model-id", "{model}", "--hostname", "{host}", "--port", "{port}",
          "--max-concurrent-requests", "{parallel}", "{args}"),
    version_command="text-generation-launcher --version",
    version_pattern=r"(\d+\.\d+[.\w+-]*)",
    install_hint="use TGI's image (ghcr.io/huggingface/text-generation-inference) as the instance's image",
    tensor_parallel_flag="--num-shard",
)


class TgiRuntime(OpenAIServerRuntime):
    """TGI on one instance (see the module docstring)."""

    name: ClassVar[str] = "tgi"
    spec: ClassVar[LaunchSpec] = TGI


#: GPU Shopper starts it from an image as workload ``llm_tgi`` (``ImageTGI``, ``DefaultTGIPort``);
#: the sandbox's ``text-generation-launcher`` stand-in imitates it.
RUNTIME = declare(TgiRuntime, image=ImageServer("llm_tgi", "ghcr.io/huggingface/text-generation-inference:latest", 80),
                  sandbox=SandboxImitation(program="text-generation-launcher", stand_in="text-generation-launcher"))
