"""A runtime on a session whose image serves the model (GPU Shopper's entrypoint mode).

In entrypoint mode (``runtime.launch.mode: entrypoint``, matrix/launch.py) the
instance's image started the server (``vllm serve`` in ``vllm/vllm-openai``, TGI's
launcher) for the cell's model, and the GPU Shopper server reported the session
``running`` only once its ``/health`` answered. The cell's runtime then uses that
server: it is found running on the API port, not started, and never stopped by the
plugin (its ``stop`` and ``unload`` leave a server without a pid file of theirs alone).
The load generator still runs on the instance over SSH and targets the port there.
"""

from __future__ import annotations

from ..errors import Stage, StageError
from ..matrix.launch import IMAGE_RUNTIMES, LaunchSpec
from .base import Runtime


def adopt_image_server(runtime: Runtime, launch: LaunchSpec | None) -> bool:
    """Point ``runtime`` at the image's server; True when it did (an entrypoint launch).

    The port is the one the image listens on inside the instance (``api_port``, sent
    first in ``exposed_ports``). The session's ``api_port``/``api_endpoint`` are the
    address outside, which on Vast.ai is a mapped port: the load generator runs
    inside, so it uses the image's own port.
    """
    if launch is None or not launch.entrypoint:
        return False
    if runtime.name not in IMAGE_RUNTIMES or launch.api_port is None:
        raise StageError(Stage.RUNTIME_SETUP, f"runtime {runtime.name!r} cannot use a server its image started",
                         hint="use runtime vllm or tgi with `launch: {mode: entrypoint}`, or `mode: ssh`")
    runtime.remote_port = launch.api_port  # type: ignore[attr-defined]  # the image runtimes' server port
    runtime.image_served = True  # type: ignore[attr-defined]  # never replaced by a server of ours
    runtime.started_here = False
    return True
