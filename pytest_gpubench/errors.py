"""The error tree. Every error that ends a cell knows the stage it happened in.

::

    GpubenchError                 anything this project raises on purpose
    ├── UsageProblem              bad options or environment (-> pytest.UsageError)
    │   ├── ManifestTooNew        a manifest written by a newer pytest-gpubench
    │   ├── MigrationNeeded       a manifest a reader finds older than this version writes
    │   ├── NotAManifest          a file a reader was pointed at that is no manifest
    │   └── StoreUnreachable      a store's server (postgresql://) that does not answer
    ├── MatrixError               a matrix file that does not validate (file, field, message)
    │   ├── InventoryError        a hosts inventory (hosts.yaml) that does not validate
    │   └── RunnersError          a runners file that does not validate, or a host or phase it lacks
    ├── ApiUnreachable            nothing answers at the GPU Shopper URL: the run stops
    ├── BridgeTimeout             a call through the event-loop bridge ran out of time
    │                             (also a TimeoutError; reported at the cell's current stage)
    ├── CollectionProblem         paths or options that do not collect (gpubench plan)
    ├── ImportProblem             a result file, or an item of it, that cannot be imported (field, message)
    ├── CommandProblem            a gpubench command cannot do what was asked: one line, its exit status
    ├── UnknownRun                a run name (an id, or last) the store does not know
    ├── InvalidId                 an id from outside (store row, API answer) that may not be a path or URL part
    ├── StoreProblem              a shared store (a results repository) cannot be reached or written
    ├── InternalsChanged          an installed pytest or pytest-xdist lacks a private name the plugin needs
    └── StageError                a cell failed at one stage (stage, message, hint)
        ├── NoEligibleOffer       inventory: offers exist or not, none fits -> skipped
        ├── ClaimLost             the cell's claim was taken over: it stops, no failover
        ├── BudgetRefused         provision: the spend cap leaves no room for the session
        ├── AttemptsFailed        every offer tried failed; the last error's stage
        ├── ApiError              the API answered with an error (status, error_type)
        ├── InstanceLost          the API reports the instance gone while a stage ran on it
        ├── HostKeyChanged        ssh_connect: a session's host key changed between connections
        ├── RemoteCommandError    a command on the instance failed (exit status, stderr tail)
        ├── BenchmarkInterrupted  the benchmark stopped early; carries what it measured
        ├── ThresholdMissed       results: a threshold missed, or a regression against the baseline
        │   └── ErrorBudgetExceeded   results: more requests failed than the default max_error_rate -> partial
        └── ResultsInvalid        results: figures that cannot be right, kept raw, not recorded

The stage becomes the manifest's ``failure_stage``, the progress file's ``ERROR:``
line and the first line of the test's failure report (``[stage] message``); an
error without a stage of its own is reported at the stage the cell was in.

Stage names: seed 000's, except where a seed name tells only the Ollama half of the truth
(``ollama_install`` is the stage that installs and starts *any* runtime: ``runtime_setup``).
:data:`SEED_STAGE_NAMES` is the one table of those differences: the progress file (seed 000's
format) still writes the seed's token (:func:`seed_stage_name`), and everything that reads a stored
or written stage name (store rows, progress files, imports, reports, resume) goes through
:func:`current_stage_name`, so manifests and progress files written before the rename read as today's.

Text from outside made safe to show comes last, used by the messages above and by every
layer: :func:`one_line` (no escape sequence, no line break) and :func:`redact` (a URL's
credentials hidden).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any



class Stage(str, Enum):
    """The stages a cell passes through, in order: seed 000's, one renamed (:data:`SEED_STAGE_NAMES`)."""

    INVENTORY = "inventory"
    PROVISION = "provision"
    SSH_WAIT = "ssh_wait"
    SSH_CONNECT = "ssh_connect"
    RUNTIME_SETUP = "runtime_setup"
    MODEL_PULL = "model_pull"
    BENCHMARK = "benchmark"
    RESULTS = "results"
    CLEANUP = "cleanup"

    def __str__(self) -> str:
        return self.value


#: The stages whose seed-000 name differs from today's: the seed's (and pytest-gpubench's before issue 22)
#: name. The progress file writes it (seed tooling parses ``ERROR: stage=ollama_install``); readers map it back.
SEED_STAGE_NAMES: dict[Stage, str] = {Stage.RUNTIME_SETUP: "ollama_install"}
_CURRENT_NAME = {seed: stage.value for stage, seed in SEED_STAGE_NAMES.items()}


def current_stage_name(name: str) -> str:
    """Today's name of a stage name read from a store row, a progress file or an import: a seed or
    older name becomes today's (``ollama_install`` -> ``runtime_setup``); any other text is returned
    as it is (a reader keeps what it does not know, such as ``stage_seconds``' ``claim``)."""
    return _CURRENT_NAME.get(name, name)


def seed_stage_name(stage: Stage | str) -> str:
    """The name seed 000's progress-file format gives ``stage`` (``runtime_setup`` -> ``ollama_install``)."""
    stage = Stage(current_stage_name(str(stage)))
    return SEED_STAGE_NAMES.get(stage, stage.value)


class GpubenchError(Exception):
    """Base of every error pytest-gpubench raises on purpose."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageProblem(GpubenchError):
    """A bad option value, environment variable or ini setting."""


class ManifestTooNew(UsageProblem):
    """The manifest was written by a newer pytest-gpubench, whose columns this one does not know."""


class MigrationNeeded(UsageProblem):
    """A read-only command met a manifest written by an older pytest-gpubench: it says so and
    changes nothing (``gpubench migrate`` brings the file up to date)."""


class NotAManifest(UsageProblem):
    """A read-only command was pointed at a file that is not a manifest (another SQLite
    database, or no database at all): refused, unchanged."""


class StoreUnreachable(UsageProblem):
    """The store's server (``--gpubench-store postgresql://...``) did not answer or refused the connection."""


class InvalidId(GpubenchError, ValueError):
    """An id that may not become a path segment or a URL part (its message says which and why);
    a ``ValueError`` too, as pydantic validators and callers that parse ids expect."""


class MatrixError(GpubenchError):
    """A matrix file that cannot be used; names the file and the field."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = path
        self.field = field
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


class InventoryError(MatrixError):
    """A hosts inventory (``hosts.yaml``) that cannot be used; names the file and the field."""


class RunnersError(MatrixError):
    """A runners file that cannot be used, or a host or phase it does not know (matrix/runners.py)."""


class ApiUnreachable(GpubenchError):
    """Nothing answers at the GPU Shopper API URL: no cell can run."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)  # a URL's user:password@ is never shown
        super().__init__(
            f"no GPU Shopper API answers at {self.url} ({reason})",
            hint="start the server, point --gpubench-api / GPUBENCH_API_BASE at it, "
            "or run offline with --gpubench-sandbox",
        )


class BridgeTimeout(GpubenchError, TimeoutError):
    """A call through the event-loop bridge (:func:`pytest_gpubench.aio.run`) ran out of
    time; the coroutine was cancelled. Still a ``TimeoutError`` for those who catch that."""

    def __init__(self, timeout: float | None) -> None:
        super().__init__(f"timed out after {timeout:.0f} s" if timeout is not None else "timed out")
        self.timeout = timeout


class CollectionProblem(GpubenchError):
    """The paths or options do not collect (a bad matrix, an unknown path or option): one line."""


class ImportProblem(GpubenchError):
    """Why a file (or an item of it) cannot be imported: the field and what is allowed.

    ``loc`` is the field's path in the file's JSON (``("benchmarks", 2, "results")``),
    ``field`` the same as text (``benchmarks[2].results``); empty for the whole file.
    """

    def __init__(self, loc: Sequence[Any], message: str) -> None:
        super().__init__(message)
        self.loc = tuple(loc)
        self.field = dotted(self.loc)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def dotted(loc: Sequence[Any]) -> str:
    """A field's path as text: ``("matrix", 2, "workload")`` -> ``matrix[2].workload``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out


#: Exit statuses of the ``gpubench`` command.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandProblem(GpubenchError):
    """A ``gpubench`` command cannot do what was asked: one line for the user, and the
    exit status to end with (``EXIT_USAGE`` for what the user can fix on the command
    line, ``EXIT_FAILED`` when the work itself failed)."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


class UnknownRun(GpubenchError):
    """A run name (a run id, or ``last``) that names no run of the store: the message
    says which runs there are. Each way in words it as its own kind of problem."""

    def __init__(self, wanted: str, message: str) -> None:
        super().__init__(message)
        self.wanted = wanted


class StoreProblem(GpubenchError):
    """A shared store could not be reached or refused a change (a git command of the git
    store that failed, a claim it could not push): what it said, any password hidden."""


class InternalsChanged(GpubenchError):
    """The installed pytest or pytest-xdist no longer has a private name the plugin cannot do
    without (plugin/internals.py says which, and the versions it was checked with)."""


class StageError(GpubenchError):
    """A cell failed at ``stage``; the message is one paragraph for a person.

    Its message and hint often quote the instance (stderr, a server's answer): they go through
    :func:`one_line`, the progress files' rule, so no escape sequence or line break
    from there reaches the terminal, the manifest or JUnit."""

    def __init__(self, stage: Stage | str, message: str, *, hint: str = "") -> None:
        super().__init__(one_line(message), hint=one_line(hint))
        self.stage = Stage(current_stage_name(str(stage)))


class ClaimLost(StageError):
    """The cell's claim is another controller's now (this one was presumed dead): the cell
    stops, writes nothing more to the row, and no other offer is tried for it."""


class NoEligibleOffer(StageError):
    """No offer meets the cell's constraints: the cell is skipped, not failed."""

    def __init__(self, message: str) -> None:
        super().__init__(Stage.INVENTORY, message)


class ApiError(StageError):
    """The GPU Shopper API answered with an error status."""

    def __init__(
        self,
        stage: Stage,
        status: int,
        message: str,
        *,
        error_type: str = "",
        retry_suggested: bool = False,
        call: str = "",
        hint: str = "",
    ) -> None:
        self.status = status
        self.error_type = error_type
        self.retry_suggested = retry_suggested
        kind = f" {error_type}" if error_type else ""
        to = f" to {call}" if call else ""
        super().__init__(stage, f"API answered {status}{kind}{to}: {message}", hint=hint)


class RemoteCommandError(StageError):
    """A command on the instance exited non-zero (asyncssh's own text omits stderr)."""

    def __init__(self, stage: Stage, what: str, exit_status: int | None, stderr: str) -> None:
        self.exit_status = exit_status
        self.stderr_tail = one_line(stderr).strip()[-600:]
        status = "was killed" if exit_status is None else f"exited {exit_status}"
        detail = f": {self.stderr_tail}" if self.stderr_tail else ""
        super().__init__(stage, f"{what} {status}{detail}")


class BenchmarkInterrupted(StageError):
    """The benchmark ended early; ``partial`` holds what was measured before."""

    def __init__(self, message: str, partial: Any = None) -> None:
        super().__init__(Stage.BENCHMARK, message)
        self.partial = partial


class BudgetRefused(StageError):
    """The spend cap leaves no room for this cell's session: it is not started."""

    def __init__(self, reason: str) -> None:
        super().__init__(Stage.PROVISION, reason)


class AttemptsFailed(StageError):
    """Every offer tried failed; the stage is the last error's, the message lists them all."""


#: What to do when the provider took an instance away.
LOST_HINT = "the provider stopped the instance; rerun the cell to rent another one"


class InstanceLost(StageError):
    """The API reports the session's instance gone while a stage was running on it."""

    def __init__(self, stage: Stage, message: str) -> None:
        super().__init__(stage, message, hint=LOST_HINT)


class HostKeyChanged(StageError):
    """A later connection to a session met another host key than its first one did, or a
    host presented another key than its known_hosts entry (``where``: the files checked)."""

    def __init__(self, host: str, port: int, pinned: str, *, presented: str = "", where: str = "") -> None:
        now = f"now the server presents {presented}" if presented else "now the server presents another key"
        if where:
            message = (f"the SSH host key of {host}:{port} changed: known_hosts ({where}) expects {pinned}, "
                       f"{now}; refusing to connect")
            hint = ("the machine was reinstalled or someone is intercepting the connection; if the new key is "
                    f"right, remove the old entry (ssh-keygen -R '[{host}]:{port}' -f FILE) and run again")
        else:
            message = (f"the SSH host key of {host}:{port} changed: this session's first connection saw {pinned}, "
                       f"{now}; refusing to connect")
            hint = ("the instance was replaced or someone is intercepting the connection; do not reuse it, "
                    "rerun the cell to rent a fresh session")
        super().__init__(Stage.SSH_CONNECT, message, hint=hint)
        self.pinned = pinned
        self.presented = presented


class ThresholdMissed(StageError):
    """The benchmark ran but missed a threshold or regressed against its baseline."""

    def __init__(self, message: str) -> None:
        super().__init__(Stage.RESULTS, message)


class ErrorBudgetExceeded(ThresholdMissed):
    """More requests failed than the default ``max_error_rate`` allows (the matrix set none):
    what was measured is kept, but the cell is ``partial``, never a success."""


class ResultsInvalid(StageError):
    """The measured figures cannot be right: kept raw for inspection, not recorded as a result."""

    def __init__(self, message: str, kept: Path) -> None:
        super().__init__(Stage.RESULTS, f"{message}; kept raw in {kept}",
                         hint="nothing from this cell was stored as a measurement")
        self.kept = kept


# --------------------------------------------------------------------------------------------------
# Text from outside (instance output, API answers) made safe to show: one line, nothing a terminal obeys.
#
# Remote stderr, a model's error text or a store row may carry terminal escape sequences (colours,
# cursor moves, a title change, an OSC 8 link) and line breaks. :func:`one_line` is the one rule for
# everything such text reaches: progress files (one record per line), failure messages in the
# terminal and JUnit, warnings. Standard library only.


#: Escape sequences as a whole, so no ``[31m`` is left behind: CSI (``ESC [`` or the 8-bit ``\x9b``,
#: parameters, final byte), OSC/DCS/SOS/PM/APC strings (to BEL or ST, or the end of the text),
#: and two-character escapes.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x1b][\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|[\x90\x9d\x9e\x9f\x98][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
#: Everything ``str.splitlines()`` would break on, the other C0 and C1 control characters, and the
#: bidirectional overrides that make a terminal show text in another order than it is.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]+")


def one_line(text: str) -> str:
    """``text`` with escape sequences removed and every run of control characters made one space."""
    return _CONTROL.sub(" ", _ESCAPES.sub("", text))


# --------------------------------------------------------------------------------------------------
# URLs fit to print: the one place a URL's credentials are hidden.
#
# In the top-level error module so that every layer can use it: the stores (which name themselves by it),
# the API client and its errors (an API URL may carry ``user:password@``), the commands.
#
# What is hidden, in every URL found in the text (``scheme://`` up to a space or a quote):
#
# * a password: ``user:secret@host`` shows as ``user:***@host``, whatever the password holds
#   (``/``, ``@``, ``:``, ``%40``...): the userinfo runs to the *last* ``@`` of the URL, which
#   libpq and git read as a password the standard parser would take for a path;
# * a lone user name where it is usually a token (``git+https://ghp_TOKEN@github.com/o/r.git``):
#   ``***@host``; a PostgreSQL or ssh user name is a name, not a secret, and stays;
# * the values of the query parameters ``password``, ``sslpassword`` and ``token`` (any case).
#
# Text that holds no URL (a path, ``git@github.com:o/r``) comes back unchanged.


#: A URL inside a message: from its scheme to the first space or quote.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]*""")
_SECRET_PARAMETER = re.compile(r"([?&;](?:password|sslpassword|token)=)[^&#;]*", re.IGNORECASE)
#: Schemes whose user name alone is an account name, not a credential.
_USER_IS_A_NAME = frozenset({"postgresql", "postgres", "ssh", "git+ssh"})


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``(scheme://, userinfo or None, the rest)`` of ``url``: the userinfo is everything before the
    URL's last ``@`` when the user name (before its first ``:``) holds no ``/``, ``?`` or ``#``, so a
    password with ``/`` or ``@`` in it stays whole; ``('', None, url)`` when ``url`` is not one."""
    # Not urllib.parse.urlsplit: its netloc ends at the first "/", which cuts a password in two
    # (and it raises on a stray "["), where libpq and git read up to the last "@".
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url)
    if scheme is None:
        return "", None, url
    head, rest = scheme[0], url[scheme.end():]
    userinfo, at, host = rest.rpartition("@")
    if not at or re.search(r"[/?#]", userinfo.partition(":")[0]):
        return head, None, rest
    return head, userinfo, host


def _redact_url(url: str) -> str:
    head, userinfo, rest = split_userinfo(url)
    rest = _SECRET_PARAMETER.sub(r"\1***", rest)
    if userinfo is None:
        return head + rest
    user, colon, _ = userinfo.partition(":")
    if colon:
        shown = f"{user}:***"
    else:
        shown = user if head[:-3].lower() in _USER_IS_A_NAME else "***"
    return f"{head}{shown}@{rest}"


def redact(location: str | Path) -> str:
    """``location`` (a store location, or a message naming URLs) fit to print: every URL's
    credentials replaced by ``***`` (see the module's docstring for which parts)."""
    return _URL.sub(lambda found: _redact_url(found[0]), str(location))
