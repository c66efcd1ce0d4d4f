"""Options, environment and ini -> one validated ``Settings`` object.

Every option is declared once in ``OPTIONS``: the CLI flag, the ini key, the
``GPUBENCH_*`` environment variable and the help text all come from that one
entry. Values resolve CLI, then environment, then ini, then default; a bad value
raises ``UsageProblem`` naming where it came from. This module does not import
pytest: ``plugin.py`` feeds it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import Stage, UsageProblem

#: Seed 000's stage timeouts in seconds (benchmark: on top of the duration, see
#: ``Settings.stage_timeout``). SSH connect shares the SSH wait budget.
SEED_STAGE_TIMEOUTS: dict[Stage, float] = {
    Stage.INVENTORY: 30,
    Stage.PROVISION: 600,
    Stage.SSH_WAIT: 600,
    Stage.SSH_CONNECT: 600,
    Stage.OLLAMA_INSTALL: 300,
    Stage.MODEL_PULL: 900,
    Stage.BENCHMARK: 600,
    Stage.RESULTS: 120,
    Stage.CLEANUP: 120,
}
SEED_TOTAL_TIMEOUT = 25 * 60
SEED_POLL_INTERVAL = 15.0
DEFAULT_API = "http://localhost:8080"
DEFAULT_OLLAMA_INSTALL = "curl -fsSL https://ollama.com/install.sh | sh"
#: The extra GPU cost a split reuse group may add, as a share of its cost on one session.
DEFAULT_SPLIT_COST = 0.20
#: The sandbox's default clock: a 2-minute provisioning takes 2.4 s.
SANDBOX_TIME_SCALE = 0.02
#: However small the time scale, no wait is shorter than this: a loaded CI
#: machine must not turn a scaled timeout into a flaky failure.
MIN_SCALED_TIMEOUT = 15.0
#: The same for the stall timeout (seconds without a token).
MIN_STALL_TIMEOUT = 5.0
#: In the sandbox, a benchmark's scaled duration is never below this (unless the
#: matrix asks for less): enough for a few requests of most cells.
MIN_SANDBOX_BENCHMARK = 5.0
#: ... nor its progress or telemetry interval below this: nvidia-smi over SSH
#: every 0.1 s would load the machine the benchmark runs on.
MIN_SANDBOX_INTERVAL = 1.0


@dataclass(frozen=True)
class Option:
    """One setting: its flag, ini key, environment variable, type and help."""

    dest: str
    flag: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    env: str | None = None
    ini: bool = True
    action: str = "store"  # "store", "store_true" or "append"
    metavar: str | None = None
    #: For flags whose value is optional (``--gpubench-compare`` alone means "last").
    const: str | None = None


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _price_cap(text: str) -> float:
    from .matrix_fields import MAX_PRICE_PER_HOUR  # the matrix's own bound on offer.max_price

    value = _positive_float(text)
    if value > MAX_PRICE_PER_HOUR:
        raise ValueError(f"must be at most {MAX_PRICE_PER_HOUR:g} dollars per hour")
    return value


def _duration(text: str) -> float:
    value = _positive_float(text)
    if value > 24 * 3600:
        raise ValueError("must be at most 86400 seconds (24 h)")
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of: {', '.join(allowed)}")
        return text

    return convert


def _whole_number(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be a whole number from {low} to {high}") from None
        if not low <= value <= high:
            raise ValueError(f"must be a whole number from {low} to {high}")
        return value

    return convert


def _sessions_limit(text: str) -> int | None:
    """``auto`` (None: no limit but the group's cells) or a whole number of sessions."""
    if text.strip().lower() == "auto":
        return None
    try:
        return _whole_number(1, 1000)(text)
    except ValueError:
        raise ValueError("must be auto or a whole number from 1 to 1000") from None


def _percent(text: str) -> float:
    """``25``, ``25%`` or ``12.5 %``: a share from 0 to 1000 percent, as a fraction (0.25)."""
    number = text.strip().removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        raise ValueError("must be a percentage such as 25 or 25%") from None
    if not math.isfinite(value) or not 0 <= value <= 1000:
        raise ValueError("must be a percentage from 0 to 1000")
    return value / 100


def _compare_rules(text: str) -> str:
    from .compare import parse_compare_fail  # the rule grammar lives with the comparison

    parse_compare_fail(text)
    return text


def _summary_columns(text: str) -> tuple[str, ...]:
    from .summary_table import parse_columns  # the column set lives with the table

    return parse_columns(text)


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


OPTIONS: tuple[Option, ...] = (
    Option("gpu", "--gpu", "run only cells on this GPU (RTX4090 matches 'RTX 4090'); repeatable",
           action="append", ini=False, metavar="GPU"),
    Option("provider", "--provider", "run only cells on this provider (vastai, tensordock); repeatable",
           action="append", ini=False, metavar="NAME"),
    Option("model", "--model", "run only cells of this model (deepseek-r1 selects every tag); repeatable",
           action="append", ini=False, metavar="MODEL"),
    Option("api", "--gpubench-api", f"GPU Shopper API base URL (default {DEFAULT_API})",
           default=DEFAULT_API, env="GPUBENCH_API_BASE", metavar="URL"),
    Option("sandbox", "--gpubench-sandbox", "start the emulated GPU Shopper cloud for this run and use it",
           type=_bool, default=False, env="GPUBENCH_SANDBOX", action="store_true"),
    Option("sandbox_catalog", "--gpubench-sandbox-catalog", "the sandbox's offer/rate catalog (YAML)",
           env="GPUBENCH_SANDBOX_CATALOG", metavar="PATH"),
    Option("sandbox_real_time", "--gpubench-sandbox-real-time",
           "in the sandbox, benchmark for the matrix's durations in real time, with its warm-up requests "
           "(fidelity checks), instead of on the sandbox's clock (the default: 300 s take 6 s at time "
           "scale 0.02, no warm-up)",
           type=_bool, default=False, env="GPUBENCH_SANDBOX_REAL_TIME", action="store_true"),
    Option("sandbox_ssh", "--gpubench-sandbox-ssh",
           "SSH server of sandbox instances: asyncssh (default) or openssh (a real sshd, needs root)",
           type=_choice("asyncssh", "openssh"), default="asyncssh", env="GPUBENCH_SANDBOX_SSH", metavar="SERVER"),
    Option("time_scale", "--gpubench-time-scale",
           f"multiply every wait and timeout (default 1; {SANDBOX_TIME_SCALE} with the sandbox)",
           type=_positive_float, env="GPUBENCH_TIME_SCALE", metavar="FACTOR"),
    Option("manifest", "--gpubench-manifest", "SQLite manifest path (default <reports dir>/manifest.db)",
           env="GPUBENCH_MANIFEST", metavar="PATH"),
    Option("reports", "--gpubench-reports", "directory for progress files and reports (default reports)",
           default="reports", env="GPUBENCH_REPORTS", metavar="DIR"),
    Option("duration", "--gpubench-duration", "benchmark duration in seconds for every cell (overrides the matrix)",
           type=_duration, env="GPUBENCH_DURATION", metavar="SECONDS"),
    Option("max_price", "--gpubench-max-price", "never rent an offer above this $/hour",
           type=_price_cap, env="GPUBENCH_MAX_PRICE", metavar="USD"),
    Option("progress_interval", "--gpubench-progress-interval",
           "seconds between benchmark PROGRESS lines (overrides the matrix; seed: 60)",
           type=_positive_float, env="GPUBENCH_PROGRESS_INTERVAL", metavar="SECONDS"),
    Option("ollama_install", "--gpubench-ollama-install", "shell command that installs Ollama on an instance",
           env="GPUBENCH_OLLAMA_INSTALL", metavar="CMD"),
    Option("max_attempts", "--gpubench-max-attempts",
           "offers a cell tries before it fails when provisioning or SSH never comes up "
           "(overrides the matrix's offer.max_attempts; default 3)",
           type=_whole_number(1, 10), env="GPUBENCH_MAX_ATTEMPTS", metavar="N"),
    Option("budget", "--gpubench-budget",
           "stop renting new sessions once this run's spent + committed cost would pass USD; "
           "cells not started are skipped",
           type=_positive_float, env="GPUBENCH_BUDGET", metavar="USD"),
    Option("fail_on_skip", "--gpubench-fail-on-skip", "fail, instead of skip, cells that find no eligible offer",
           type=_bool, default=False, env="GPUBENCH_FAIL_ON_SKIP", action="store_true"),
    Option("resume", "--gpubench-resume",
           "run again, into the same run id, only the cells of that run (RUN_ID, or last) with no "
           "successful result; the others are deselected",
           env="GPUBENCH_RESUME", ini=False, metavar="RUN_ID|last", const="last"),
    Option("run_id", "--gpubench-run-id", "run id for the manifest (default: a new one per run)",
           env="GPUBENCH_RUN_ID", ini=False, metavar="ID"),
    Option("workload_type", "--gpubench-workload-type", "workload_type sent when creating sessions",
           default="interactive", env="GPUBENCH_WORKLOAD_TYPE", metavar="TYPE"),
    Option("reuse", "--gpubench-reuse",
           "group: cells of one GPU and provider share one rented session (default, as the matrix says); "
           "cell: every cell rents its own (overrides the matrix's `reuse`)",
           type=_choice("group", "cell"), env="GPUBENCH_REUSE", metavar="group|cell"),
    Option("sessions_per_group", "--gpubench-sessions-per-group",
           "under pytest -n, the most sessions one reuse group may be split over so that idle workers "
           "take part of it (auto: up to one per cell, the default; 1: never split)",
           type=_sessions_limit, env="GPUBENCH_SESSIONS_PER_GROUP", metavar="N|auto"),
    Option("split_cost", "--gpubench-split-cost",
           "the extra GPU cost a split may add to its group (the new sessions' setup and repeated pulls), "
           "in percent of the group's cost on one session (default 20; 0: never split)",
           type=_percent, env="GPUBENCH_SPLIT_COST", metavar="PERCENT"),
    Option("runs", "--gpubench-runs", "repeat each cell's measurement N times on its session (overrides the matrix)",
           type=_whole_number(1, 100), env="GPUBENCH_RUNS", metavar="N"),
    Option("stall_timeout", "--gpubench-stall-timeout",
           "seconds without a token before a request counts as stalled: it is aborted and counted as an "
           "error, the run goes on (overrides the matrix; default 120, time-scaled in the sandbox)",
           type=_duration, env="GPUBENCH_STALL_TIMEOUT", metavar="SECONDS"),
    Option("telemetry_interval", "--gpubench-telemetry-interval",
           "seconds between nvidia-smi samples during a benchmark (overrides the matrix; default 5)",
           type=_positive_float, env="GPUBENCH_TELEMETRY_INTERVAL", metavar="SECONDS"),
    Option("compare", "--gpubench-compare",
           "compare each cell with the same cell of a baseline run from the manifest (RUN_ID, or last)",
           env="GPUBENCH_COMPARE", metavar="RUN_ID|last", const="last"),
    Option("compare_fail", "--gpubench-compare-fail",
           "fail cells that regressed beyond these bounds against the baseline, e.g. tps:10%,ttft:20%",
           type=_compare_rules, env="GPUBENCH_COMPARE_FAIL", metavar="RULES"),
    Option("upload", "--gpubench-upload", "POST every result to the GPU Shopper /api/v1/benchmarks",
           type=_bool, default=False, env="GPUBENCH_UPLOAD", action="store_true"),
    Option("live", "--gpubench-live", "show live progress of running cells in the terminal (default true)",
           type=_bool, default=True, env="GPUBENCH_LIVE", metavar="BOOL"),
    Option("columns", "--gpubench-columns",
           "comma-separated columns of the gpubench summary table (default status, output_tokens_per_second, "
           "decode_tokens_per_second, ttft_p50_ms, cost_per_million_tokens, cost_usd; every name is in "
           "docs/metrics.md)",
           type=_summary_columns, env="GPUBENCH_COLUMNS", metavar="NAMES"),
)
OPTIONS_BY_DEST = {opt.dest: opt for opt in OPTIONS}


class Settings(BaseModel):
    """Everything a run needs to know, resolved and validated once."""

    model_config = ConfigDict(frozen=True)

    gpu: tuple[str, ...] = ()
    provider: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    api: str = DEFAULT_API
    # Only from the environment (argv is recorded in the manifest), and never in a repr.
    api_token: str | None = Field(default=None, repr=False)
    sandbox: bool = False
    sandbox_catalog: str | None = None
    sandbox_ssh: str = "asyncssh"
    sandbox_real_time: bool = False
    time_scale: float = 1.0
    manifest: Path = Path("reports/manifest.db")
    reports: Path = Path("reports")
    duration: float | None = None
    max_price: float | None = None
    progress_interval: float | None = None
    ollama_install: str | None = None
    max_attempts: int | None = None
    budget: float | None = None
    fail_on_skip: bool = False
    resume: str | None = None
    run_id: str = ""
    workload_type: str = "interactive"
    reuse: str | None = None
    #: Reuse groups split over more sessions under -n (reuse_split.py): the most sessions
    #: per group (None: auto) and the extra cost accepted, a fraction of the group's.
    sessions_per_group: int | None = None
    split_cost: float = DEFAULT_SPLIT_COST
    live: bool = True
    runs: int | None = None
    stall_timeout: float | None = None
    telemetry_interval: float | None = None
    compare: str | None = None
    compare_fail: str | None = None
    upload: bool = False
    columns: tuple[str, ...] | None = None  # --gpubench-columns; None: the summary table's default

    @property
    def progress_dir(self) -> Path:
        return self.reports / "progress"

    def scaled(self, seconds: float, floor: float = 0.0) -> float:
        """``seconds`` on this run's clock, never below ``floor``."""
        return max(seconds * self.time_scale, floor)

    def stage_timeout(self, stage: Stage, duration: float = 0.0) -> float:
        """The seed timeout of ``stage`` on this run's clock.

        The benchmark stage gets its seed budget on top of its own duration (the
        seed gives 10 minutes for a 5-minute benchmark), and that budget is not
        time-scaled: the duration is (see :meth:`benchmark_seconds`), but tokens
        stream at real speed, in the sandbox too, and a slow model's last request
        can take minutes.
        """
        if stage is Stage.BENCHMARK:
            return duration + SEED_STAGE_TIMEOUTS[stage]
        return self.scaled(SEED_STAGE_TIMEOUTS[stage], MIN_SCALED_TIMEOUT)

    @property
    def benchmark_scale(self) -> float:
        """What a benchmark's own durations are multiplied by: the time scale in a
        ``--gpubench-sandbox`` run (unless ``--gpubench-sandbox-real-time``), else 1.

        Only the run's own sandbox: against another API (even a standalone sandbox
        with ``--gpubench-time-scale``) a duration is what the matrix says."""
        return self.time_scale if self.sandbox and not self.sandbox_real_time else 1.0

    def benchmark_seconds(self, seconds: float, floor: float = MIN_SANDBOX_BENCHMARK) -> float:
        """A benchmark duration or interval on the sandbox's clock: scaled, yet never
        below ``floor`` unless ``seconds`` itself is lower. Token streams stay at real
        speed, so the figures measured in those seconds are the catalog's truths."""
        scale = self.benchmark_scale
        if scale == 1.0:
            return seconds
        return max(seconds * scale, min(seconds, floor))

    @property
    def poll_interval(self) -> float:
        return self.scaled(SEED_POLL_INTERVAL, 0.05)

    def stall_seconds(self, stall_timeout: float) -> float:
        """A stall timeout on this run's clock: scaled, yet never below
        ``MIN_STALL_TIMEOUT`` unless the configured value itself is lower (tokens
        stream at real speed in the sandbox too, and a busy machine delays them)."""
        return max(stall_timeout * self.time_scale, min(stall_timeout, MIN_STALL_TIMEOUT))


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a short random suffix."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def resolve(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Callable[[str], Any],
) -> Settings:
    """Resolve every option: CLI, then environment, then ini, then default.

    ``cli`` maps dest -> value as argparse parsed it (None when not given);
    ``ini`` returns the ini value for a key, or None/"" when unset.
    """
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        raw, source = cli.get(opt.dest), f"{opt.flag}"
        if raw in (None, False, []) and opt.env and env.get(opt.env, "") != "":
            raw, source = env[opt.env], f"environment variable {opt.env}"
        if raw in (None, False, []) and opt.ini:
            ini_value = ini(f"gpubench_{opt.dest}")
            if ini_value not in (None, "", []):
                raw, source = ini_value, f"ini option gpubench_{opt.dest}"
        if raw in (None, []):
            continue
        values[opt.dest] = _convert(opt, raw, source)
    values["gpu"] = tuple(values.get("gpu") or ())
    values["provider"] = tuple(values.get("provider") or ())
    values["model"] = tuple(values.get("model") or ())
    values["api_token"] = env.get("GPUBENCH_API_TOKEN") or None
    if "manifest" not in values:
        values["manifest"] = Path(values.get("reports", "reports")) / "manifest.db"
    if "time_scale" not in values:
        values["time_scale"] = SANDBOX_TIME_SCALE if values.get("sandbox") else 1.0
    if values.get("resume") and values.get("run_id"):
        raise UsageProblem("--gpubench-resume and --gpubench-run-id both name the run: give only one")
    if not values.get("run_id"):
        values["run_id"] = new_run_id()
    _check_run_id(values["run_id"])
    return Settings(**values)


def _convert(opt: Option, raw: Any, source: str) -> Any:
    if opt.action == "append":
        items = raw if isinstance(raw, list) else [raw]
        return [str(item).strip() for item in items if str(item).strip()]
    if opt.action == "store_true" or opt.type is _bool:
        try:
            return _bool(raw)
        except ValueError as exc:
            raise UsageProblem(f"{source}: {raw!r} {exc}") from None
    if isinstance(raw, str) and opt.type is not str:
        try:
            return opt.type(raw)
        except ValueError as exc:
            reason = str(exc) if str(exc).startswith(("must", "unknown", "expected")) else "must be a number"
            raise UsageProblem(f"{source}: {raw!r} {reason}") from None
    return raw


def _check_run_id(run_id: str) -> None:
    # The run id becomes part of consumer_id, file names and a remote path.
    if not run_id or not all(ch.isalnum() or ch in "-_." for ch in run_id) or len(run_id) > 64:
        raise UsageProblem(
            f"--gpubench-run-id: {run_id!r} must be 1-64 letters, digits, '-', '_' or '.'"
        )
