"""The manifest's ``attempts`` table: one row per offer a cell tried (failover), with
its session, stage, error, times and cost; the spend cap reads it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import Stage, current_stage_name
from .schema import ATTEMPT_COLUMNS, ATTEMPT_STATUSES
from .sqlite import ManifestStore, plain, refuse_secrets, utc_now


class AttemptsMixin(ManifestStore):
    """Provisioning attempts of cells."""

    # ------------------------------------------------------------------ attempts

    def start_attempt(
        self,
        row_id: str,
        attempt: int,
        *,
        admit: Callable[[list[dict[str, Any]]], str | None] | None = None,
        counted_as: int | None = None,
        **fields: Any,
    ) -> str | None:
        """Record that cell ``row_id`` starts provisioning attempt ``attempt`` (1, 2, ...).

        ``admit``, when given, is called inside the same write transaction with every
        attempt row of the cell's run (all workers'), and returns ``None`` to go ahead
        or a reason to refuse; a refused attempt writes nothing and the reason is
        returned. The write lock is held from that read to the insert, so two
        processes cannot both take the last dollar of a budget. The cell's
        ``attempts`` column becomes ``counted_as`` (default ``attempt``: a cell run
        again with ``--gpubench-resume`` numbers on after its earlier rows, but
        counts this run's). ``fields`` are attempts columns (``offer_id``,
        ``price_per_hour``, ``expected_seconds``, ...).
        """
        row = self._check_attempt_fields({"status": "provisioning", **fields})

        def start() -> str | None:
            cell = self._cell_or_raise(row_id)
            if admit is not None:
                reason = admit(list(self.db.table("attempts").rows_where("run_id = ?", [cell["run_id"]])))
                if reason:
                    return reason
            self.db.table("attempts").insert(
                {**row, "manifest_id": row_id, "attempt": attempt, "run_id": cell["run_id"],
                 "started_at": utc_now()},
                replace=True,
            )
            self.db.table("benchmark_manifest").update(row_id, {"attempts": counted_as or attempt})
            return None

        return self._write(start)

    def update_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """Set attempts columns of one attempt; ``session_id`` also stamps ``session_started_at``."""
        row = self._check_attempt_fields(fields)
        if "session_id" in row and "session_started_at" not in row:
            row["session_started_at"] = utc_now()
        self._update_row("attempts", (row_id, attempt), row)

    def end_attempt(self, row_id: str, attempt: int, **fields: Any) -> None:
        """The attempt's session is released (or never existed): stamp ``ended_at`` and its cost.

        Unless given, ``cost_usd`` is ``price_per_hour`` x the time since
        ``session_started_at`` (0 when no session was created). Ending twice keeps
        the first end.
        """
        row = self._check_attempt_fields(fields)

        def end() -> None:
            found = list(self.db.table("attempts").rows_where(
                "manifest_id = ? AND attempt = ?", [row_id, attempt]))
            if not found:
                raise KeyError(f"no attempt {attempt} of {row_id!r}")
            current = found[0]
            if current["ended_at"]:
                return
            values = ended(row, current)
            self.db.table("attempts").update((row_id, attempt), values)

        self._write(end)

    def attempts(self, run_id: str | None = None, *, row_id: str | None = None) -> list[dict[str, Any]]:
        """Attempt rows of one cell (``row_id``), one run, or all, in order."""
        where, params = None, None
        if row_id is not None:
            where, params = "manifest_id = ?", [row_id]
        elif run_id is not None:
            where, params = "run_id = ?", [run_id]
        return self._retry(lambda: list(
            self.db.table("attempts").rows_where(where, params, order_by="started_at, manifest_id, attempt")))

    @staticmethod
    def _check_attempt_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        fixed = {"manifest_id", "attempt", "run_id", "started_at", "ended_at"}
        unknown = [k for k in fields if k not in ATTEMPT_COLUMNS or k in fixed]
        if unknown:
            raise ValueError(f"not updatable attempts columns: {', '.join(sorted(unknown))}")
        row = {key: plain(value) for key, value in fields.items()}
        if "status" in row and row["status"] not in ATTEMPT_STATUSES:
            raise ValueError(f"attempt status must be one of {', '.join(ATTEMPT_STATUSES)}, got {row['status']!r}")
        if row.get("stage") is not None:
            row["stage"] = Stage(current_stage_name(row["stage"])).value  # an older name: today's
        if row.get("machine_id") is not None:
            row["machine_id"] = str(row["machine_id"])
        refuse_secrets(row)
        return row


def ended(row: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` of the attempt ``current`` ending now: ``ended_at``, and unless given ``cost_usd``:
    ``price_per_hour`` x the time since ``session_started_at`` (0 when no session was created)."""
    now = datetime.now(timezone.utc)
    values = {**row, "ended_at": now.isoformat(timespec="milliseconds")}
    if "cost_usd" not in values:
        started, price = current["session_started_at"], current["price_per_hour"]
        hours = (now - datetime.fromisoformat(started)).total_seconds() / 3600 if started else 0.0
        values["cost_usd"] = (price or 0.0) * max(hours, 0.0)
    return values
