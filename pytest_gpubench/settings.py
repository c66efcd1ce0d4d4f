"""Options, environment and ini -> one validated ``Settings`` object.

Every option is declared once in ``options.OPTIONS`` (re-exported here): the CLI
flag, the ini key, the ``GPUBENCH_*`` environment variable and the help text all
come from that one entry. Values resolve CLI, then environment, then ini, then default; a bad value
raises ``UsageProblem`` naming where it came from. This module does not import
pytest: the plugin (``plugin/run_hooks.py``) feeds it pytest's options and ``config.getini``, the
``gpubench`` commands (``commands/cli_options.py``) their own flags and :func:`pytest_ini`, which
finds the ini file pytest would read, so both build the same ``Settings`` from the same inputs.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import Stage, UsageProblem
from .ids import ID_RULE, is_id, shown_id
from .options import (  # noqa: F401 - re-exported: the table's users import it from here
    ALIASES_OF,
    DEFAULT_API,
    DEFAULT_SPLIT_COST,
    OPTIONS,
    OPTIONS_BY_DEST,
    SANDBOX_TIME_SCALE,
    Option,
    _bool,
    new_run_id,
)

#: Seed 000's stage timeouts in seconds (benchmark: on top of the duration, see
#: ``Settings.stage_timeout``). SSH connect shares the SSH wait budget.
SEED_STAGE_TIMEOUTS: dict[Stage, float] = {
    Stage.INVENTORY: 30,
    Stage.PROVISION: 600,
    Stage.SSH_WAIT: 600,
    Stage.SSH_CONNECT: 600,
    Stage.RUNTIME_SETUP: 300,
    Stage.MODEL_PULL: 900,
    Stage.BENCHMARK: 600,
    Stage.RESULTS: 120,
    Stage.CLEANUP: 120,
}
SEED_TOTAL_TIMEOUT = 25 * 60
SEED_POLL_INTERVAL = 15.0
DEFAULT_OLLAMA_INSTALL = "curl -fsSL https://ollama.com/install.sh | sh"
#: However small the time scale, no wait is shorter than this: a loaded CI
#: machine must not turn a scaled timeout into a flaky failure.
MIN_SCALED_TIMEOUT = 15.0
#: The same for the stall timeout (seconds without a token).
MIN_STALL_TIMEOUT = 5.0
#: Before its first token a request may wait for the prefill of every prompt sent with it:
#: up to ``concurrency`` times a lone request's first-token time, with this margin for a busy host.
FIRST_TOKEN_MARGIN = 3.0
#: gpubench's own known_hosts: host keys pinned on first use (a host in no known_hosts file).
DEFAULT_KNOWN_HOSTS = "~/.gpubench/known_hosts"
#: A GPU lease lasts this long unless renewed; its heartbeat renews it three times as often.
DEFAULT_GPU_LEASE_TTL = 120.0
#: However small the time scale: a busy machine's heartbeat must not lose a lease.
MIN_GPU_LEASE_SECONDS = 6.0
#: A cell's claim lasts this long unless its controller's heartbeat renews it (every third of it).
DEFAULT_CLAIM_TTL = 60.0
#: However small the time scale: a busy machine's heartbeat must not lose a claim.
MIN_CLAIM_SECONDS = 5.0
#: In the sandbox, a benchmark's scaled duration is never below this (unless the
#: matrix asks for less): enough for a few requests of most cells.
MIN_SANDBOX_BENCHMARK = 5.0
#: ... nor its progress or telemetry interval below this: nvidia-smi over SSH
#: every 0.1 s would load the machine the benchmark runs on.
MIN_SANDBOX_INTERVAL = 1.0




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
    #: The SQLite manifest when no store is named: ``<reports>/manifest.db`` (or the value of
    #: ``--gpubench-manifest``, the store's deprecated old name, which sets :attr:`store` too).
    manifest: Path = Path("reports/manifest.db")
    #: ``--gpubench-store``: where the run is kept, a SQLite path or a store URL; the
    #: manifest path when not given (see :attr:`store_location`).
    store: str | None = None
    reports: Path = Path("reports")
    #: ``--gpubench-hosts``: the hosts inventory (over the matrix's ``hosts:``).
    hosts: str | None = None
    #: Where host keys found in no known_hosts file are pinned on first use.
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    #: ``--gpubench-host-keys``: ``pin`` (a host key in no known_hosts file is trusted on first use and
    #: pinned in :attr:`known_hosts`) or ``strict`` (it fails ``ssh_connect``).
    host_keys: Literal["pin", "strict"] = "pin"
    #: How long a GPU lease holds unless renewed (seconds, unscaled: see ``gpu_lease_seconds``).
    gpu_lease_ttl: float = DEFAULT_GPU_LEASE_TTL
    #: How long a cell's claim holds unless renewed (seconds, unscaled: see ``claim_seconds``).
    claim_ttl: float = DEFAULT_CLAIM_TTL
    duration: float | None = None
    max_price: float | None = None
    progress_interval: float | None = None
    ollama_install: str | None = None
    max_attempts: int | None = None
    budget: float | None = None
    fail_on_skip: bool = False
    #: ``--gpubench-rerun``: cells that already ended in this run run again.
    rerun: bool = False
    resume: str | None = None
    run_id: str = ""
    #: Whether ``--gpubench-run-id`` (or its variable) named the run: a phase names it otherwise.
    run_id_given: bool = False
    #: ``--gpubench-runners``, ``--gpubench-phase``, ``--gpubench-runner`` (matrix/runners.py).
    runners: str | None = None
    phase: str | None = None
    runner: str | None = None
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
    #: --gpubench-target-interactivity: the report's cost-at-target interactivities; (): the stored SLOs'.
    target_interactivity: tuple[float, ...] = ()

    @property
    def gpu_lease_seconds(self) -> float:
        """A GPU lease's time to live on the run's clock (scaled in the sandbox, never below a few seconds)."""
        return self.scaled(self.gpu_lease_ttl, MIN_GPU_LEASE_SECONDS)

    @property
    def claim_seconds(self) -> float:
        """A cell claim's time to live on the run's clock (scaled in the sandbox, never below a few seconds)."""
        return self.scaled(self.claim_ttl, MIN_CLAIM_SECONDS)

    @property
    def store_location(self) -> str:
        """The store this run opens: ``--gpubench-store``, else the manifest path."""
        return self.store or str(self.manifest)

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

    @property
    def cut_at_deadline(self) -> bool:
        """Whether a benchmark ends at its deadline, cutting the requests in flight
        (reported as incomplete), rather than letting them finish: on the sandbox's
        clock, where a scaled 6-second run must not wait 71 s for a slow model's answer."""
        return self.benchmark_scale != 1.0

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

    def stall_seconds(self, stall_timeout: float, *, first_token_ms: float | None = None,
                      concurrency: int = 1) -> float:
        """A stall timeout on this run's clock: scaled, yet never below
        ``MIN_STALL_TIMEOUT`` unless the configured value itself is lower (tokens
        stream at real speed in the sandbox too, and a busy machine delays them).

        Nor below what the model needs before its first token at the cell's
        concurrency: ``concurrency`` x ``first_token_ms`` (a lone request's, measured
        at warm-up) x ``FIRST_TOKEN_MARGIN``, since the time scale shrinks emulated
        waits, never the model's real-time first token; but never above the configured
        value. Without that, every request of a slow model at a high concurrency was
        aborted as stalled (a 2.4 s first token x 20 streams against a 5 s floor) and
        its cell failed at ``results`` with no data after paying for the benchmark."""
        scaled = max(stall_timeout * self.time_scale, min(stall_timeout, MIN_STALL_TIMEOUT))
        if first_token_ms is None or first_token_ms <= 0:
            return scaled
        needed = first_token_ms / 1000 * max(1, concurrency) * FIRST_TOKEN_MARGIN
        return max(scaled, min(stall_timeout, needed))


class GpubenchDeprecationWarning(DeprecationWarning):
    """A deprecated option name was used (``--gpubench-manifest``): it still works, under its new name."""


def _pytest_flag(opt: Option) -> str:
    return opt.flag


def _lookup(names: tuple[Option, ...], cli: Mapping[str, Any], env: Mapping[str, str], ini: Callable[[str], Any],
            flag: Callable[[Option], str]) -> tuple[Any, str] | None:
    """The value of the first of ``names`` (an option, then its deprecated aliases) given on the
    command line, else in the environment, else in the ini file; with where it came from."""
    for opt in names:
        if cli.get(opt.dest) not in (None, False, []):
            return cli[opt.dest], flag(opt)
    for opt in names:
        if opt.env and env.get(opt.env, "") != "":
            return env[opt.env], f"environment variable {opt.env}"
    for opt in names:
        if opt.ini:
            value = ini(opt.ini_key)
            if value not in (None, "", []):
                return value, f"ini option {opt.ini_key}"
    return None


def _given(value: Any) -> bool:
    return value not in (None, False, [], "")


def resolve(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Callable[[str], Any],
    *,
    flag: Callable[[Option], str] = _pytest_flag,
    warn: Callable[[str], None] | None = None,
) -> Settings:
    """Resolve every option: CLI, then environment, then ini, then default.

    ``cli`` maps dest -> value as argparse parsed it (None when not given);
    ``ini`` returns the ini value for a key, or None/"" when unset. ``flag`` names an
    option's flag in messages (the ``gpubench`` commands' flags have no ``--gpubench-``
    prefix). A deprecated alias (``--gpubench-manifest``, ``GPUBENCH_MANIFEST``, ini
    ``gpubench_manifest``) feeds the option it was renamed to, at its own level: a flag of
    either name beats the environment. Each alias given is one line to ``warn`` (by
    default a :class:`GpubenchDeprecationWarning`).
    """
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        found = _lookup((opt, *ALIASES_OF.get(opt.dest, ())), cli, env, ini, flag)
        if found is not None:
            values[opt.dest] = _convert(opt, *found)
    for note in deprecations(cli, env, ini, flag=flag):
        if warn is None:
            warnings.warn(note, GpubenchDeprecationWarning, stacklevel=2)
        else:
            warn(note)
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
    values["run_id_given"] = bool(values.get("run_id"))
    if not values.get("run_id"):
        values["run_id"] = new_run_id()
    _check_run_id(values["run_id"])
    return Settings(**values)


def deprecations(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Callable[[str], Any],
    *,
    flag: Callable[[Option], str] = _pytest_flag,
) -> list[str]:
    """One line per deprecated name given (flag, environment variable or ini key), naming its successor."""
    notes = []
    for opt in OPTIONS:
        if not opt.deprecated_for:
            continue
        new = OPTIONS_BY_DEST[opt.deprecated_for]
        if _given(cli.get(opt.dest)):
            notes.append(f"{flag(opt)} is deprecated: give the same value to {flag(new)}")
        if opt.env and new.env and _given(env.get(opt.env, "")):
            notes.append(f"environment variable {opt.env} is deprecated: give the same value to {new.env}")
        if opt.ini and _given(ini(opt.ini_key)):
            notes.append(f"ini option {opt.ini_key} is deprecated: give the same value to {new.ini_key}")
    return notes


# ----------------------------------------------------------------------------- the ini file

#: The files pytest reads its ini options from, in the order it looks for them in each folder
#: (``pytest.toml`` and ``.pytest.toml`` since pytest 9).
INI_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


@cache
def _pytest_major() -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("pytest").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 9


def find_ini(directory: Path) -> tuple[Path | None, dict[str, Any]]:
    """The ini file pytest run in ``directory`` with no path arguments reads, and its options.

    As pytest's ``locate_config`` does: from ``directory`` up, the first folder holding one
    of :data:`INI_NAMES` with pytest options in it (``pytest.ini`` always counts, even empty;
    ``pyproject.toml`` with ``[tool.pytest.ini_options]`` or, pytest 9, ``[tool.pytest]``;
    ``tox.ini`` with ``[pytest]``; ``setup.cfg`` with ``[tool:pytest]``), the first of the
    names there. Reads the files with pytest's own parsers (iniconfig, tomllib), without
    importing pytest. Raises ``UsageProblem`` for a file that does not parse, as pytest does.
    """
    names = INI_NAMES if _pytest_major() >= 9 else INI_NAMES[2:]
    for folder in (directory, *directory.parents):
        for name in names:
            path = folder / name
            if path.is_file():
                options = _ini_options(path)
                if options is not None:
                    return path, options
    return None, {}


def _ini_options(path: Path) -> dict[str, Any] | None:
    """``path``'s pytest options, or None when it holds none (pytest then looks further)."""
    if path.suffix in (".ini", ".cfg"):
        import iniconfig  # pytest's own ini parser (one of its dependencies)

        try:
            parsed = iniconfig.IniConfig(str(path))
        except iniconfig.ParseError as exc:
            raise UsageProblem(str(exc)) from None
        section = "pytest" if path.suffix == ".ini" else "tool:pytest"
        if section in parsed:
            return dict(parsed[section].items())
        return {} if path.name in ("pytest.ini", ".pytest.ini") else None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - pytest's own dependency on Python 3.10
        import tomli as tomllib
    try:
        parsed_toml = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageProblem(f"{path}: {exc}") from None
    if path.name in ("pytest.toml", ".pytest.toml"):
        return _scalars(parsed_toml.get("pytest", {}))
    tool = parsed_toml.get("tool", {}).get("pytest", {})
    native = {key: value for key, value in tool.items() if key != "ini_options"}
    if native and _pytest_major() >= 9:
        return _scalars(native)
    if "ini_options" in tool:
        return _scalars(tool["ini_options"])
    return None


def _scalars(table: Mapping[str, Any]) -> dict[str, Any]:
    """TOML values as the ini gives them: text (``true`` is ``"True"``, read back by the converters), lists kept."""
    return {key: value if isinstance(value, list) else str(value) for key, value in table.items()}


def pytest_ini(directory: Path | None = None) -> Callable[[str], Any]:
    """The ``ini`` argument of :func:`resolve` for a process that is not pytest: the options
    of the ini file pytest run in ``directory`` (default: the current one) would read."""
    _, options = find_ini(Path.cwd() if directory is None else directory)
    return options.get


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


#: A run id is an id (:mod:`.ids`) of at most this many characters.
MAX_RUN_ID = 64


def _check_run_id(run_id: str) -> None:
    # The run id becomes part of consumer_id, a folder name (progress files, a results repository's
    # runs) and a remote path: never "." or "..", which would put them beside their folder.
    if not is_id(run_id, MAX_RUN_ID):
        raise UsageProblem(f"--gpubench-run-id: {shown_id(run_id)} must be 1-{MAX_RUN_ID} {ID_RULE}")
