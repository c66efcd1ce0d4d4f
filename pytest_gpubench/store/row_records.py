"""Stored rows as the store's records: one conversion every store shares.

The SQLite and PostgreSQL stores keep the same tables and columns
(:mod:`.schema`), so a row read from either becomes its :mod:`.records` record here:
NULLs dropped (a record's default stands for what was never written), JSON text parsed,
the row id's column renamed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..cloud.processes import ProcessIdentity
from ..measure.results import PerformanceResults
from .records import AttemptRecord, CellRecord, MicrobenchRecord, ResultRecord, RunRecord

__all__ = ["attempt_record", "cell_record", "microbench_record", "present", "result_record", "run_record"]

_PERFORMANCE_FIELDS = tuple(PerformanceResults.model_fields)


def present(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row without its NULLs: a record's defaults stand for what was never written."""
    return {key: value for key, value in row.items() if value is not None}


def _json(text: str | None, default: Any) -> Any:
    """Stored JSON text, or ``default`` when there is none or it does not parse to its kind."""
    if not text:
        return default
    try:
        value = json.loads(text)
    except ValueError:
        return default
    return value if isinstance(value, type(default)) else default


def run_record(row: Mapping[str, Any]) -> RunRecord:
    """A ``runs`` row as a :class:`RunRecord` (its owner from ``pid``, ``host``, ``pid_start``)."""
    owner = None
    if row.get("pid"):
        owner = ProcessIdentity(pid=row["pid"], host=row.get("host") or "", start=row.get("pid_start"))
    values = {key: value for key, value in present(row).items() if key not in ("pid", "pid_start")}
    return RunRecord.model_validate({
        **values, "argv": _json(row.get("argv"), []), "matrix_files": _json(row.get("matrix_files"), []),
        "owner": owner, "sandbox": bool(row.get("sandbox")),
    })


def cell_record(row: Mapping[str, Any]) -> CellRecord:
    """A ``benchmark_manifest`` row as a :class:`CellRecord`."""
    values = present(row)
    values["row_id"] = values.pop("id")
    values["stage_seconds"] = _json(row.get("stage_seconds"), {})
    return CellRecord.model_validate(values)


def attempt_record(row: Mapping[str, Any]) -> AttemptRecord:
    """An ``attempts`` row as an :class:`AttemptRecord`."""
    values = present(row)
    values["row_id"] = values.pop("manifest_id")
    return AttemptRecord.model_validate(values)


def result_record(row: Mapping[str, Any]) -> ResultRecord:
    """A ``benchmarks`` row as a :class:`ResultRecord` (its figures gathered, JSON parsed)."""
    values = {key: value for key, value in present(row).items() if key not in _PERFORMANCE_FIELDS}
    values["row_id"] = values.pop("manifest_id")
    values["figures"] = PerformanceResults.model_validate(
        {key: row[key] for key in _PERFORMANCE_FIELDS if row.get(key) is not None})
    values["result"] = _json(values.pop("result_json", None), {}) or None
    values["details"] = _json(values.pop("details_json", None), {})
    return ResultRecord.model_validate(values)


def microbench_record(row: Mapping[str, Any]) -> MicrobenchRecord:
    """A ``microbench_figures`` row as a :class:`MicrobenchRecord`."""
    return MicrobenchRecord(row_id=row["manifest_id"], values=tuple(json.loads(row["values_json"] or "[]")),
                            **{k: v for k, v in row.items() if k not in ("manifest_id", "values_json")})
