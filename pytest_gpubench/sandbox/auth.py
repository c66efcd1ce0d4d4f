"""The sandbox's bearer token: every route of its API needs it (issue 21 item 3).

A sandbox rents out sessions whose private keys run commands as the user who started
it, so its API is that user's alone: each start draws a random token
(:func:`new_token`), and a request without ``Authorization: Bearer <token>`` answers
401 (compared in constant time, :func:`authorized`). Whoever starts a sandbox passes the
token on the way the real GPU Shopper client already takes one: ``GPUBENCH_API_TOKEN``,
sent as ``Authorization: Bearer``.

The token travels only through a process's environment (``GPUBENCH_SANDBOX_TOKEN``:
the token a sandbox program requires instead of a random one; ``/proc/PID/environ`` is
its owner's only), the pipe ``gpubench sandbox`` prints it to, and memory; never through
a command line (``ps`` shows those to everyone), a log or a file others can read.

A light module: the plugin imports it without aiohttp.
"""

from __future__ import annotations

import hmac
import secrets

#: The token a sandbox program (``gpubench sandbox``, ``python -m pytest_gpubench.sandbox``)
#: requires, when its environment sets one; else a new random token per start.
TOKEN_ENV = "GPUBENCH_SANDBOX_TOKEN"
#: The variable the plugin and the commands read their API token from (settings.py).
CLIENT_TOKEN_ENV = "GPUBENCH_API_TOKEN"
#: The line ``gpubench sandbox`` prints after its URL line: a shell line that hands the token
#: to the plugin in another shell.
TOKEN_LINE_PREFIX = f"export {CLIENT_TOKEN_ENV}="


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe (nothing a shell or a header treats specially)."""
    return secrets.token_urlsafe(32)


def bearer(token: str) -> dict[str, str]:
    """The request header that carries ``token``."""
    return {"Authorization": f"Bearer {token}"}


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` as a bearer token
    (the comparison takes the same time however much of it matches)."""
    scheme, _, given = (header or "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def token_from_line(line: str) -> str | None:
    """The token in a line ``gpubench sandbox`` printed (``export GPUBENCH_API_TOKEN=...``), else None."""
    line = line.strip()
    return line[len(TOKEN_LINE_PREFIX):] if line.startswith(TOKEN_LINE_PREFIX) else None
