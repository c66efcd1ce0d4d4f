"""Text from outside (instance output, API answers) made safe to show: one line, nothing a terminal obeys.

Remote stderr, a model's error text or a store row may carry terminal escape sequences (colours,
cursor moves, a title change, an OSC 8 link) and line breaks. :func:`one_line` is the one rule for
everything such text reaches: progress files (one record per line), failure messages in the
terminal and JUnit, warnings. Standard library only: ``errors`` imports it.
"""

from __future__ import annotations

import re

__all__ = ["one_line"]

#: Escape sequences as a whole, so no ``[31m`` is left behind: CSI (``ESC [`` or the 8-bit ``\x9b``,
#: parameters, final byte), OSC/DCS/SOS/PM/APC strings (to BEL or ST, or the end of the text),
#: and two-character escapes.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x1b][\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|[\x90\x9d\x9e\x9f\x98][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
#: Everything ``str.splitlines()`` would break on, the other C0 and C1 control characters, and the
#: bidirectional overrides that make a terminal show text in another order than it is.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]+")


def one_line(text: str) -> str:
    """``text`` with escape sequences removed and every run of control characters made one space."""
    return _CONTROL.sub(" ", _ESCAPES.sub("", text))
