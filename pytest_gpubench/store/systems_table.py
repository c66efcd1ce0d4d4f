"""The manifest's side of the ``systems`` table (:mod:`.systems`): writing a session's
detected system and reading a run's back, as :mod:`.microbench_table` does for figures."""

from __future__ import annotations

from typing import Any

from ..remote.sysinfo import SystemInfo
from .sqlite import ManifestStore, utc_now
from .systems import system_row


class SystemsMixin(ManifestStore):
    """What system detection found, one row per session of a run; the cell rows are the manifest's."""

    def record_system(self, row_id: str, session_id: str, system: SystemInfo, machine: str = "") -> None:
        """Store ``system``, detected by cell ``row_id`` on ``session_id`` on ``machine`` (replacing the
        session's row)."""
        recorded = utc_now()

        def write() -> None:
            row = system_row(self._cell_or_raise(row_id), session_id, system, recorded, machine)
            self.db.table("systems").insert(row, replace=True, alter=True)  # alter: a file from before `machine`

        self._write(write)

    def system_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The systems of one run (or all), in the order they were recorded."""
        where, params = ("run_id = ?", [run_id]) if run_id is not None else (None, None)
        return self._retry(lambda: list(self.db.table("systems").rows_where(
            where, params, order_by="recorded_at, rowid")))
