"""A store location fit to print: the one place a URL's password is hidden.

Its own module so that the stores themselves (:mod:`.git_repo`, a database store) can
hide it without importing :mod:`.opening`, which imports them.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["redact"]


def redact(location: str | Path) -> str:
    """``location`` fit to print: a URL's password replaced by ``***``."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", str(location))
