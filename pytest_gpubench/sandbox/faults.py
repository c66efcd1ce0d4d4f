"""Fault injection for the sandbox (``/sandbox/faults``): the failures seed 001 lists.

Faults on an offer wait in a :class:`FaultBook` until the cloud meets them; each
fires ``times`` times (default: until cleared with ``DELETE /sandbox/faults``):

``provision_error`` (``offer_id``, ``message``, ``when``)
    ``when: "boot"`` (default): the create answers 201, then at boot the instance
    fails and the session turns ``failed`` with ``message`` as its error (and, a
    lifecycle tick later, ``stopped`` keeping it, as the real server does).
    ``when: "create"``: the create itself answers 500 with ``error_type`` and
    ``retry_suggested``, the session record is ``failed``.
``stale_inventory`` (``offer_id``)
    the create answers 503 ``stale_inventory`` and the offer leaves the listing
    for the provider's cache TTL.
``no_ssh`` (``offer_id``)
    the instance boots and reports a host and port, but nothing accepts SSH: the
    session stays ``provisioning`` until the server's SSH check gives up
    (``ssh_timeout_minutes`` of the create, default 8 minutes, time-scaled), then
    ``failed`` with "SSH verification timeout".
``missing_tools`` (``offer_id``, ``tools``)
    the instance boots without some of the programs a rented box usually has:
    any of ``nvidia-smi`` (a machine without an NVIDIA driver), ``python3`` (the
    load generator must then run on the client), ``curl`` (the default Ollama
    install cannot download) and the OpenAI servers' launchers ``vllm``,
    ``llama-server``, ``text-generation-launcher`` and ``sglang`` (the Python
    package): their runtime has nothing to serve with; ``torch`` (the Python package
    the microbenchmarks need: ``pip install torch`` then installs the stand-in from the
    instance's local wheel, :mod:`.instances`). Neither the stand-in nor the host's own
    copy is on the instance's ``PATH``.
``gpu_memory`` (``offer_id``, ``memory_mib``)
    the instance's GPU has ``memory_mib`` MiB, whatever the offer listed (a
    mislisted machine): ``nvidia-smi`` and Ollama's memory check go by it.
``gpu_driver`` (``offer_id``, ``driver``)
    the instance's driver answers system detection differently (the instance
    file's ``gpu_tools``): ``driver: nvml``, ``nvidia-ml-py`` is installed and its
    ``pynvml`` answers from the catalog (NVML faked where no GPU exists);
    ``driver: old``, an old driver whose ``nvidia-smi -q -x`` fails and whose
    ``--query-gpu`` does not know ``compute_cap``; ``driver: old_nvml``, that old driver
    with ``nvidia-ml-py`` installed.

Faults that act at once:

``kill_instance`` (``session_id``, ``silent``)
    the instance dies: its processes are killed, SSH closes, and the session is
    ``stopped`` with "Instance not found on provider during reconciliation".
    With ``silent: true`` it vanishes as a host dropped from the network does:
    its SSH connections stay open but carry nothing more, so only the API (or a
    keepalive) can tell (asyncssh SSH server only).
``drop_ssh`` (``session_id``)
    the network cuts the instance's open SSH connections; the instance and every
    command on it keep running, and new connections are accepted (asyncssh SSH
    server only).
``stop_ollama`` (``session_id``, ``hang``)
    the instance's ``ollama serve`` crashes (SIGKILL); nothing restarts it. With
    ``hang: true`` it hangs instead (SIGSTOP): alive, holding its port, silent.
``stop_server`` (``session_id``, ``hang``)
    the instance's OpenAI-server launchers (``vllm``, ``llama-server``, SGLang's,
    TGI's; every one running) crash (SIGKILL), or with ``hang: true`` hang (SIGSTOP).
``stall_stream`` (``session_id``, ``after_tokens``, ``times``)
    the next ``times`` generations (default: every one, until cleared) stop after
    ``after_tokens`` tokens and stay silent until the client gives up: under
    ``ollama serve`` and every OpenAI-server launcher alike (one engine), as is
    ``empty_output``.
``empty_output`` (``session_id``, ``times``)
    the next ``times`` generations end at once, done with no token at all.
``worker_crash``, ``worker_malformed``, ``worker_failed`` (``session_id``, ``after_tokens``, ``times``)
    the next ``times`` requests to the instance's worker containers (``docker run``,
    every one until cleared) meet, after ``after_tokens`` deltas: an exit with status
    3 and a CUDA error on stderr; a line on stdout that is not JSON; a ``finish``
    with ``status: failed``. (A heavy image is no fault: the catalog's
    ``docker_images`` sizes make ``vllm/vllm-openai`` pull for minutes.)
``pull_error`` (``session_id``, ``message``, ``times``)
    the next ``times`` model pulls on the instance (default: every one, until
    cleared; a firing is counted in the state file, so a restarted server does not
    fire it again) fail as a registry that drops the download does: after ``pulling
    manifest`` and the first report of the weights layer (right after the manifest
    for a model already on disk, whose manifest Ollama still fetches), the stream
    ends with ``{"error": message}`` (default ``max retries exceeded: unexpected
    EOF``) and the model is not added; ``stream: false`` answers 500 with it.
``not_ready`` (``seconds``)
    ``/health`` and ``/ready`` answer 503 for that many (real) seconds, like the
    server's start-up sweep.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OFFER_FAULTS = frozenset({"provision_error", "stale_inventory", "no_ssh", "missing_tools", "gpu_memory",
                          "gpu_driver"})
#: Faults that act on a running session's instance at once.
#: Faults of the ``docker`` stand-in's worker containers (:mod:`.worker_standin`).
WORKER_FAULTS = frozenset({"worker_crash", "worker_malformed", "worker_failed"})
SESSION_FAULTS = frozenset({"kill_instance", "drop_ssh", "stop_ollama", "stop_server", "stall_stream",
                            "empty_output", "pull_error"}) | WORKER_FAULTS
#: What a ``pull_error`` says without a ``message``: Ollama's words when the registry drops the download.
PULL_ERROR_MESSAGE = "max retries exceeded: unexpected EOF"
FaultKind = Literal["provision_error", "stale_inventory", "no_ssh", "missing_tools", "gpu_memory", "kill_instance",
                    "drop_ssh", "stop_ollama", "stop_server", "stall_stream", "empty_output", "not_ready",
                    "worker_crash", "worker_malformed", "worker_failed", "gpu_driver", "pull_error"]
#: What the ``gpu_driver`` fault makes of the instance's driver: its ``gpu_tools``.
DRIVER_TOOLS: dict[str, dict[str, object]] = {
    "nvml": {"nvml": True},
    "old": {"xml_log": False, "refused_fields": ["compute_cap"]},
    # An old driver with nvidia-ml-py installed: NVML knows the compute capability, the CSV query does not.
    "old_nvml": {"nvml": True, "xml_log": False, "refused_fields": ["compute_cap"]},
}
#: What ``missing_tools`` can leave out of an instance.
OMITTABLE_TOOLS = ("nvidia-smi", "python3", "curl", "vllm", "llama-server", "text-generation-launcher", "sglang",
                   "docker", "torch")
Tool = Literal["nvidia-smi", "python3", "curl", "vllm", "llama-server", "text-generation-launcher", "sglang", "docker",
               "torch"]


class FaultRequest(BaseModel):
    """The body of ``POST /sandbox/faults``."""

    model_config = ConfigDict(extra="forbid")

    fault: FaultKind
    offer_id: str | None = None
    session_id: str | None = None
    message: str = "No available public IPs"
    when: Literal["boot", "create"] = "boot"
    times: int | None = Field(default=None, ge=1)
    seconds: float = Field(default=5.0, ge=0)
    tools: list[Tool] = Field(default_factory=list)
    memory_mib: int | None = Field(default=None, ge=1)
    driver: Literal["nvml", "old", "old_nvml"] | None = None
    after_tokens: int = Field(default=3, ge=0)
    silent: bool = False
    hang: bool = False

    @model_validator(mode="after")
    def _check_target(self) -> FaultRequest:
        if self.fault in OFFER_FAULTS and not self.offer_id:
            raise ValueError(f"fault {self.fault} needs offer_id")
        if self.fault in SESSION_FAULTS and not self.session_id:
            raise ValueError(f"fault {self.fault} needs session_id")
        if self.fault == "gpu_memory" and self.memory_mib is None:
            raise ValueError("fault gpu_memory needs memory_mib")
        if self.fault == "gpu_driver" and self.driver is None:
            raise ValueError(f"fault gpu_driver needs driver: one of {', '.join(DRIVER_TOOLS)}")
        if self.fault == "missing_tools" and not self.tools:
            raise ValueError(f"fault missing_tools needs tools: a list of {', '.join(OMITTABLE_TOOLS)}")
        return self


class Fault(BaseModel):
    """A fault waiting in the book."""

    id: int
    fault: FaultKind
    offer_id: str
    message: str
    when: Literal["boot", "create"]
    remaining: int | None
    fired: int = 0
    tools: list[str] = Field(default_factory=list)
    memory_mib: int | None = None
    driver: str | None = None


class FaultBook:
    """The faults still waiting to fire, by offer."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)

    def add(self, request: FaultRequest) -> Fault:
        """Arm an offer fault."""
        assert request.fault in OFFER_FAULTS and request.offer_id
        fault = Fault(
            id=next(self._ids),
            fault=request.fault,
            offer_id=request.offer_id,
            message=request.message,
            when=request.when,
            remaining=request.times,
            tools=list(dict.fromkeys(request.tools)),
            memory_mib=request.memory_mib,
            driver=request.driver,
        )
        self._faults.append(fault)
        return fault

    def take(self, kind: str, offer_id: str, *, when: str | None = None) -> Fault | None:
        """The first armed fault of ``kind`` for ``offer_id``, counting one firing."""
        for fault in self._faults:
            if fault.fault != kind or fault.offer_id != offer_id:
                continue
            if when is not None and fault.when != when:
                continue
            fault.fired += 1
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
            return fault
        return None

    def list(self) -> list[Fault]:
        """The faults still armed."""
        return list(self._faults)

    def clear(self) -> int:
        """Disarm everything; returns how many faults were removed."""
        count = len(self._faults)
        self._faults.clear()
        return count
