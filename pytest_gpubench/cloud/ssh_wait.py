"""How long the ``ssh_wait`` stage waits for a session to become ``running``: template-aware.

The GPU Shopper server verifies SSH itself before it reports ``running``, and gives
up with "SSH verification timeout" (the session turns ``failed``) after:

* 8 minutes by default (``provisioner.DefaultSSHVerifyTimeout``);
* with a template, the template's recommended timeout (BUG-005): 10 minutes, or
  longer for a heavy image, found by a pattern in the image name
  (``models.heavyImageTimeouts``, mirrored in :data:`HEAVY_IMAGE_SSH_MINUTES`);
* ``ssh_timeout_minutes`` from the create request (1-30) when the client sends one.

In entrypoint mode (``runtime.launch``) the server checks the image's ``/health``
instead of SSH, for a flat 10 minutes (``provisioner.DefaultAPIVerifyTimeout``, no
heavy-image table), then fails the session "API verification timeout"
(:func:`entrypoint_wait`).

A heavy image also raises the ``provision`` and ``runtime_setup`` budgets to its
minutes from the same table (:func:`heavy_stage_seconds`, seed 001 BUG-005): pulling a
15 GB vLLM image and starting its server takes longer than Ollama's.

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

from ..errors import Stage
from ..settings import MIN_SCALED_TIMEOUT, SEED_STAGE_TIMEOUTS, Settings

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
#: The server's API check in entrypoint mode (``provisioner.DefaultAPIVerifyTimeout``), for any image.
SERVER_API_VERIFY_MINUTES = 10
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
    #: The session's Docker image, when known (a template's, or an entrypoint launch's).
    image: str | None = None


def heavy_image_minutes(image: str | None) -> int | None:
    """The heavy-image table's minutes for ``image``; None for a light (or unknown) image."""
    lowered = (image or "").lower()
    # Longest pattern first: the server iterates a Go map (no order); where two
    # patterns match, the longer timeout is the safe answer.
    for pattern, minutes in sorted(HEAVY_IMAGE_SSH_MINUTES.items(), key=lambda item: -item[1]):
        if pattern in lowered:
            return minutes
    return None


def recommended_ssh_minutes(image: str) -> int:
    """The server's SSH timeout for a template with this Docker image (its BUG-005 rule)."""
    return heavy_image_minutes(image) or TEMPLATE_DEFAULT_SSH_MINUTES


def entrypoint_wait(image: str) -> SshWait:
    """The wait for a session whose ``image`` serves the model: the server's API check, or the
    heavy-image table's minutes when longer (the server's verdict then arrives first)."""
    heavy = heavy_image_minutes(image)
    server = SERVER_API_VERIFY_MINUTES
    note = " (heavy image)" if heavy else ""
    return SshWait(_wait(max(server, heavy or 0)), None,
                   f"entrypoint image {image}{note}: server checks its /health for {server} min", image=image)


def heavy_stage_seconds(image: str | None) -> dict[Stage, float]:
    """The ``provision`` and ``runtime_setup`` budgets (seconds, before time scaling) of a session
    with ``image``: the seed's, or the heavy-image table's minutes when longer; empty for a light image."""
    minutes = heavy_image_minutes(image)
    if minutes is None:
        return {}
    return {stage: max(SEED_STAGE_TIMEOUTS[stage], minutes * 60.0) for stage in (Stage.PROVISION, Stage.RUNTIME_SETUP)}


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
    return SshWait(_wait(server), server, f"template {template}, {what}{heavy}: server checks SSH for {server} min",
                   image=image)


def stage_timeout(settings: Settings, stage: Stage, image: str | None) -> float:
    """``settings.stage_timeout(stage)``, raised for a heavy ``image`` (:func:`heavy_stage_seconds`)."""
    base = settings.stage_timeout(stage)
    heavy = heavy_stage_seconds(image).get(stage)
    return base if heavy is None else max(base, settings.scaled(heavy, MIN_SCALED_TIMEOUT))


def _wait(server_minutes: int) -> float:
    return max(SEED_SSH_WAIT_S, server_minutes * 60 + SERVER_VERDICT_MARGIN_S)
