"""What a :class:`~.base.Store` answers: typed, frozen records, never raw rows.

Each record is one thing the store keeps (a run, a cell, a provisioning attempt, a
session a run owns, a stored result, a baseline, a claim), with the fields of the
manifest's columns under the same names, so a report or a cleanup reads
``cell.status`` whatever database is behind it. JSON the manifest keeps as text
(``argv``, ``result_json``, ``details_json``, ``stage_seconds``) arrives parsed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..cloud.provider import OwnedSession
from ..errors import current_stage_name
from ..cloud.processes import ProcessIdentity
from ..measure.results import PerformanceResults
from ..errors import redact
from ..remote.sysinfo import SystemInfo

__all__ = ["AttemptRecord", "Baseline", "CellRecord", "Claim", "MicrobenchRecord", "OwnedSession", "ResultRecord",
           "RunInfo", "RunRecord", "SystemRecord", "attempt_record", "cell_record",
           "distinct_keys", "file_name", "junit_property", "key_of", "marked_test_key", "matrix_key",
           "microbench_record", "numbered_key", "present", "progress_labels", "report_note", "report_title",
           "result_record", "row_id", "run_record", "summary_title", "system_record", "system_row"]


class _Record(BaseModel):
    """Base of the store's records: values, and tolerant of columns a newer store adds."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class RunRecord(_Record):
    """One pytest run (or one ``gpubench import``): when, from where, and who owns it."""

    run_id: str
    started_at: str | None = None
    finished_at: str | None = None
    argv: list[str] = Field(default_factory=list)
    matrix_files: list[str] = Field(default_factory=list)
    host: str | None = None
    #: Free text: ``running`` until :meth:`~.base.Store.finish_run` sets its end status.
    status: str | None = None
    #: The process that owns the run (the xdist controller); cleanup leaves a live one alone.
    owner: ProcessIdentity | None = None
    #: The GPU Shopper URL the run rents from, its credentials redacted (``user:***@``); a row an
    #: older version stored raw is redacted when read.
    api: str | None = None
    #: The run rented from its own sandbox, whose sessions end when it exits.
    sandbox: bool = False
    #: The last time another process took the run over (``--gpubench-resume``).
    resumed_at: str | None = None
    #: The clouds the run rented through, each ``cloud:`` name with its settings that are not secret
    #: (``runs.clouds``); a row from before they were recorded: GPU Shopper at ``api``
    #: (:func:`run_clouds`).
    clouds: dict[str, dict[str, str]] = Field(default_factory=dict)

    @field_validator("api")
    @classmethod
    def _redacted(cls, value: str | None) -> str | None:
        return redact(value) if value else value

    @model_validator(mode="before")
    @classmethod
    def _clouds(cls, data: Any) -> Any:
        if isinstance(data, dict):
            api = data.get("api")
            data = {**data, "clouds": run_clouds(data.get("clouds"), api if isinstance(api, str) else None)}
        return data


#: The cloud every run rented through before runs recorded theirs (``matrix.cells.DEFAULT_CLOUD``).
OLD_RUN_CLOUD = "shopper"


def run_clouds(value: Any, api: str | None) -> dict[str, dict[str, str]]:
    """``runs.clouds`` read (JSON text or a mapping), as data: whatever is not a mapping of names
    to mappings of text is dropped. Nothing recorded and an ``api``: GPU Shopper at that API,
    what every run rented through before clouds were recorded."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value else {}
        except ValueError:
            value = {}
    clouds = {str(name): {str(key): redact(str(setting)) for key, setting in settings.items()
                          if isinstance(setting, str | int | float)}
              for name, settings in (value.items() if isinstance(value, dict) else ())
              if isinstance(settings, dict)}
    if not clouds and api:
        clouds = {OLD_RUN_CLOUD: {"api": redact(api)}}
    return clouds


#: The API's longest reservation: a run with no recorded owner that started longer
#: ago than this cannot hold a session any more, whatever became of its process.
MAX_RESERVATION = timedelta(hours=12)


class RunInfo(BaseModel):
    """What the store says about one run (a :class:`RunRecord`), and whether it may still be
    going on: what cleanup and resume ask before they touch a run's sessions."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    started_at: str | None = None
    finished_at: str | None = None
    owner: ProcessIdentity | None = None
    api: str | None = None
    sandbox: bool = False
    #: ``RunRecord.clouds``: the clouds it rented through; empty: nothing recorded.
    clouds: dict[str, dict[str, str]] = Field(default_factory=dict)

    @classmethod
    def of(cls, run: RunRecord) -> RunInfo:
        """The run as the store recorded it."""
        return cls.model_validate(run, from_attributes=True)

    def still_running(self, me: ProcessIdentity | None = None) -> str | None:
        """Why this run may still be going on in another process, or None when it is over."""
        if self.finished_at:
            return None
        if self.owner is not None:
            if me is not None and (self.owner.pid, self.owner.host) == (me.pid, me.host):
                return None  # this process: what it asks to release, it no longer uses
            alive = self.owner.alive()
            if alive is None:
                return f"run {self.run_id} was started on host {self.owner.host} and may still be running there"
            if alive:
                return f"run {self.run_id} is still running (pid {self.owner.pid})"
            return None
        started = _parse_time(self.started_at)
        if started is not None and datetime.now(timezone.utc) - started < MAX_RESERVATION:
            return (f"run {self.run_id} recorded no process to check (an older version made it) "
                    f"and started less than {MAX_RESERVATION.total_seconds() / 3600:.0f} h ago")
        return None


def _parse_time(text: str | None) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


class CellRecord(_Record):
    """One matrix cell of one run: its status, the session it rented, its headline figures.

    ``status`` is ``pending`` when added, ``running`` once a worker has it, then one
    of the final statuses (``success``, ``partial``, ``failed``, ``skipped``).
    """

    #: ``f"{run_id}/{cell_id}"``: the key every cell method takes.
    row_id: str
    run_id: str
    cell_id: str | None = None
    created_at: str | None = None
    gpu_type: str
    provider: str
    model: str
    status: str
    matrix_file: str | None = None
    # the session it rented
    session_id: str | None = None
    consumer_id: str | None = None
    offer_id: str | None = None
    instance_ip: str | None = None
    ssh_port: int | None = None
    host_key_fingerprint: str | None = None
    session_status: str | None = None
    session_started_at: str | None = None
    released_by: str | None = None
    session_released_at: str | None = None
    price_per_hour: float | None = None
    cost_usd: float | None = None
    api_cost_usd: float | None = None
    attempts: int | None = None
    # session reuse
    reuse_group: str | None = None
    session_turn: int | None = None
    session_owner: str | None = None
    # its course
    worker: str | None = None
    #: Until when the worker's claim holds unless renewed (seconds since the epoch; None: no lease).
    lease_expires_at: float | None = None
    started_at: str | None = None
    completed_at: str | None = None
    progress_file: str | None = None
    #: Seconds per stage (``{"provision": 12.5, ...}``).
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    failure_stage: str | None = None
    failure_reason: str | None = None
    error_message: str | None = None
    notes: str | None = None
    imported_from: str | None = None
    # its result's headline figures
    benchmark_id: str | None = None
    decode_tokens_per_second: float | None = None
    output_tokens_per_second: float | None = None
    total_requests: int | None = None
    error_count: int | None = None
    ttft_p50_ms: float | None = None
    cost_per_million_tokens: float | None = None

    @field_validator("failure_stage")
    @classmethod
    def _stage_today(cls, value: str | None) -> str | None:
        """A row written before a stage was renamed reads by today's name (errors.SEED_STAGE_NAMES)."""
        return current_stage_name(value) if value else value

    @field_validator("stage_seconds")
    @classmethod
    def _stage_keys_today(cls, value: dict[str, float]) -> dict[str, float]:
        return {current_stage_name(stage): seconds for stage, seconds in value.items()}


class AttemptRecord(_Record):
    """One offer a cell tried (failover): its session, where it failed, and its cost."""

    row_id: str
    #: 1, 2, ...: the consumer id's ``-aN`` suffix.
    attempt: int
    run_id: str
    #: ``provisioning``, ``ready`` (handed to the cell) or ``failed``.
    status: str
    offer_id: str | None = None
    provider: str | None = None
    gpu_type: str | None = None
    location: str | None = None
    machine_id: str | None = None
    price_per_hour: float | None = None
    consumer_id: str | None = None
    session_id: str | None = None
    stage: str | None = None
    error: str | None = None
    #: The budget's reservation, before the create.
    started_at: str
    #: The create answered: billing runs from here.
    session_started_at: str | None = None
    #: The session was released (or never existed).
    ended_at: str | None = None
    #: The session lifetime the budget reserves.
    expected_seconds: float | None = None
    cost_usd: float | None = None
    api_cost_usd: float | None = None
    session_status: str | None = None
    worker: str | None = None

    @field_validator("stage")
    @classmethod
    def _stage_today(cls, value: str | None) -> str | None:
        """An attempt stored before a stage was renamed reads by today's name."""
        return current_stage_name(value) if value else value


class ResultRecord(_Record):
    """One stored result of a cell: the BenchmarkResult, its figures and upload state."""

    #: The benchmark id.
    id: str
    row_id: str
    run_id: str | None = None
    created_at: str | None = None
    gpu_name: str | None = None
    gpu_type: str | None = None
    provider: str | None = None
    location: str | None = None
    model: str | None = None
    price_per_hour: float | None = None
    #: The per-request mean decode rate (``figures.avg_tokens_per_second``; None when 0).
    decode_tokens_per_second: float | None = None
    #: Output throughput: total output tokens over the measured duration.
    output_tokens_per_second: float | None = None
    #: None when the price is unknown (an imported result that states none).
    cost_per_million_tokens: float | None = None
    #: The Go ``PerformanceResults`` (0 where unknown, as the Go shape writes it).
    figures: PerformanceResults = Field(default_factory=PerformanceResults)
    #: The BenchmarkResult exactly as stored; None when it is missing or unreadable.
    result: dict[str, Any] | None = None
    #: Figures beyond the BenchmarkResult shape (metrics, validity, fingerprint, ...).
    details: dict[str, Any] = Field(default_factory=dict)
    workload_fingerprint: str | None = None
    #: ``pending``, ``uploaded``, ``failed``; None when no upload was asked for.
    upload_status: str | None = None
    upload_error: str | None = None
    remote_id: str | None = None
    uploaded_at: str | None = None


class Baseline(_Record):
    """What ``--gpubench-compare`` compares a cell with: its latest comparable success."""

    cell: CellRecord
    #: The cell's stored result; None for a manifest from before results were stored.
    result: ResultRecord | None = None

    @property
    def run_id(self) -> str:
        return self.cell.run_id

    def figures(self) -> dict[str, Any]:
        """The cell's figures as :func:`~pytest_gpubench.measure.compare.compare` and
        :func:`~pytest_gpubench.measure.compare.incomparable` read them: the cell's
        columns, its result's under ``benchmark``."""
        found = self.cell.model_dump()
        found["benchmark"] = None
        if self.result is not None:
            # Only the figures stored: one never written is missing, so a fallback applies.
            stored = self.result.figures.model_dump(exclude_unset=True)
            found["benchmark"] = {**stored, **self.result.model_dump(exclude={"figures"})}
        return found


class Claim(_Record):
    """The answer to claiming a cell: who holds it now, and whether that is the claimant."""

    row_id: str
    #: The worker that holds the cell (the claimant when ``won``).
    holder: str | None
    won: bool
    #: The cell's status after the claim: ``running`` when won or held elsewhere, a final
    #: status (``success``, ``failed``, ...) when it had already ended.
    status: str = "running"
    #: When the holder started the cell (ISO 8601), and until when its lease holds
    #: (seconds since the epoch; None: no lease, held until finished).
    since: str | None = None
    lease_expires_at: float | None = None
    #: Won over an expired lease: the holder whose lease ran out (a dead controller),
    #: whose sessions the new holder must release.
    taken_over_from: str | None = None


class SystemRecord(_Record):
    """What system detection found on one session's machine (recorded once per session)."""

    run_id: str
    session_id: str
    #: The cell whose connection detected it, and that cell's GPU type and provider.
    row_id: str
    gpu_type: str = ""
    provider: str = ""
    #: Which of the provider's machines it was (the offer's machine id; a host's name); "": unknown.
    machine: str = ""
    recorded_at: str | None = None
    system: SystemInfo


class MicrobenchRecord(_Record):
    """One figure of a microbenchmark cell (``memory_bandwidth``, ``matmul_fp16``...), as stored."""

    row_id: str
    run_id: str | None = None
    gpu_type: str | None = None
    provider: str | None = None
    label: str
    kind: str
    precision: str | None = None
    unit: str | None = None
    #: The mean of the timed runs; None when the figure was skipped.
    value: float | None = None
    std: float | None = None
    cv: float | None = None
    n: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    #: One value per timed run, in run order.
    values: tuple[float, ...] = ()
    #: Why it was not measured (compute capability, or what torch said).
    skipped: str | None = None
    device: str | None = None
    capability: str | None = None
    torch_version: str | None = None


# --------------------------------------------------------------------------------------------------
# Stored rows as the store's records: one conversion every store shares.
#
# The SQLite and PostgreSQL stores keep the same tables and columns
# (:mod:`.schema`), so a row read from either becomes its :mod:`.records` record here:
# NULLs dropped (a record's default stands for what was never written), JSON text parsed,
# the row id's column renamed.


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


# --------------------------------------------------------------------------------------------------
# The manifest's ``systems`` table: what system detection found, one row per session of a run.
#
# A reused session is recorded once (by the cell that connected first); recording the
# same session again replaces its row. The ``SystemInfo`` is kept whole as JSON, with the
# columns a person browsing the file wants beside it (source, GPU, count).

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


# --------------------------------------------------------------------------------------------------
# Record keys: the one place that says what a cell is called in the store.
#
# A *record key* names a cell within a run; the store's *row id* is ``{run_id}/{key}``.
# Everything that keeps or finds a cell (collection, the recorder, resume, the importer,
# progress files) builds its key here, so the policy has one owner:
#
# - a matrix cell is its test id: ``RTX_4090-vastai-qwen2:7b`` (see ``matrix.selection.cell_id``);
# - a cell of a Python test marked ``@pytest.mark.gpubench`` adds the test's name:
#   ``RTX_4090-vastai-qwen2:7b@test_fast``, so two tests over one cell keep two rows;
# - a key that two matrix files of one run both produce adds the file's stem:
#   ``RTX_4090-vastai-qwen2:7b@gpubench_quick``; a unique key stays plain;
# - an imported result whose key is taken in its import adds a count: ``...@2``, ``...@3``;
# - a progress file is named after its key with every character other than letters,
#   digits, ``-``, ``_`` and ``.`` replaced by ``_``.

#: Joins a cell id to what tells two records of it apart (a test, a matrix file, a count).
SEPARATOR = "@"


def matrix_key(cell_id: str) -> str:
    """The key of a matrix file's cell: its test id."""
    return cell_id


def marked_test_key(cell_id: str, test_name: str) -> str:
    """The key of a cell of a marked Python test: ``{cell_id}@{test_name}``."""
    return f"{cell_id}{SEPARATOR}{test_name}"


def distinct_keys(keys: Sequence[str], sources: Sequence[str]) -> list[str]:
    """``keys`` with each repeated one suffixed by its source file's stem (``@gpubench_quick``).

    Two matrix files of one run may hold the same cell; their rows must not merge.
    ``sources[i]`` is the file ``keys[i]`` came from.
    """
    counts = Counter(keys)
    return [f"{key}{SEPARATOR}{Path(source).stem}" if counts[key] > 1 else key
            for key, source in zip(keys, sources, strict=True)]


def numbered_key(key: str, taken: Container[str]) -> str:
    """``key``, or ``key@2``, ``key@3``... : the first one not in ``taken``."""
    candidate, n = key, 1
    while candidate in taken:
        n += 1
        candidate = f"{key}{SEPARATOR}{n}"
    return candidate


def row_id(run_id: str, key: str) -> str:
    """The store's id of a cell record: ``{run_id}/{key}``."""
    return f"{run_id}/{key}"


def key_of(row_id_: str, run_id: str) -> str:
    """The record key of ``row_id_``, a row id of ``run_id`` (the inverse of :func:`row_id`)."""
    return row_id_.removeprefix(f"{run_id}/")


def file_name(key: str) -> str:
    """``key`` as a file name: anything but letters, digits, ``-_.`` becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)


# --------------------------------------------------------------------------------------------------
# How a sandbox run says so wherever its figures appear.
#
# A ``--gpubench-sandbox`` run measures the emulated cloud: its token rates and TTFT
# are the sandbox catalog's, its benchmarks run on the sandbox's clock (300 s take
# 6 s at time scale 0.02, see ``Settings.benchmark_seconds``) and nothing is billed.
# Its figures must never pass for a GPU's: the terminal summary's header, every
# cell's JUnit properties (``gpubench_sandbox``), the first STATUS line of each
# progress file, the manifest's ``runs.sandbox`` column and the report's title and
# note all say so. Only the run's own sandbox counts: the plugin cannot know that
# another API (``--gpubench-api``) is a standalone sandbox.

#: The JUnit property every cell carries: "true" for a sandbox run, else "false".
SANDBOX_PROPERTY = "gpubench_sandbox"


def _clock(settings: Any) -> str:
    scale = settings.benchmark_scale
    return f"benchmarks on its clock x{scale:g}" if scale != 1.0 else "benchmarks in real time"


def summary_title(settings: Any) -> str:
    """The terminal summary's header: ``gpubench summary`` and, in the sandbox, what that means."""
    if not settings.sandbox:
        return "gpubench summary"
    return f"gpubench summary: SANDBOX figures (emulated GPUs, {_clock(settings)})"


def junit_property(settings: Any) -> tuple[str, str]:
    """``("gpubench_sandbox", "true" | "false")``."""
    return SANDBOX_PROPERTY, "true" if settings.sandbox else "false"


def progress_labels(settings: Any) -> dict[str, Any]:
    """Fields of a progress file's first STATUS line: ``sandbox=true time_scale=0.02``
    in a sandbox run (benchmark_scale 1 with ``--gpubench-sandbox-real-time``); none else."""
    if not settings.sandbox:
        return {}
    return {"sandbox": "true", "time_scale": settings.benchmark_scale}


def report_note(sandbox_runs: Sequence[str], runs: Sequence[str]) -> str:
    """The report's note on sandbox figures ("" when no run used the sandbox)."""
    if not sandbox_runs:
        return ""
    which = ("Every run in this report" if len(sandbox_runs) == len(runs)
             else f"Run{'s' * (len(sandbox_runs) > 1)} {', '.join(sandbox_runs)}")
    return (f"Sandbox figures: {which} used pytest-gpubench's emulated cloud (--gpubench-sandbox), "
            "not rented GPUs. Token rates and TTFT are its catalog's figures for each GPU and model, "
            "measured over benchmarks on its clock (shortened unless --gpubench-sandbox-real-time); "
            "prices and costs are emulated.")


def report_title(sandbox_runs: Sequence[str], runs: Sequence[str]) -> str:
    """``GPU Benchmark Report``, marked when its figures come from the sandbox."""
    if not sandbox_runs:
        return "GPU Benchmark Report"
    if len(sandbox_runs) == len(runs):
        return "GPU Benchmark Report (sandbox)"
    return "GPU Benchmark Report (includes sandbox runs)"
