"""A session a run owns and whose release was never recorded: what the store reports
(:meth:`~pytest_gpubench.store.base.Store.unreleased_sessions`) and cleanup releases."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["OwnedSession"]


class OwnedSession(BaseModel):
    """A session the store knows a run rented, with the cell that rented it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    session_id: str
    run_id: str
    consumer_id: str | None = None
    row_id: str | None = None
    cell_id: str | None = None
    cell_status: str | None = None
    worker: str | None = None
    progress_file: str | None = None
    #: The last status the API reported, if any.
    session_status: str | None = None
    #: The attempt that rented it, or None when only the cell knows the session.
    attempt: int | None = None
