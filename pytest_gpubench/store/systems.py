"""The manifest's ``systems`` table: what system detection found, one row per session of a run.

A reused session is recorded once (by the cell that connected first); recording the
same session again replaces its row. The ``SystemInfo`` is kept whole as JSON, with the
columns a person browsing the file wants beside it (source, GPU, count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlite_utils

from ..remote.sysinfo import SystemInfo
from .records import SystemRecord

SYSTEM_COLUMNS: dict[str, type] = {
    "run_id": str,
    "session_id": str,
    "manifest_id": str,  # the cell that detected it
    "gpu_type": str,
    "provider": str,
    "machine": str,  # the offer's machine (a host's name): which of the provider's machines ran
    "source": str,  # nvml, nvidia-smi-xml, nvidia-smi-csv
    "gpu_name": str,
    "gpu_count": int,
    "recorded_at": str,
    "system_json": str,
}


def create_systems_table(db: sqlite_utils.Database) -> None:
    """Create the table when missing (a file from before it gains it when opened)."""
    db["systems"].create(SYSTEM_COLUMNS, pk=("run_id", "session_id"),
                         not_null={"run_id", "session_id", "manifest_id", "system_json"}, if_not_exists=True)


def system_row(cell: Mapping[str, Any], session_id: str, system: SystemInfo, recorded_at: str,
               machine: str = "") -> dict[str, Any]:
    """The row of ``system``, detected by the manifest row ``cell`` on ``session_id`` on ``machine``."""
    first = system.first
    return {
        "run_id": cell["run_id"], "session_id": session_id, "manifest_id": cell["id"],
        "gpu_type": cell["gpu_type"], "provider": cell["provider"], "machine": machine, "source": system.source,
        "gpu_name": first.name if first else "", "gpu_count": len(system.gpus),
        "recorded_at": recorded_at, "system_json": system.model_dump_json(),
    }


def system_record(row: Mapping[str, Any]) -> SystemRecord:
    """A stored row as the record the store answers with."""
    return SystemRecord(run_id=row["run_id"], session_id=row["session_id"], row_id=row["manifest_id"],
                        gpu_type=row.get("gpu_type") or "", provider=row.get("provider") or "",
                        machine=row.get("machine") or "",
                        recorded_at=row.get("recorded_at"),
                        system=SystemInfo.model_validate_json(row["system_json"]))
