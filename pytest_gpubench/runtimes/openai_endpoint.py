"""A running OpenAI-compatible server (``runtime: openai``): checked and measured, never started.

:class:`OpenAIEndpointRuntime` implements :class:`~.base.Runtime` for a server that is
already up at the cell's ``endpoint:`` URL (``matrix/fields.py``). Nothing is
installed, started, pulled, unloaded or stopped: it is not ours. "Serving" is its
readiness (``/v1/models``, else ``/health``), with the bearer token from the
environment variable the matrix names; its version is vLLM's ``/version`` when the
server has one, else ``unknown``; "pulling" checks the model is among ``/v1/models``;
the warm-up is one request. The load generator runs on this machine against the URL
(the session's ``LocalShell``). The token is read where it is sent and never written:
messages name the URL and the variable, never the value.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from ..aio import tls_context
from ..errors import Stage, StageError
from ..matrix.cells import Cell
from ..matrix.fields import ENDPOINT_RUNTIME, EndpointSpec
from ..remote.ssh import Connection
from ..runtime_facts import RuntimeFacts
from .base import Endpoint, GpuPlacement, PulledModel, ServingApi

#: However long the stage may take, a server that is supposed to be up gets this long to answer.
READY_SECONDS = 30.0
_REFUSED = (401, 403)


@dataclass
class OpenAIEndpointRuntime:
    """A server already up at ``spec.url`` (a :class:`~.base.Runtime` that starts nothing)."""

    name: ClassVar[str] = ENDPOINT_RUNTIME
    conn: Connection
    spec: EndpointSpec
    version: str = ""
    started_here: bool = False
    num_parallel: int | None = None
    warmup_load_seconds: float | None = None
    cold_first_token_ms: float | None = None
    served: list[str] = field(default_factory=list)
    #: Nothing is started, so nothing is placed: the server runs where it runs.
    placement: GpuPlacement = GpuPlacement()
    tensor_parallel: ClassVar[None] = None

    @classmethod
    def for_cell(cls, conn: Connection, cell: Cell, placement: GpuPlacement = GpuPlacement()) -> OpenAIEndpointRuntime:
        if cell.endpoint is None:  # the matrix cannot say `openai` without an endpoint; a hand-made Cell can
            raise StageError(Stage.RUNTIME_SETUP, "runtime openai needs the cell's `endpoint: URL`")
        return cls(conn, cell.endpoint)

    # -- talking to it --------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL without a trailing ``/v1`` (the paths below add it)."""
        return self.spec.url[:-3] if self.spec.url.endswith("/v1") else self.spec.url

    def _headers(self, stage: Stage) -> dict[str, str]:
        name = self.spec.api_key_env
        if not name:
            return {}
        token = os.environ.get(name)
        if not token:
            raise StageError(stage, f"the token for {self.spec.url} is read from ${name}, which is not set here",
                             hint=f"export {name}=... before running pytest")
        return {"Authorization": f"Bearer {token}"}

    def _client(self, stage: Stage, timeout: float) -> httpx.AsyncClient:
        verify = tls_context()
        if self.spec.ca_file:
            verify = ssl.create_default_context(cafile=self.spec.ca_file)
        return httpx.AsyncClient(base_url=self.url, headers=self._headers(stage), timeout=timeout, verify=verify,
                                 trust_env=False)

    def _refused(self, stage: Stage, response: httpx.Response) -> StageError:
        given = f"the token from ${self.spec.api_key_env}" if self.spec.api_key_env else "no token"
        return StageError(stage, f"{self.spec.url} refused {given}: HTTP {response.status_code} "
                                 f"{_error_text(response)}".rstrip(),
                          hint="set `api_key_env:` in the runtime mapping to the variable holding a valid token")

    async def _models(self, stage: Stage, timeout: float = 30.0) -> list[str] | None:
        """``/v1/models``' ids; None when the server has no such route."""
        async with self._client(stage, timeout) as http:
            response = await http.get("/v1/models")
        if response.status_code in _REFUSED:
            raise self._refused(stage, response)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise StageError(stage, f"{self.spec.url}/v1/models answered HTTP {response.status_code} "
                                    f"{_error_text(response)}".rstrip())
        try:
            data = response.json().get("data", [])
            return [str(entry.get("id", "")) for entry in data if isinstance(entry, dict)]
        except (ValueError, AttributeError):
            raise StageError(stage, f"{self.spec.url}/v1/models did not answer a model list") from None

    async def _ready(self, stage: Stage, deadline: float) -> None:
        """Wait for ``/v1/models`` (or ``/health``) to answer; a refused token fails at once."""
        delay, reason = 0.1, "no answer"
        while True:
            try:
                models = await self._models(stage)
                if models is not None:
                    self.served = models
                    return
                async with self._client(stage, 10) as http:
                    health = await http.get("/health")
                if health.status_code == 200:
                    return
                reason = f"/health answered HTTP {health.status_code}"
            except httpx.HTTPError as exc:
                reason = _http_reason(exc)
            if time.monotonic() + delay > deadline:
                raise StageError(stage, f"no OpenAI-compatible server answers at {self.spec.url}: {reason}",
                                 hint="start the server first, or correct `endpoint:` in the runtime mapping")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- the Runtime protocol ------------------------------------------------------

    async def ensure_installed(self, timeout: float) -> bool:
        """Nothing to install: the server runs elsewhere."""
        return False

    async def locate(self, timeout: float) -> None:
        """The server is reached at its URL directly: nothing to forward."""

    async def ensure_serving(self, timeout: float, num_parallel: int = 1) -> str:
        """The server must answer (with the token); returns its version, ``unknown`` if it does not say."""
        await self._ready(Stage.RUNTIME_SETUP, time.monotonic() + min(timeout, READY_SECONDS))
        if not self.version:
            self.version = await self._version()
        return self.version

    async def _version(self) -> str:
        try:
            async with self._client(Stage.RUNTIME_SETUP, 10) as http:
                response = await http.get("/version")  # vLLM's; SGLang and TGI answer elsewhere or not at all
            version = response.json().get("version") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            version = None
        return str(version) if version else "unknown"

    async def ensure_healthy(self, timeout: float, stage: Stage = Stage.BENCHMARK,
                             on_restart: Callable[[str], None] | None = None) -> bool:
        """The server must still answer; it is not ours to restart."""
        await self._ready(stage, time.monotonic() + min(timeout, READY_SECONDS))
        return False

    async def pull(self, model: str, timeout: float,
                   on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Nothing to download: ``model`` must be one the server lists (when it lists any)."""
        await self.model_info(model)
        if on_progress is not None:
            on_progress({"status": "success", "model": model})

    async def model_info(self, model: str) -> PulledModel:
        try:
            served = await self._models(Stage.MODEL_PULL)
        except httpx.HTTPError as exc:
            raise StageError(Stage.MODEL_PULL, f"{self.spec.url}/v1/models: {_http_reason(exc)}") from None
        if served is not None:
            self.served = served
            if model not in served:
                raise StageError(Stage.MODEL_PULL, f"{self.spec.url} does not serve {model!r}; it serves: "
                                                   f"{', '.join(served) or 'nothing'}",
                                 hint="set the cell's `model:` to the served model's name")
        return PulledModel(name=model)

    async def warm_up(self, model: str, timeout: float, *, cold_start: bool = True) -> float:
        """One short request; the load time is 0 (the server had its model loaded before us)."""
        chat = self.spec.api == "chat"
        body: dict[str, Any] = {"model": model, "max_tokens": 1, "stream": False}
        body.update({"messages": [{"role": "user", "content": "Hello"}]} if chat else {"prompt": "Hello"})
        started = time.monotonic()
        try:
            async with self._client(Stage.MODEL_PULL, timeout) as http:
                response = await http.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise StageError(Stage.MODEL_PULL, f"warm-up of {model} at {self.spec.url} failed: "
                                               f"{_http_reason(exc)}") from None
        if response.status_code in _REFUSED:
            raise self._refused(Stage.MODEL_PULL, response)
        if response.status_code != 200:
            raise StageError(Stage.MODEL_PULL, f"warm-up of {model} at {self.spec.url} answered HTTP "
                                               f"{response.status_code} {_error_text(response)}".rstrip())
        if cold_start:
            self.warmup_load_seconds = 0.0
            self.cold_first_token_ms = (time.monotonic() - started) * 1000
        return 0.0

    @property
    def endpoint(self) -> Endpoint:
        api = ServingApi.OPENAI_CHAT if self.spec.api == "chat" else ServingApi.OPENAI_COMPLETIONS
        return Endpoint(remote_url=self.spec.url, local_url=self.spec.url, api=api,
                        api_key_env=self.spec.api_key_env, ca_file=self.spec.ca_file)

    async def residency(self, model: str) -> dict[str, Any] | None:
        return None  # the server does not say where its weights are

    async def loaded_models(self) -> list[str]:
        try:
            return await self._models(Stage.BENCHMARK) or []
        except (StageError, httpx.HTTPError):
            return []

    def canonical_model(self, model: str) -> str:
        return model

    async def unload(self, model: str) -> None:
        """Not ours: left as it is."""

    async def remove(self, model: str) -> None:
        """Not ours: left as it is."""

    async def stop(self, timeout: float, stage: Stage = Stage.RUNTIME_SETUP) -> None:
        """Not ours: left running."""


def _error_text(response: httpx.Response) -> str:
    """The server's error message, short (OpenAI's ``{"error": {"message"}}`` or plain text)."""
    try:
        payload = response.json()
        error = payload.get("error", payload.get("message", payload.get("detail")))
        if isinstance(error, dict):
            error = error.get("message")
        text = str(error or "")
    except (ValueError, AttributeError):
        text = response.text
    return text.strip()[:300]


def _http_reason(exc: httpx.HTTPError) -> str:
    reason = str(exc) or type(exc).__name__
    return reason if type(exc).__name__ in reason else f"{type(exc).__name__}: {reason}"


#: A server already running elsewhere: nothing launched, rented or imitated on an instance (its tests run a
#: stand-in endpoint of their own); its version is vLLM's ``/version`` when the server has one.
RUNTIME = RuntimeFacts(name=ENDPOINT_RUNTIME, runtime=OpenAIEndpointRuntime, health_path="/v1/models")
