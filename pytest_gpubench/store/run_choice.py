"""Which run a person means: a run id, or ``last`` for the most recent one.

The one resolution of a run name, for every way in that takes one
(``gpubench export/upload/report --run``, ``--gpubench-resume``): it asks only the
:class:`~.base.Store` protocol, and says what went wrong in one wording.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnknownRun

if TYPE_CHECKING:
    from .base import Store

__all__ = ["LAST", "SHOWN_RUNS", "resolve_run"]

#: The name of the most recent run.
LAST = "last"
#: How many run ids an unknown-run error lists.
SHOWN_RUNS = 10


def resolve_run(store: Store, wanted: str) -> str:
    """The run id ``wanted`` names in ``store``: the most recent run for :data:`LAST`,
    else ``wanted`` itself if the store knows it.

    Raises :class:`~pytest_gpubench.errors.UnknownRun` when the store has no runs,
    or none of that id (naming the most recent ones).
    """
    known = store.run_ids()
    if not known:
        raise UnknownRun(wanted, f"the manifest {store.location} has no runs yet")
    if wanted == LAST:
        return known[0]
    if wanted not in known:
        shown = ", ".join(known[:SHOWN_RUNS]) + (f" (and {len(known) - SHOWN_RUNS} more)"
                                                 if len(known) > SHOWN_RUNS else "")
        raise UnknownRun(wanted, f"no run {wanted!r} in the manifest {store.location}; "
                                 f"runs available, most recent first: {shown}")
    return wanted
