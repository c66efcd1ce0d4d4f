"""A store's location fit to print: :func:`pytest_gpubench.errors.redact`, named here for the
stores (which name themselves by it) and :mod:`.opening` (which opens them)."""

from __future__ import annotations

from ..errors import redact, split_userinfo

__all__ = ["redact", "split_userinfo"]
