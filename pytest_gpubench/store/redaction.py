"""A store's location fit to print: the one place a URL's password is hidden.

Its own module so the stores (which name themselves by it) and :mod:`.opening`
(which opens them) both import it without importing each other.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["redact"]


def redact(location: str | Path) -> str:
    """``location`` fit to print: a URL's password replaced by ``***``."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", str(location))
