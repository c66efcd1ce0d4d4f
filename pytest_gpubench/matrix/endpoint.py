"""``runtime: {name: openai, endpoint: URL, ...}``: a server that is already up, benchmarked as it is.

Nothing is rented or started for such a cell: the ``endpoint`` provider
(``cloud/endpoint_provider.py``) stands in for the rental, and
``runtimes/openai_endpoint.py`` for the runtime. This module only checks what the
matrix says of the endpoint, so a bad URL stops collection with the field and line.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from ..options import MAX_PRICE_PER_HOUR
from .fields import _number, invalid
from .yaml_errors import describe

#: The runtime name of a running endpoint, and the ``cloud:`` and ``provider`` its cells go through.
ENDPOINT_RUNTIME = "openai"
ENDPOINT_CLOUD = "endpoint"
ENDPOINT_PROVIDER = "endpoint"
#: The keys of ``runtime:`` that describe a running endpoint (only with ``name: openai``).
ENDPOINT_KEYS = ("endpoint", "api", "api_key_env", "price_per_hour", "ca_file")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class EndpointSpec(BaseModel):
    """A running OpenAI-compatible server: where it is, which API to measure, how to authenticate."""

    model_config = ConfigDict(frozen=True)

    #: Its base URL, ``http(s)://host[:port][/prefix]`` (a trailing ``/v1`` is allowed), no credentials.
    url: str
    #: ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``).
    api: Literal["chat", "completions"] = "chat"
    #: The environment variable holding its bearer token; the token itself is never written anywhere.
    api_key_env: str | None = None
    #: What an hour of it costs, for $/M tokens (0: free or unknown).
    price_per_hour: float = 0.0
    #: A CA file an https:// server's certificate is verified against (else the system's trust store).
    ca_file: str | None = None

    @property
    def protocol(self) -> str:
        """The load generator's protocol for :attr:`api`."""
        return f"openai-{self.api}"


def endpoint_url(value: Any) -> str:
    """An absolute ``http://`` or ``https://`` URL with a host and no credentials, query or fragment."""
    example = "such as 'http://127.0.0.1:8000' or 'https://llm.example.com/v1'"
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the server's URL, {example}; got {describe(value)}")
    text = value.strip()
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise invalid(f"must be an absolute http:// or https:// URL, {example}; got {text!r}")
    if parsed.username is not None or parsed.password is not None or "@" in parsed.netloc:
        # Never echo it: the part before '@' is a secret.
        raise invalid("must not carry credentials (user:password@): put the token in an environment "
                      "variable and name it with `api_key_env`")
    if parsed.query or parsed.fragment:
        raise invalid(f"must be the server's base URL without '?' or '#', {example}; got {text!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        raise invalid(f"has an invalid port; got {text!r}") from None
    if not parsed.hostname or any(ch.isspace() for ch in text):
        raise invalid(f"needs a host name without spaces, {example}; got {text!r}")
    return text.rstrip("/")


def api_key_env(value: Any) -> str:
    """The name of an environment variable (never its value)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise invalid("must be the name of an environment variable holding the token, such as "
                      f"'OPENAI_API_KEY' (letters, digits, '_'); got {describe(value)}")
    return value


def endpoint_price(value: Any) -> float:
    allowed = f"must be a price in dollars per hour from 0 to {MAX_PRICE_PER_HOUR:g}"
    if not 0 <= _number(value, allowed) <= MAX_PRICE_PER_HOUR:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def ca_file(value: Any, base_dir: Path) -> str:
    """An existing CA file; a relative path is relative to the matrix file's folder."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the path of a PEM file of CA certificates; got {describe(value)}")
    path = Path(value.strip()).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise invalid(f"no such file: {str(path)!r}")
    return str(path.resolve())


EndpointUrl = Annotated[str, BeforeValidator(endpoint_url)]
EnvName = Annotated[str, BeforeValidator(api_key_env)]
EndpointPrice = Annotated[float, BeforeValidator(endpoint_price)]
