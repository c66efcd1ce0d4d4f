"""vLLM (``runtime: vllm``): ``vllm serve {model} --host {host} --port {port} --max-num-seqs {parallel} {args}``.

Checked against vLLM's docs (the ``vllm serve`` CLI and its OpenAI-compatible server):
the model is the positional ``model_tag`` (a Hugging Face repo id or a local path); ``--host``
(default 0.0.0.0, every interface: so always given, 127.0.0.1 unless ``runtime.host`` says otherwise);
``--max-num-seqs`` caps the sequences batched at once; ``--tensor-parallel-size``
(``-tp``) spreads the model over GPUs; ``GET /health`` answers 200 once the API server
listens, which it does only after the model is loaded (nothing answers before);
``vllm --version`` prints the bare version (``0.10.1.1``); ``/v1/models`` lists
``{id, object: "model", owned_by: "vllm", root, max_model_len}`` per served name; ``GET /metrics``
is its Prometheus exposition, read around a measured run for speculative decoding's acceptance
(``--speculative-config``; ``measure/spec_decode.py``).
Everything else is :class:`~.openai_server.OpenAIServerRuntime`.
"""

from __future__ import annotations

from typing import ClassVar

from ..runtime_facts import ImageServer, SandboxImitation
from .openai_server import LaunchSpec, OpenAIServerRuntime, declare

VLLM = LaunchSpec(
    name="vllm",
    program="vllm serve",
    argv=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}", "--max-num-seqs", "{parallel}", "{args}"),
    version_command="vllm --version",
    version_pattern=r"(\d+\.\d+[.\w+-]*)",
    install_hint="use an image with vLLM installed (such as vllm/vllm-openai) or install it with `pip install vllm` "
                 "first",
    tensor_parallel_flag="--tensor-parallel-size",
)


class VllmRuntime(OpenAIServerRuntime):
    """vLLM on one instance (see the module docstring)."""

    name: ClassVar[str] = "vllm"
    spec: ClassVar[LaunchSpec] = VLLM
    #: Prometheus metrics, the speculative-decoding counters among them (``measure/spec_decode.py``).
    metrics_path: ClassVar[str | None] = "/metrics"


#: GPU Shopper starts it from an image as workload ``llm_vllm`` (``ImageVLLM``, ``DefaultVLLMPort``);
#: the sandbox's ``vllm`` launcher stand-in imitates it.
RUNTIME = declare(VllmRuntime, image=ImageServer("llm_vllm", "vllm/vllm-openai:latest", 8000),
                  sandbox=SandboxImitation(program="vllm", stand_in="vllm"))
