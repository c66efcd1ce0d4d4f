"""URLs fit to print: the one place a URL's credentials are hidden.

A top-level module so that every layer can use it: the stores (which name themselves by it),
the API client and its errors (an API URL may carry ``user:password@``), the commands.

What is hidden, in every URL found in the text (``scheme://`` up to a space or a quote):

* a password: ``user:secret@host`` shows as ``user:***@host``, whatever the password holds
  (``/``, ``@``, ``:``, ``%40``...): the userinfo runs to the *last* ``@`` of the URL, which
  libpq and git read as a password the standard parser would take for a path;
* a lone user name where it is usually a token (``git+https://ghp_TOKEN@github.com/o/r.git``):
  ``***@host``; a PostgreSQL or ssh user name is a name, not a secret, and stays;
* the values of the query parameters ``password``, ``sslpassword`` and ``token`` (any case).

Text that holds no URL (a path, ``git@github.com:o/r``) comes back unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["redact", "split_userinfo"]

#: A URL inside a message: from its scheme to the first space or quote.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]*""")
_SECRET_PARAMETER = re.compile(r"([?&;](?:password|sslpassword|token)=)[^&#;]*", re.IGNORECASE)
#: Schemes whose user name alone is an account name, not a credential.
_USER_IS_A_NAME = frozenset({"postgresql", "postgres", "ssh", "git+ssh"})


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``(scheme://, userinfo or None, the rest)`` of ``url``: the userinfo is everything before the
    URL's last ``@`` when the user name (before its first ``:``) holds no ``/``, ``?`` or ``#``, so a
    password with ``/`` or ``@`` in it stays whole; ``('', None, url)`` when ``url`` is not one."""
    # Not urllib.parse.urlsplit: its netloc ends at the first "/", which cuts a password in two
    # (and it raises on a stray "["), where libpq and git read up to the last "@".
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url)
    if scheme is None:
        return "", None, url
    head, rest = scheme[0], url[scheme.end():]
    userinfo, at, host = rest.rpartition("@")
    if not at or re.search(r"[/?#]", userinfo.partition(":")[0]):
        return head, None, rest
    return head, userinfo, host


def _redact_url(url: str) -> str:
    head, userinfo, rest = split_userinfo(url)
    rest = _SECRET_PARAMETER.sub(r"\1***", rest)
    if userinfo is None:
        return head + rest
    user, colon, _ = userinfo.partition(":")
    if colon:
        shown = f"{user}:***"
    else:
        shown = user if head[:-3].lower() in _USER_IS_A_NAME else "***"
    return f"{head}{shown}@{rest}"


def redact(location: str | Path) -> str:
    """``location`` (a store location, or a message naming URLs) fit to print: every URL's
    credentials replaced by ``***`` (see the module's docstring for which parts)."""
    return _URL.sub(lambda found: _redact_url(found[0]), str(location))
