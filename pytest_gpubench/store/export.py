"""Results out of the manifest: files (JSON, CSV) and uploads to GPU Shopper.

* :func:`export_results` writes the stored results of a run (or all runs) as a JSON
  list of BenchmarkResult objects, exactly as stored (``result_json``), or as CSV with
  one flattened row per result for spreadsheets and pandas: every registered figure
  (``output_tokens_per_second``, ``decode_tokens_per_second``, ``ttft_p99_ms``,
  ``goodput_share``, ... as docs/metrics.md names them), then the result's own fields
  (``hardware.gpu_name``, ``results.p95_latency_ms``, ...).
* :func:`upload_pending` POSTs every result whose upload was asked for and has not
  succeeded yet to ``/api/v1/benchmarks``, and records each outcome in the manifest
  (``uploaded`` with the server's id, or ``failed`` with the error), so a failed
  upload is retried by the next call and nothing is lost.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

from pydantic import BaseModel

from ..errors import ApiError, GpubenchError
from ..figures import FIGURES, FigureSource, figure_values
from .base import Store
from .records import ResultRecord
from ..measure.results import BenchmarkResult
from ..cloud.shopper_client import ShopperClient

__all__ = ["EXPORT_FORMATS", "UploadReport", "csv_columns", "export_results", "upload_pending"]

log = logging.getLogger("pytest_gpubench.store.export")

EXPORT_FORMATS = ("json", "csv")
_NESTED = ("hardware", "model", "test_config", "results", "gpu_stats")


def csv_columns() -> list[str]:
    """The CSV header: identity, the registered figures (:mod:`.figures`, one column each,
    named as everywhere else), the BenchmarkResult's nested groups flattened with dots,
    then provider, location and price."""
    columns = ["id", "run_id", "timestamp"]
    columns += [name for name in FIGURES if name not in columns]
    for group in _NESTED:
        model: type[BaseModel] = BenchmarkResult.model_fields[group].annotation  # type: ignore[assignment]
        columns += [f"{group}.{name}" for name in model.model_fields]
    return columns + ["provider", "location", "price_per_hour"]


def _csv_value(value: Any) -> Any:
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def _flatten(stored: ResultRecord, result: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {
        "id": result.get("id") or stored.id,
        "run_id": stored.run_id,
        "timestamp": result.get("timestamp"),
    }
    for group in _NESTED:
        values = result.get(group) or {}
        for key, value in values.items():
            flat[f"{group}.{key}"] = value
    for key in ("provider", "location", "price_per_hour"):
        flat[key] = result.get(key)
    for name, value in figure_values(FigureSource(result, stored.details, stored.run_id or "")).items():
        flat.setdefault(name, value)
    # The stored figure: NULL for an imported result whose price is unknown.
    flat["cost_per_million_tokens"] = stored.cost_per_million_tokens
    return flat


def _stored_results(store: Store, run_id: str | None) -> Iterator[tuple[ResultRecord, dict[str, Any]]]:
    for stored in store.results(run_id):
        if stored.result is None:
            log.warning("benchmark %s has no readable result_json; left out", stored.id)
            continue
        yield stored, stored.result


def export_results(store: Store, run_id: str | None = None, fmt: str = "json", out: IO[str] | None = None) -> int:
    """Write the results of run ``run_id`` (all runs when ``None``) to ``out``; returns how many.

    ``fmt="json"``: a JSON list of the stored BenchmarkResult objects, oldest first.
    ``fmt="csv"``: a header (:func:`csv_columns`, plus any field a newer version
    stored) and one row per result; lists are joined with ``;``, unknown values are
    empty. Another format is a ``ValueError``.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (allowed: {', '.join(EXPORT_FORMATS)})")
    if out is None:
        import sys

        out = sys.stdout
    stored = list(_stored_results(store, run_id))
    if fmt == "json":
        json.dump([result for _, result in stored], out, indent=2)
        out.write("\n")
        return len(stored)
    rows = [_flatten(record, result) for record, result in stored]
    columns = csv_columns()
    columns += sorted({key for flat in rows for key in flat} - set(columns))
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for flat in rows:
        writer.writerow({key: _csv_value(flat.get(key)) for key in columns})
    return len(rows)


class UploadReport(NamedTuple):
    """What :func:`upload_pending` did: benchmark ids uploaded, and failed ones with their errors."""

    uploaded: list[str]
    failed: dict[str, str]


def _remote_id(answer: Any) -> str | None:
    benchmark = answer.get("benchmark") if isinstance(answer, dict) else None
    remote = benchmark.get("id") if isinstance(benchmark, dict) else None
    return str(remote) if remote not in (None, "") else None


async def upload_result(store: Store, client: ShopperClient, benchmark_id: str) -> str | None:
    """POST one stored result right after its cell (``--gpubench-upload``); the error, or None.

    The result is marked ``pending`` first, so a failure leaves it for
    ``gpubench upload`` to retry; nothing is lost.
    """
    store.mark_upload(benchmark_id, status="pending")
    stored = store.result(benchmark_id)
    try:
        answer = await client.post_benchmark(stored.result if stored is not None else None)
    except Exception as exc:  # noqa: BLE001 - an upload failure must not fail the measurement
        error = str(exc) or type(exc).__name__
        store.mark_upload(benchmark_id, status="failed", error=error)
        return error
    store.mark_upload(benchmark_id, status="uploaded", remote_id=_remote_id(answer))
    return None


async def upload_pending(store: Store, client: ShopperClient, run_id: str | None = None) -> UploadReport:
    """POST each pending (or earlier failed) result of ``run_id`` (or all runs); never raises for one.

    Each is marked ``uploaded`` with the id from the answer ``{"benchmark": {"id"}}``,
    or ``failed`` with the error. When the server gives no usable answer at all (a
    connection error, a timeout, an answer that is not JSON) rather than an error
    status, the remaining results are marked failed with the same error instead of
    each waiting for its own timeout. Returns ``(uploaded, failed)``.
    """
    report = UploadReport([], {})
    pending = store.pending_uploads(run_id)
    unreachable: str | None = None
    for stored in pending:
        benchmark_id = stored.id
        if unreachable is not None:
            error = unreachable
        else:
            try:
                body = stored.result
                if body is None:
                    raise ValueError("the stored result is not a JSON object")
                answer = await client.post_benchmark(body)
            except ApiError as exc:  # the server refused this one result
                error = str(exc)
            except GpubenchError as exc:  # no usable answer: the server is unreachable
                error = unreachable = str(exc)
            except Exception as exc:  # noqa: BLE001 - one bad result must not stop the others
                error = f"{type(exc).__name__}: {exc}"
            else:
                store.mark_upload(benchmark_id, status="uploaded", remote_id=_remote_id(answer))
                report.uploaded.append(benchmark_id)
                continue
        store.mark_upload(benchmark_id, status="failed", error=error)
        report.failed[benchmark_id] = error
    return report
