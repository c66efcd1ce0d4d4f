"""How long the ``ssh_wait`` stage waits for a session to become ``running``: template-aware.

The GPU Shopper server verifies SSH itself before it reports ``running``, and gives
up with "SSH verification timeout" (the session turns ``failed``) after:

* 8 minutes by default (``provisioner.DefaultSSHVerifyTimeout``);
* with a template, the template's recommended timeout (BUG-005): 10 minutes, or
  longer for a heavy image, found by a pattern in the image name
  (``models.heavyImageTimeouts``, mirrored in :data:`HEAVY_IMAGE_SSH_MINUTES`);
* ``ssh_timeout_minutes`` from the create request (1-30) when the client sends one.

The rule here: the plugin waits the seed's 10 minutes, or the server's own SSH
timeout plus :data:`SERVER_VERDICT_MARGIN_S` when that is longer, so that the
server's verdict (a clear error, and a session already released on its side)
normally arrives before the plugin's own timeout. With a template the plugin also
sends the template's timeout as ``ssh_timeout_minutes``, so the server applies it
even when its own template lookup fails. Everything is on the run's clock
(``--gpubench-time-scale``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The server's heavy-image table (``pkg/models/template.go``): image pattern -> minutes,
#: plus the TGI image's full name, which the server's ``tgi`` pattern does not match.
HEAVY_IMAGE_SSH_MINUTES: dict[str, int] = {
    "vllm": 15,
    "nemo": 15,
    "megatron": 15,
    "tgi": 12,
    "text-generation-inference": 12,
    "tensorrt": 12,
    "deepspeed": 12,
    "triton": 12,
    "ollama": 12,
}
#: The server's SSH timeout for a template whose image is not heavy.
TEMPLATE_DEFAULT_SSH_MINUTES = 10
#: The server's SSH timeout without a template or client override.
SERVER_DEFAULT_SSH_MINUTES = 8
#: Seed 000's SSH wait.
SEED_SSH_WAIT_S = 600.0
#: Extra time after the server's own SSH timeout: its verdict (and TensorDock's
#: 90 s cloud-init delay before the server starts checking) fits inside it.
SERVER_VERDICT_MARGIN_S = 120.0


@dataclass(frozen=True)
class SshWait:
    """The ``ssh_wait`` budget of one session, before time scaling."""

    seconds: float
    #: Sent as ``ssh_timeout_minutes`` in the create request, or None for the server's default.
    server_minutes: int | None
    #: Why: printed in the progress file's ``PROVISIONING`` line.
    reason: str


def recommended_ssh_minutes(image: str) -> int:
    """The server's SSH timeout for a template with this Docker image (its BUG-005 rule)."""
    lowered = image.lower()
    # Longest pattern first: the server iterates a Go map (no order); where two
    # patterns match, the longer timeout is the safe answer.
    for pattern, minutes in sorted(HEAVY_IMAGE_SSH_MINUTES.items(), key=lambda item: -item[1]):
        if pattern in lowered:
            return minutes
    return TEMPLATE_DEFAULT_SSH_MINUTES


def ssh_wait_for(template: str | None, image: str | None) -> SshWait:
    """The SSH wait for a session created from ``template`` (whose image is ``image``, if known).

    A template whose image could not be looked up counts as a template with a
    light image (the server's template default).
    """
    if not template:
        server = SERVER_DEFAULT_SSH_MINUTES
        return SshWait(_wait(server), None, f"no template: server checks SSH for {server} min")
    server = recommended_ssh_minutes(image or "")
    what = f"image {image}" if image else "image unknown"
    heavy = " (heavy image)" if server > TEMPLATE_DEFAULT_SSH_MINUTES else ""
    return SshWait(_wait(server), server, f"template {template}, {what}{heavy}: server checks SSH for {server} min")


def _wait(server_minutes: int) -> float:
    return max(SEED_SSH_WAIT_S, server_minutes * 60 + SERVER_VERDICT_MARGIN_S)
