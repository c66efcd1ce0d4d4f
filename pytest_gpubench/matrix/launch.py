"""``runtime.launch``: how GPU Shopper starts an instance, and whether its image serves the model.

GPU Shopper launches an instance in one of two modes (``CreateSessionRequest.launch_mode``
in the server's ``internal/api/handlers.go``): ``ssh`` (the default: a base image with SSH;
the plugin starts the runtime itself) or ``entrypoint``: the image's own entrypoint starts
the model server (vLLM, TGI) for ``model_id`` on the first of ``exposed_ports``, and the
session turns ``running`` only once ``GET http://host:api_port/health`` answers. SSH still
works in that mode (Vast.ai ``runtype: ssh_proxy``), so the load generator runs on the
instance as usual. See docs/runtimes.md, "Entrypoint mode".

A matrix writes, in ``runtime:`` (file or row)::

    runtime: {name: vllm, launch: {mode: entrypoint, image: vllm/vllm-openai:v0.10.1, api_port: 8000}}

:class:`LaunchSpec` validates the mapping; :func:`launch_problem` checks it against the
runtime and template it is used with; :func:`resolved` fills the defaults the server
would use, so a cell records what was actually asked for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..runtime_facts import facts_of, image_runtimes, is_runtime
from .fields import StrictModel, describe, invalid, is_image_reference

# Which runtimes GPU Shopper can start from an image, the ``workload_type`` that tells it which
# (``pkg/models/session.go``: ``llm_vllm``, ``llm_tgi``) and the server's default image and API port
# for it are each runtime's declaration (``RuntimeFacts.image``, runtime_facts.py).
MAX_EXPOSED_PORTS = 16

def _port(value: Any, what: str = "must be") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise invalid(f"{what} a port from 1 to 65535; got {describe(value)}")
    return value


class LaunchSpec(StrictModel):
    """``runtime.launch``: the session's launch mode and, for ``entrypoint``, what its image serves."""

    mode: Literal["ssh", "entrypoint"] = "ssh"
    #: The Docker image (``docker_image``); None: the server's default for the runtime.
    image: str | None = None
    #: The port the image's server listens on (sent first in ``exposed_ports``); None: the runtime's default.
    api_port: int | None = None
    #: More ports to expose beside the API port.
    exposed_ports: tuple[int, ...] = ()

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        if value not in ("ssh", "entrypoint"):
            raise invalid(f"must be 'ssh' or 'entrypoint'; got {describe(value)}")
        return value

    @field_validator("image", mode="before")
    @classmethod
    def _image(cls, value: Any) -> Any:
        if value is None:
            return None
        if not is_image_reference(value):
            raise invalid("must be a plain Docker image reference such as 'vllm/vllm-openai:v0.10.1' "
                          f"([registry/]name[:tag][@sha256:digest], lower-case name); got {describe(value)}")
        return value

    @field_validator("api_port", mode="before")
    @classmethod
    def _api_port(cls, value: Any) -> Any:
        return None if value is None else _port(value)

    @field_validator("exposed_ports", mode="before")
    @classmethod
    def _exposed_ports(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) > MAX_EXPOSED_PORTS:
            raise invalid(f"must be a list of at most {MAX_EXPOSED_PORTS} ports such as [8000, 8080]; "
                          f"got {describe(value)}")
        ports = tuple(_port(port, "every port must be") for port in value)
        if len(set(ports)) != len(ports):
            raise invalid(f"lists a port twice: {list(ports)}")
        return ports

    @model_validator(mode="after")
    def _entrypoint_only(self) -> LaunchSpec:
        if self.mode == "ssh":
            # The server passes docker_image on only in entrypoint mode (provisioner/service.go).
            extra = [key for key in ("image", "api_port", "exposed_ports") if key in self.model_fields_set]
            if extra:
                verb = "apply" if len(extra) > 1 else "applies"
                raise invalid(f"{', '.join(extra)} {verb} only with `mode: entrypoint` (the image serves the "
                              "model); in `mode: ssh` the plugin starts the runtime itself")
        return self

    @property
    def entrypoint(self) -> bool:
        return self.mode == "entrypoint"


def launch_problem(launch: LaunchSpec, runtime: str, template: str | None) -> str | None:
    """Why ``launch`` cannot be used with ``runtime`` and an offer ``template``; None when it can."""
    if not launch.entrypoint:
        return None
    if not is_runtime(runtime) or facts_of(runtime).image is None:
        known = ", ".join(image_runtimes())
        return (f"`mode: entrypoint` needs a runtime GPU Shopper starts from an image ({known}); "
                f"runtime {runtime!r} is started by the plugin over SSH: use `mode: ssh` or another runtime")
    if template:
        # buildCreateRequest (internal/provider/vastai/client.go) uses a template and ignores the entrypoint.
        return ("`mode: entrypoint` cannot be combined with `offer.template`: GPU Shopper builds a templated "
                "instance from the template and ignores the image; drop one of the two")
    return None


def resolved(launch: LaunchSpec | None, runtime: str) -> LaunchSpec | None:
    """The launch a cell asks for, the server's defaults filled (image, API port); None for an SSH launch.

    There is no ``model_id`` key: the image serves the cell's model (the create request's
    ``model_id``), as the requests name the served model and another could not be measured."""
    if launch is None or not launch.entrypoint:
        return None
    server = facts_of(runtime).image
    assert server is not None, f"runtime {runtime!r} has no image: launch_problem refuses it first"
    return launch.model_copy(update={
        "image": launch.image or server.image,
        "api_port": launch.api_port or server.api_port,
    })


def exposed_ports(launch: LaunchSpec) -> list[int]:
    """``exposed_ports`` for the create request: the API port first (the server's ``api_port`` is the first)."""
    first = [launch.api_port] if launch.api_port else []
    return first + [port for port in launch.exposed_ports if port != launch.api_port]
