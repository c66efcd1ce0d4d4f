"""Entrypoint mode in the sandbox: the instance's image starts the model server itself.

The GPU Shopper server, for a session created with ``launch_mode: entrypoint``
(``internal/service/provisioner/service.go``), launches the image with Vast.ai's
``runtype: ssh_proxy`` (SSH works as well), passes the model to it (vLLM images:
``VLLM_MODEL``; TGI: ``MODEL_ID``), takes the first of ``exposed_ports`` as the API port
(``internal/provider/vastai/client.go``: none given, none set), and instead of its SSH
check polls ``GET http://host:api_port/health`` every 15 s (2xx or 404 count as up) for
10 minutes: up, the session turns ``running`` with ``api_endpoint = http://host:api_port``;
not, it destroys the instance and fails the session "API verification timeout".

Here the "image" is a script run on the instance: the image's pull (its size in the
catalog's ``docker_images`` at the instance's pull rate, as the ``docker`` stand-in pulls
it, time-scaled: heavy images take minutes), then the launcher
stand-in the image name implies, on the API port. An image the sandbox knows no server
for starts none, and its session times out like a real one whose server never comes up.
"""

from __future__ import annotations

import asyncio
import shlex

import httpx

from ..runtime_facts import all_facts

#: What each known image runs: a pattern in its name -> the launcher's argv before the model and port.
IMAGE_SERVERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "serve"),
    "text-generation-inference": ("text-generation-launcher", "--model-id"),
    "tgi": ("text-generation-launcher", "--model-id"),
}
FALLBACK_IMAGE = "nvidia/cuda:12.6.3-runtime-ubuntu22.04"  # ImageSSHBase
FAILED_MESSAGE = "API verification timeout"


def image_of(docker_image: str, workload_type: str) -> str:
    """The image an entrypoint session runs: without ``docker_image``, the server's default for the
    workload type (``GetImageForWorkload``: the image its runtime's declaration names, ``ImageServer``)."""
    defaults = {facts.image.workload_type: facts.image.image for facts in all_facts() if facts.image is not None}
    return docker_image or defaults.get(workload_type, FALLBACK_IMAGE)


def server_script(image: str, model_id: str, port: int, pull_seconds: float) -> str:
    """The shell script that stands for ``image``'s entrypoint: pull, then serve ``model_id`` on ``port``."""
    lowered = image.lower()
    launcher = next((argv for pattern, argv in IMAGE_SERVERS.items() if pattern in lowered), None)
    pull = f"echo {shlex.quote('pulling ' + image)}; sleep {pull_seconds:.3f}\n"
    if launcher is None or not model_id or port <= 0:
        why = "no model server the sandbox knows" if launcher is None else "no model_id or API port"
        return pull + f"echo {shlex.quote(f'{image}: {why}; nothing serves')}\n"
    return pull + f"exec {shlex.join([*launcher, model_id, '--port', str(port)])}\n"


async def verify_api(host: str, port: int, *, timeout: float, interval: float, still_waiting) -> bool:
    """The server's ``waitForAPIVerifyAsync``: True once ``/health`` answers 2xx or 404 within ``timeout``.

    ``still_waiting()`` False (the session was ended meanwhile) stops the wait, False.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(timeout=10.0) as http:
        while still_waiting():
            if port > 0:
                try:
                    status = (await http.get(f"http://{host}:{port}/health")).status_code
                    if 200 <= status < 300 or status == 404:
                        return True
                except httpx.HTTPError:
                    pass
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(min(interval, max(deadline - loop.time(), 0.0) + 0.01))
    return False
