"""Field types of the matrix schema: each validator says what is allowed.

Every value a user can write in a matrix file is checked here, and a bad one
raises an error whose message names what would be accepted (``must be a number
of seconds or a string such as '90s'...``); ``yaml_errors`` adds the file, the
field path and the line. The clouds whose machines a run finds and leaves as found
(``KEPT_MACHINES``) are named here too: a provider's field rules depend on them; so are
the fields of a running endpoint (``runtime: {name: openai, endpoint: URL}``).
"""

from __future__ import annotations

import difflib
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from ..options import MAX_PRICE_PER_HOUR, is_finite, parse_duration
from ..runtime_facts import DEFAULT_RUNTIME, is_runtime, runtime_names
from .selection import normalize_provider, number_text
from .yaml_errors import describe

KNOWN_PROVIDERS: tuple[str, ...] = ("vastai", "tensordock", "bluelobster")
"""Providers a matrix may name (GPU Shopper's provider names)."""
# The runtimes a matrix may name, and DEFAULT_RUNTIME (imported above, for the matrix's modules), are
# runtime_facts.py's registry: built in or registered by an entry point, each declared in its own module.

MAX_DURATION_S = 24 * 3600.0
MAX_CONCURRENCY = 1024
MAX_RATE = 1000.0
MAX_RUNS = 100


_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_MODEL_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*(?::{_SEGMENT})?")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class StrictModel(BaseModel):
    """Frozen, and an unknown key is an error that lists the allowed keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    hint = did_you_mean(str(key), allowed)
                    message = f"unknown key{hint}; allowed keys: {', '.join(allowed)}"
                    raise PydanticCustomError(
                        "unknown_key", "{message}", {"key": str(key), "message": message}
                    )
        return data


# ------------------------------------------------------------------ field validators


def invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("gpubench", "{message}", {"message": message})


def _number(value: Any, allowed: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value):
        raise invalid(f"{allowed}; got {describe(value)}")
    return Fraction(value)


def _seconds(value: Any) -> float:
    allowed = (
        "must be a number of seconds or a string such as '90s', '5m', '1h30m', "
        "more than 0 and at most 24h"
    )
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise invalid(f"{allowed}; got {describe(value)}") from None
    if not (is_finite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise invalid(f"{allowed}; got {describe(value)}")
    return seconds


def whole(low: int, high: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise invalid(f"must be a whole number from {low} to {high}; got {describe(value)}")
        return value

    return BeforeValidator(check)


def _price(value: Any) -> float:
    allowed = (f"must be a price in dollars per hour, more than 0 and at most {MAX_PRICE_PER_HOUR:g} "
               "(or null for no cap)")
    if not 0 < _number(value, allowed) <= MAX_PRICE_PER_HOUR:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def _confidence(value: Any, allowed: str) -> float:
    if not 0 <= _number(value, allowed) <= 1:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def confidences(value: Any) -> dict[str, float]:
    """A plain number is the bar for every provider; a mapping sets some of them."""
    allowed = "must be a number from 0 to 1, or a mapping such as {default: 0.5, tensordock: 0.2}"
    if not isinstance(value, Mapping):
        bar = _confidence(value, allowed)
        return {"default": bar, **{p: bar for p in KNOWN_PROVIDERS}}
    keys = ("default", *KNOWN_PROVIDERS)
    out: dict[str, float] = {}
    for key, bar in value.items():
        name = normalize_provider(str(key))
        if name not in keys:
            raise invalid(f"unknown key {key!r}; allowed keys: {', '.join(keys)}")
        out[name] = _confidence(bar, f"{key}: {allowed}")
    return out


_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: A plain Docker image reference: ``[registry[:port]/]path[:tag][@sha256:digest]``, nothing a shell expands.
IMAGE_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


def is_image_reference(value: Any) -> bool:
    """A plain Docker image reference (:data:`IMAGE_REFERENCE`) of at most 255 characters: the one
    check for ``runtime.launch.image`` and a worker preset's ``docker_image``."""
    return isinstance(value, str) and len(value) <= 255 and IMAGE_REFERENCE.fullmatch(value) is not None


def text_field(what: str, example: str):
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise invalid(f"must be {what}, such as {example}; got {describe(value)}")
        return value

    return check


def _gpu(value: Any) -> str:
    allowed = (
        "must be a GPU name as the inventory writes it, such as 'RTX 4090' or 'A100 80GB' "
        "(letters, digits, spaces, '.', '_', '-')"
    )
    name = " ".join(text_field("a GPU name", "'RTX 4090'")(value).split())
    if not _GPU_RE.fullmatch(name):
        raise invalid(f"{allowed}; got {value!r}")
    return name


#: The built-in clouds whose ``provider:`` is one of GPU Shopper's marketplaces (:data:`KNOWN_PROVIDERS`):
#: ``matrix.cells.DEFAULT_CLOUD`` and ``matrix.fields.ENDPOINT_CLOUD`` (a test holds them equal).
#: Under ``hosts``/``local`` it names machines; under a third-party cloud, whatever that cloud calls
#: a provider.
MARKETPLACE_CLOUDS = frozenset({"shopper", "endpoint"})


def _provider(value: Any, info: ValidationInfo) -> str:
    raw = text_field("a provider name", "'vastai'")(value)
    cloud = (info.context or {}).get("cloud")
    if cloud in KEPT_MACHINES:
        # Machines, not a marketplace: `hosts` (any host), a host's name or a tag pins it.
        if not NAME_RE.fullmatch(raw.strip()):
            raise invalid(f"must be `hosts` (any host), a host's name or a tag of the inventory; got {raw!r}")
        return raw.strip()
    if isinstance(cloud, str) and cloud not in MARKETPLACE_CLOUDS:
        # A third-party cloud (an entry point; collection checks it is installed): its providers are
        # its own, a plain name here, which its offers match or not.
        if not NAME_RE.fullmatch(raw.strip()):
            raise invalid(f"must name a provider of the {cloud!r} cloud (letters, digits, '.', '_', '-'); "
                          f"got {raw!r}")
        return normalize_provider(raw)
    name = normalize_provider(raw)
    if name not in KNOWN_PROVIDERS:
        raise invalid(
            f"unknown provider {raw!r}{did_you_mean(name, KNOWN_PROVIDERS)}; "
            f"known providers: {', '.join(KNOWN_PROVIDERS)}"
        )
    return name


def hosts_file(value: Any, base_dir: Path) -> str:
    """A hosts inventory's path (``hosts:``); a relative one is relative to the matrix file's folder."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the path of a hosts inventory, such as 'hosts.yaml'; got {describe(value)}")
    path = Path(value.strip()).expanduser()
    return str((path if path.is_absolute() else base_dir / path).resolve())


def runtime_name(value: Any) -> str:
    """A runtime built in or registered (``runtime_facts.py``), as written or in another case; the
    installed distributions' entry points are read only for a name not built in."""
    raw = text_field("a runtime name", f"'{DEFAULT_RUNTIME}'")(value)
    name = raw.strip().lower()
    if not is_runtime(name):
        names = runtime_names()
        raise invalid(f"unknown runtime {raw!r}{did_you_mean(name, names)}; known runtimes: {', '.join(names)}")
    return name


def model_name(value: Any) -> str:
    name = text_field("an Ollama model name", "'qwen2:7b'")(value).strip()
    if len(name) > 200 or not _MODEL_RE.fullmatch(name):
        raise invalid(
            f"not a valid Ollama model name: {value!r}; write NAME or NAME:TAG such as "
            "'qwen2:7b' (letters, digits, '.', '_', '-', and '/' for a namespace)"
        )
    return name


def _axis(value: Any, allowed: str, check: Any) -> tuple[Any, ...]:
    """One value or a non-empty list of them, each passed through ``check``, none twice."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise invalid(f"{allowed}; got an empty list")
    out: list[Any] = []
    for i, item in enumerate(values):
        checked = check(item)
        if checked is None:
            where = f"item {i} is " if isinstance(value, (list, tuple)) else ""
            raise invalid(f"{allowed}; got {where}{describe(item)}")
        if checked in out:
            raise invalid(f"{allowed}; {describe(item)} is listed twice")
        out.append(checked)
    return tuple(out)


def _concurrency(value: Any) -> tuple[int, ...] | str:
    if value == "sweep":  # `concurrency: sweep`: one cell, its levels on one session (matrix/workload.py)
        return value
    allowed = (f"must be a whole number of requests in flight from 1 to {MAX_CONCURRENCY}, a non-empty list "
               "of them such as [1, 8, 32] (a cell each), or `sweep` for a concurrency sweep on one session")

    def check(item: Any) -> int | None:
        ok = isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= MAX_CONCURRENCY
        return item if ok else None

    return _axis(value, allowed, check)


def _rate(value: Any) -> tuple[float, ...] | str | None:
    if value is None or value == "sweep":  # `rate: sweep`: a saturation sweep (matrix/workload.py)
        return value
    allowed = (f"must be a number of requests per second, more than 0 and at most {MAX_RATE:g}, "
               "a non-empty list of them such as [0.5, 1, 2.5], or `sweep` for a saturation sweep")

    def check(item: Any) -> float | None:
        ok = isinstance(item, (int, float)) and not isinstance(item, bool) and is_finite(item)
        return float(item) if ok and 0 < item <= MAX_RATE else None

    return _axis(value, allowed, check)


def axis_text(values: tuple[Any, ...] | str) -> str:
    """An axis as it would be written: ``8``, ``[1, 8, 32]`` or ``sweep``."""
    if isinstance(values, str):
        return values
    shown = [number_text(v) for v in values]
    return shown[0] if len(shown) == 1 else f"[{', '.join(shown)}]"


def fraction(value: Any, allowed: str, *, above_zero: bool = False) -> float:
    """A number from 0 to 1, or a percentage string such as ``"2%"``."""
    number: Any = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1]) / 100
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not is_finite(number) \
            or not (0 < number <= 1 if above_zero else 0 <= number <= 1):
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(number)


def positive(what: str):
    """A number more than 0, or null (no bound)."""
    def check(value: Any) -> float | None:
        if value is None:
            return None
        allowed = f"must be {what}, more than 0 (or null for none)"
        if _number(value, allowed) <= 0:
            raise invalid(f"{allowed}; got {describe(value)}")
        return float(value)

    return BeforeValidator(check)


class Runs(StrictModel):
    """``workload.runs``: how many times a cell's benchmark is measured on its session.

    ``runs: 3`` is ``Runs(count=3, min=3, max=3)``; ``runs: {until_cv: 2%, min: 3,
    max: 10}`` is ``Runs(count=None, until_cv=0.02, min=3, max=10)``: run at least
    ``min`` times, then stop once the coefficient of variation of the runs' TPS is
    at most ``until_cv``, and after ``max`` runs in any case.
    """

    count: int | None = 1
    until_cv: float | None = None
    min: int = 1
    max: int = 1

    @classmethod
    def fixed(cls, count: int) -> Runs:
        return cls(count=count, min=count, max=count)

    @model_validator(mode="after")
    def _consistent(self) -> Runs:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"needs 1 <= min <= max; got min {self.min}, max {self.max}")
        return self

    def finished(self, done: int, cv: float | None = None) -> bool:
        """True when no more runs are needed after ``done`` runs whose TPS varied by ``cv``."""
        if done >= self.max:
            return True
        if done < self.min:
            return False
        return self.until_cv is not None and cv is not None and cv <= self.until_cv

    def __str__(self) -> str:
        if self.until_cv is None:
            return str(self.count)
        return f"until CV <= {number_text(round(self.until_cv * 100, 6))}% ({self.min} to {self.max} runs)"


def _runs(value: Any) -> Runs:
    allowed = (f"must be a whole number of runs from 1 to {MAX_RUNS}, or a mapping such as "
               "{until_cv: '2%', min: 3, max: 10}")
    if isinstance(value, Runs):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_RUNS:
            raise invalid(f"{allowed}; got {describe(value)}")
        return Runs.fixed(value)
    if not isinstance(value, Mapping):
        raise invalid(f"{allowed}; got {describe(value)}")
    if set(value) == set(Runs.model_fields):  # a dumped Runs, read back
        return Runs.model_validate(value)
    keys = ("until_cv", "min", "max")
    for key in value:
        if key not in keys:
            raise invalid(f"unknown key {str(key)!r}{did_you_mean(str(key), keys)}; "
                          f"allowed keys: {', '.join(keys)}")
    if "until_cv" not in value:
        raise invalid("`until_cv` is required in the mapping form, such as {until_cv: '2%', min: 3, "
                      "max: 10}; for a fixed number of runs write `runs: 5`")
    until_cv = fraction(value["until_cv"], "`until_cv` must be a fraction such as 0.02 or a "
                        "percentage such as '2%', more than 0 and at most 100%", above_zero=True)
    bounds = {"min": 3, "max": 10}
    for key in bounds:
        if key in value:
            n = value[key]
            if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_RUNS:
                raise invalid(f"`{key}` must be a whole number of runs from 2 to {MAX_RUNS} (a "
                              f"coefficient of variation needs two runs); got {describe(n)}")
            bounds[key] = n
    if bounds["min"] > bounds["max"]:
        raise invalid(f"`min` ({bounds['min']}) is more than `max` ({bounds['max']})")
    return Runs(count=None, until_cv=until_cv, **bounds)


#: ``gpus:``: how many GPUs of one machine a cell may span (the tensor-parallel sizes servers accept).
GPU_COUNTS = (1, 2, 4, 8)


def _gpu_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in GPU_COUNTS:
        raise invalid(f"must be one of {', '.join(map(str, GPU_COUNTS))} (GPUs on one machine, the model "
                      f"spread over them); got {describe(value)}")
    return value


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Seconds = Annotated[float, BeforeValidator(_seconds)]
GpuName = Annotated[str, BeforeValidator(_gpu)]
GpuCount = Annotated[int, BeforeValidator(_gpu_count)]
ProviderName = Annotated[str, BeforeValidator(_provider)]
ModelName = Annotated[str, BeforeValidator(model_name)]
RuntimeName = Annotated[str, BeforeValidator(runtime_name)]
MaxTokens = Annotated[int, whole(1, 131072)]
Warmup = Annotated[int, whole(0, 1000)]
CheckpointEvery = Annotated[int, whole(1, 1_000_000)]
Price = Annotated[float, BeforeValidator(_price)]
Concurrency = Annotated[tuple[int, ...] | Literal["sweep"], BeforeValidator(_concurrency)]
Rate = Annotated[tuple[float, ...] | Literal["sweep"] | None, BeforeValidator(_rate)]
RunsField = Annotated[Runs, BeforeValidator(_runs)]


# --------------------------------------------------------------------------------------------------
# The clouds of machines a run does not rent but finds and leaves as it found them.
#
# ``cloud: hosts`` benchmarks on the machines of an inventory (``hosts.yaml``, named by the
# matrix's top-level ``hosts:`` or ``--gpubench-hosts``); ``cloud: local`` on this machine.
# Their providers (``cloud/hosts_provider.py``) lease GPUs instead of renting sessions, so a
# cell's session is its own (``reuse: cell``): nothing is paid per session, and each cell
# holds only its own GPUs, which lets workers spread cells over hosts.


HOSTS_CLOUD = "hosts"
LOCAL_CLOUD = "local"
#: Clouds whose machines stay after a run: servers a cell started are stopped in its teardown.
KEPT_MACHINES = frozenset({HOSTS_CLOUD, LOCAL_CLOUD})


# --------------------------------------------------------------------------------------------------
# ``runtime: {name: openai, endpoint: URL, ...}``: a server that is already up, benchmarked as it is.
#
# Nothing is rented or started for such a cell: the ``endpoint`` provider
# (``cloud/endpoint_provider.py``) stands in for the rental, and
# ``runtimes/openai_endpoint.py`` for the runtime. These fields only check what the
# matrix says of the endpoint, so a bad URL stops collection with the field and line.


#: The runtime name of a running endpoint, and the ``cloud:`` and ``provider`` its cells go through.
ENDPOINT_RUNTIME = "openai"
ENDPOINT_CLOUD = "endpoint"
ENDPOINT_PROVIDER = "endpoint"
#: The keys of ``runtime:`` that describe a running endpoint (only with ``name: openai``).
ENDPOINT_KEYS = ("endpoint", "api", "api_key_env", "price_per_hour", "ca_file")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class EndpointSpec(BaseModel):
    """A running OpenAI-compatible server: where it is, which API to measure, how to authenticate."""

    model_config = ConfigDict(frozen=True)

    #: Its base URL, ``http(s)://host[:port][/prefix]`` (a trailing ``/v1`` is allowed), no credentials.
    url: str
    #: ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``).
    api: Literal["chat", "completions"] = "chat"
    #: The environment variable holding its bearer token; the token itself is never written anywhere.
    api_key_env: str | None = None
    #: What an hour of it costs, for $/M tokens (0: free or unknown).
    price_per_hour: float = 0.0
    #: A CA file an https:// server's certificate is verified against (else the system's trust store).
    ca_file: str | None = None

    @property
    def protocol(self) -> str:
        """The load generator's protocol for :attr:`api`."""
        return f"openai-{self.api}"


def endpoint_url(value: Any) -> str:
    """An absolute ``http://`` or ``https://`` URL with a host and no credentials, query or fragment."""
    example = "such as 'http://127.0.0.1:8000' or 'https://llm.example.com/v1'"
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the server's URL, {example}; got {describe(value)}")
    text = value.strip()
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise invalid(f"must be an absolute http:// or https:// URL, {example}; got {text!r}")
    if parsed.username is not None or parsed.password is not None or "@" in parsed.netloc:
        # Never echo it: the part before '@' is a secret.
        raise invalid("must not carry credentials (user:password@): put the token in an environment "
                      "variable and name it with `api_key_env`")
    if parsed.query or parsed.fragment:
        raise invalid(f"must be the server's base URL without '?' or '#', {example}; got {text!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        raise invalid(f"has an invalid port; got {text!r}") from None
    if not parsed.hostname or any(ch.isspace() for ch in text):
        raise invalid(f"needs a host name without spaces, {example}; got {text!r}")
    return text.rstrip("/")


def api_key_env(value: Any) -> str:
    """The name of an environment variable (never its value)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise invalid("must be the name of an environment variable holding the token, such as "
                      f"'OPENAI_API_KEY' (letters, digits, '_'); got {describe(value)}")
    return value


def endpoint_price(value: Any) -> float:
    allowed = f"must be a price in dollars per hour from 0 to {MAX_PRICE_PER_HOUR:g}"
    if not 0 <= _number(value, allowed) <= MAX_PRICE_PER_HOUR:
        raise invalid(f"{allowed}; got {describe(value)}")
    return float(value)


def ca_file(value: Any, base_dir: Path) -> str:
    """An existing CA file; a relative path is relative to the matrix file's folder."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the path of a PEM file of CA certificates; got {describe(value)}")
    path = Path(value.strip()).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise invalid(f"no such file: {str(path)!r}")
    return str(path.resolve())


EndpointUrl = Annotated[str, BeforeValidator(endpoint_url)]
EnvName = Annotated[str, BeforeValidator(api_key_env)]
EndpointPrice = Annotated[float, BeforeValidator(endpoint_price)]
