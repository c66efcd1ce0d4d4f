"""Ids that become path segments: the one rule for every name made into a file or folder
name or into one segment of an API URL (a run id, a session id).

An id is 1-255 ASCII letters, digits, ``.``, ``_`` or ``-`` and does not start with ``.``:
so it is never ``.`` or ``..``, never a hidden file, never holds a ``/`` or ``\\``, and a
server reads it as one URL segment. Ids from outside the user's own hands (API answers,
the rows of a shared store) are checked where they enter (:func:`check_id`); paths built
from ids go through :func:`path_under`, which refuses any that would leave its folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import InvalidId

__all__ = ["ID_RULE", "InvalidId", "MAX_ID", "check_id", "is_id", "path_under", "shown_id"]

#: The longest id: a file name's limit on Linux and macOS.
MAX_ID = 255
_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
#: The rule in words, for error messages.
ID_RULE = "letters, digits, '.', '_' or '-', not starting with '.'"


def is_id(text: object, max_length: int = MAX_ID) -> bool:
    """Whether ``text`` is an id by the module's rule, at most ``max_length`` characters."""
    return isinstance(text, str) and 0 < len(text) <= max_length and _ID.fullmatch(text) is not None


def shown_id(text: object) -> str:
    """``text`` fit for a one-line message: quoted, escapes visible, cut at 80 characters."""
    return repr(text if not isinstance(text, str) or len(text) <= 80 else text[:77] + "...")


def check_id(text: object, what: str, max_length: int = MAX_ID) -> str:
    """``text`` when it is an id (see the module), else :class:`InvalidId` naming ``what``
    (``"session id"``, ``"run id"``) and the rule."""
    if not is_id(text, max_length):
        raise InvalidId(f"{what} {shown_id(text)} is not a valid id: 1-{max_length} {ID_RULE}")
    return str(text)


def path_under(folder: str | Path, *ids: str, what: str = "id") -> Path:
    """``folder/id/...``, each part checked by :func:`check_id`: the path cannot leave ``folder``
    (no part is ``..``, none holds a separator)."""
    path = Path(folder)
    for part in ids:
        path = path / check_id(part, what)
    return path
