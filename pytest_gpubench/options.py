"""The option table: every gpubench setting declared once.

Each ``Option`` gives the CLI flag, the ini key, the ``GPUBENCH_*`` environment
variable, the converter and the help text; ``settings.resolve`` turns them into one
validated ``Settings``. The plugin registers these flags in every pytest run of an
environment where it is installed, so this module imports the standard library
only (converters that need more import it when they run).

The three filters have long flags only (``--gpubench-gpu``, ``--gpubench-provider``,
``--gpubench-model``): bare ``--gpu``/``--provider``/``--model`` belong to whoever
else may want them. A project whose own conftest.py wants the short forms calls
:func:`add_short_filters` (see docs/matrix.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_API = "http://localhost:8080"
#: The sandbox's default clock: a 2-minute provisioning takes 2.4 s.
SANDBOX_TIME_SCALE = 0.02
#: The extra GPU cost a split reuse group may add, as a share of its cost on one session.
DEFAULT_SPLIT_COST = 0.20
#: The longest duration any flag (or the matrix) accepts: 24 hours.
MAX_DURATION_S = 24 * 3600.0
DURATION_ALLOWED = ("a number of seconds or a duration such as '90s', '5m', '1h30m' "
                    "(more than 0, at most 24h)")
#: No GPU offer costs more (an 8 x H200 node is ~$30/h): a larger cap is a typo, not a budget.
#: ``--gpubench-max-price`` and the matrix's prices (``matrix/fields.py``) share it.
MAX_PRICE_PER_HOUR = 100.0
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?"
)
#: ``--gpubench-host-keys``: a host key in no known_hosts file is pinned on first use, or refused.
HOST_KEY_POLICIES = ("pin", "strict")
#: The filters' bare flags, which a project opts in to with :func:`add_short_filters`.
SHORT_FILTERS = {"gpu": "--gpu", "provider": "--provider", "model": "--model"}


@dataclass(frozen=True)
class Option:
    """One setting: its flag, ini key, environment variable, type and help."""

    dest: str
    flag: str
    help: str
    type: Callable[[str], Any] = str
    env: str | None = None
    ini: bool = True
    action: str = "store"  # "store", "store_true" or "append"
    metavar: str | None = None
    #: For flags whose value is optional (``--gpubench-compare`` alone means "last").
    const: str | None = None
    #: A deprecated alias: the ``dest`` of the option that replaces it. Its flag, variable and ini
    #: key still work (they feed that option, one deprecation line each: ``settings.resolve``).
    deprecated_for: str | None = None

    @property
    def command_flag(self) -> str:
        """The flag of the ``gpubench`` commands that take this option: the same name without
        the ``--gpubench-`` prefix (``--gpubench-api`` is ``gpubench cleanup --api``)."""
        return "--" + self.flag.removeprefix("--gpubench-")

    @property
    def ini_key(self) -> str:
        """The option's key in the pytest ini file (``gpubench_api``)."""
        return f"gpubench_{self.dest}"

    @property
    def argparse_help(self) -> str:
        """The help text as argparse wants it: argparse formats help with ``%``
        (``%(default)s``), so a literal ``%`` ("tps:10%") must be doubled."""
        return self.help.replace("%", "%%")


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"5m"``, ``"1h30m"``, ``"300"``.

    One grammar for the flags and the matrix: ``matrix/fields.py`` parses a matrix's
    durations with it (options.py is a top-level module; the matrix reads it, not
    the other way round)."""
    if isinstance(value, str):
        text = re.sub(r"\s+", "", value.lower())
        try:
            return float(text)
        except ValueError:
            found = _DURATION_RE.fullmatch(text)
            if not text or not found:
                raise ValueError(f"not a duration: {value!r}") from None
            h, m, s = (float(found[k] or 0) for k in "hms")
            return h * 3600 + m * 60 + s
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value):
        raise ValueError(f"not a duration: {value!r}")
    return float(value)


def is_finite(value: float) -> bool:
    """Whether ``value`` is a finite number (an int too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _price_cap(text: str) -> float:
    value = _positive_float(text)
    if value > MAX_PRICE_PER_HOUR:
        raise ValueError(f"must be at most {MAX_PRICE_PER_HOUR:g} dollars per hour")
    return value


def _duration(text: str) -> float:
    """What the matrix takes for a duration: ``300``, ``90s``, ``5m``, ``1h30m``."""
    try:
        value = parse_duration(text)
    except ValueError:
        raise ValueError(f"must be {DURATION_ALLOWED}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_DURATION_S:
        raise ValueError(f"must be {DURATION_ALLOWED}")
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


def _summary_columns(text: str) -> tuple[str, ...]:
    from .figures import parse_columns  # the column set lives with the figure registry

    return parse_columns(text)


def _compare_rules(text: str) -> str:
    from .figures import parse_compare_fail  # the rule grammar lives with the figure registry

    parse_compare_fail(text)
    return text


#: The highest target interactivity accepted: no person reads 10,000 tokens/s.
MAX_TARGET_INTERACTIVITY = 10_000.0
TARGETS_ALLOWED = ("a comma-separated list of interactivities in tokens/s per user, each more than 0 and at most "
                   f"{MAX_TARGET_INTERACTIVITY:g}, such as 20,50")


def parse_targets(text: str) -> tuple[float, ...]:
    """``20,50`` -> (20.0, 50.0): the targets of the report's cost-at-target table, sorted, once each."""
    values = []
    for item in str(text).split(","):
        try:
            value = float(item.strip())
        except ValueError:
            raise ValueError(f"must be {TARGETS_ALLOWED}") from None
        if not math.isfinite(value) or not 0 < value <= MAX_TARGET_INTERACTIVITY:
            raise ValueError(f"must be {TARGETS_ALLOWED}")
        values.append(value)
    return tuple(sorted(set(values)))


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
    Option("gpu", "--gpubench-gpu", "run only cells on this GPU (RTX4090 matches 'RTX 4090'); repeatable",
           action="append", ini=False, metavar="GPU"),
    Option("provider", "--gpubench-provider", "run only cells on this provider (vastai, tensordock); repeatable",
           action="append", ini=False, metavar="NAME"),
    Option("model", "--gpubench-model", "run only cells of this model (deepseek-r1 selects every tag); repeatable",
           action="append", ini=False, metavar="MODEL"),
    Option("api", "--gpubench-api", f"GPU Shopper API base URL (default {DEFAULT_API})",
           env="GPUBENCH_API_BASE", metavar="URL"),
    Option("sandbox", "--gpubench-sandbox", "start the emulated GPU Shopper cloud for this run and use it",
           type=_bool, env="GPUBENCH_SANDBOX", action="store_true"),
    Option("sandbox_catalog", "--gpubench-sandbox-catalog", "the sandbox's offer/rate catalog (YAML)",
           env="GPUBENCH_SANDBOX_CATALOG", metavar="PATH"),
    Option("sandbox_real_time", "--gpubench-sandbox-real-time",
           "in the sandbox, benchmark for the matrix's durations in real time, with its warm-up requests "
           "(fidelity checks), instead of on the sandbox's clock (the default: 300 s take 6 s at time "
           "scale 0.02, no warm-up)",
           type=_bool, env="GPUBENCH_SANDBOX_REAL_TIME", action="store_true"),
    Option("sandbox_ssh", "--gpubench-sandbox-ssh",
           "SSH server of sandbox instances: asyncssh (default) or openssh (a real sshd, needs root)",
           type=_choice("asyncssh", "openssh"), env="GPUBENCH_SANDBOX_SSH", metavar="SERVER"),
    Option("time_scale", "--gpubench-time-scale",
           f"multiply every wait and timeout (default 1; {SANDBOX_TIME_SCALE} with the sandbox)",
           type=_positive_float, env="GPUBENCH_TIME_SCALE", metavar="FACTOR"),
    Option("store", "--gpubench-store",
           "where runs, cells and results are kept: a SQLite file (the default: <reports dir>/manifest.db, "
           "the manifest), postgresql://USER@HOST/DB for many machines sharing one matrix, or git+URL of a "
           "results repository (docs/scale-out.md)",
           env="GPUBENCH_STORE", metavar="PATH|URL"),
    Option("manifest", "--gpubench-manifest", "deprecated: the older name of --gpubench-store",
           env="GPUBENCH_MANIFEST", metavar="PATH|URL", deprecated_for="store"),
    Option("hosts", "--gpubench-hosts",
           "the hosts inventory (hosts.yaml) for `cloud: hosts` and `cloud: local` (overrides the matrix's `hosts:`)",
           env="GPUBENCH_HOSTS", metavar="FILE"),
    Option("known_hosts", "--gpubench-known-hosts",
           "where gpubench pins the SSH host keys of hosts found in no known_hosts file, on first use "
           "(default ~/.gpubench/known_hosts)",
           env="GPUBENCH_KNOWN_HOSTS", metavar="FILE"),
    Option("host_keys", "--gpubench-host-keys",
           "what a host's SSH key found in no known_hosts file gets: pin (the default: trusted on first use "
           "and pinned in --gpubench-known-hosts) or strict (refused: the cell fails at ssh_connect)",
           type=_choice(*HOST_KEY_POLICIES), env="GPUBENCH_HOST_KEYS", metavar="pin|strict"),
    Option("gpu_lease_ttl", "--gpubench-gpu-lease-ttl",
           "how long a host's GPU lease lasts unless its run renews it (a dead run's GPUs come free after it), "
           "e.g. 2m (default 2m, time-scaled in the sandbox)",
           type=_duration, env="GPUBENCH_GPU_LEASE_TTL", metavar="DURATION"),
    Option("claim_ttl", "--gpubench-claim-ttl",
           "how long a controller's claim on a running cell lasts unless its heartbeat renews it: after it, "
           "another controller of the run takes the cell over, e.g. 30s (default 1m, time-scaled in the sandbox)",
           type=_duration, env="GPUBENCH_CLAIM_TTL", metavar="DURATION"),
    Option("reports", "--gpubench-reports", "directory for progress files and reports (default reports)",
           env="GPUBENCH_REPORTS", metavar="DIR"),
    Option("duration", "--gpubench-duration",
           "benchmark duration of every cell, e.g. 300, 90s, 5m or 1h30m (overrides the matrix)",
           type=_duration, env="GPUBENCH_DURATION", metavar="DURATION"),
    Option("max_price", "--gpubench-max-price", "never rent an offer above this $/hour",
           type=_price_cap, env="GPUBENCH_MAX_PRICE", metavar="USD"),
    Option("progress_interval", "--gpubench-progress-interval",
           "time between benchmark PROGRESS lines, e.g. 2s or 1m (overrides the matrix; seed: 60s)",
           type=_duration, env="GPUBENCH_PROGRESS_INTERVAL", metavar="DURATION"),
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
           type=_bool, env="GPUBENCH_FAIL_ON_SKIP", action="store_true"),
    Option("resume", "--gpubench-resume",
           "run again, into the same run id, only the cells of that run (RUN_ID, or last) with no "
           "successful result; the others are deselected",
           env="GPUBENCH_RESUME", ini=False, metavar="RUN_ID|last", const="last"),
    Option("rerun", "--gpubench-rerun",
           "run again cells that already ended in this run (--gpubench-run-id given again); without it "
           "they are reported claimed",
           type=_bool, env="GPUBENCH_RERUN", ini=False, action="store_true"),
    Option("run_id", "--gpubench-run-id",
           "run id for the manifest: 1-64 letters, digits, '.', '_' or '-', not starting with '.' "
           "(default: a new one per run)",
           env="GPUBENCH_RUN_ID", ini=False, metavar="ID"),
    Option("runners", "--gpubench-runners",
           "the runners file (YAML): phases, named sets of cells with reruns, and which host takes what; "
           "every machine of a phase records into one run named after it (docs/runners.md)",
           env="GPUBENCH_RUNNERS", metavar="FILE"),
    Option("phase", "--gpubench-phase", "the phase of the runners file to run (default: this host's runner's)",
           env="GPUBENCH_PHASE", ini=False, metavar="NAME"),
    Option("runner", "--gpubench-runner",
           "the runner of the runners file this machine is (default: its hostname, else `default`)",
           env="GPUBENCH_RUNNER", ini=False, metavar="NAME"),
    Option("workload_type", "--gpubench-workload-type", "workload_type sent when creating sessions",
           env="GPUBENCH_WORKLOAD_TYPE", metavar="TYPE"),
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
           "time without a token before a request counts as stalled, e.g. 30s or 2m: it is aborted and "
           "counted as an error, the run goes on (overrides the matrix; default 2m, time-scaled in the sandbox)",
           type=_duration, env="GPUBENCH_STALL_TIMEOUT", metavar="DURATION"),
    Option("telemetry_interval", "--gpubench-telemetry-interval",
           "time between nvidia-smi samples during a benchmark, e.g. 5s (overrides the matrix; default 5s)",
           type=_duration, env="GPUBENCH_TELEMETRY_INTERVAL", metavar="DURATION"),
    Option("compare", "--gpubench-compare",
           "compare each cell with the same cell of a baseline run from the manifest (RUN_ID, or last)",
           env="GPUBENCH_COMPARE", metavar="RUN_ID|last", const="last"),
    Option("compare_fail", "--gpubench-compare-fail",
           "fail cells that regressed beyond these bounds against the baseline, e.g. tps:10%,ttft:20%",
           type=_compare_rules, env="GPUBENCH_COMPARE_FAIL", metavar="RULES"),
    Option("upload", "--gpubench-upload", "POST every result to the GPU Shopper /api/v1/benchmarks",
           type=_bool, env="GPUBENCH_UPLOAD", action="store_true"),
    Option("live", "--gpubench-live", "show live progress of running cells in the terminal (default true)",
           type=_bool, env="GPUBENCH_LIVE", metavar="BOOL"),
    Option("columns", "--gpubench-columns",
           "comma-separated columns of the gpubench summary table (default status, output_tokens_per_second, "
           "decode_tokens_per_second, ttft_p50_ms, cost_per_million_tokens, cost_usd; every name is in "
           "docs/metrics.md)",
           type=_summary_columns, env="GPUBENCH_COLUMNS", metavar="NAMES"),
    Option("target_interactivity", "--gpubench-target-interactivity",
           "the interactivities (tokens/s per user) gpubench report reads the cheapest GPU, provider and runtime "
           "at, e.g. 20,50 (default: 1000 / the matrix's slo tpot_ms stored with the results)",
           type=parse_targets, env="GPUBENCH_TARGET_INTERACTIVITY", metavar="TOKS"),
)
OPTIONS_BY_DEST = {opt.dest: opt for opt in OPTIONS}
#: The deprecated old names of each option, by the dest they feed (``store``: ``manifest``).
ALIASES_OF: dict[str, tuple[Option, ...]] = {
    dest: tuple(alias for alias in OPTIONS if alias.deprecated_for == dest)
    for dest in {opt.deprecated_for for opt in OPTIONS if opt.deprecated_for}
}


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a short random suffix."""
    import secrets  # here, not at load: every pytest run imports this module
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def add_short_filters(parser: Any, names: Sequence[str] = ("gpu", "provider", "model")) -> None:
    """Give this project the bare filter flags: ``--gpu``, ``--provider``, ``--model``.

    Call it from the ``pytest_addoption`` of the project's top-level conftest.py::

        from pytest_gpubench.options import add_short_filters

        def pytest_addoption(parser):
            add_short_filters(parser)          # or add_short_filters(parser, ["gpu"])

    Each bare flag is the same option as its long form (``--gpu X`` is
    ``--gpubench-gpu X``); both may be given. The plugin itself never takes them,
    so other projects in the environment keep ``--model`` and friends for their own
    use. Importing this module is cheap (standard library only).
    """
    unknown = [name for name in names if name not in SHORT_FILTERS]
    if unknown:
        raise ValueError(f"add_short_filters: unknown filter(s) {unknown}; allowed: {', '.join(SHORT_FILTERS)}")
    group = parser.getgroup("gpubench", "GPU benchmarks (pytest-gpubench)")
    for name in names:
        opt = OPTIONS_BY_DEST[name]
        group.addoption(SHORT_FILTERS[name], dest=f"gpubench_{opt.dest}", action="append", default=None,
                        metavar=opt.metavar, help=f"short for {opt.flag} (this project's conftest.py opts in)")
