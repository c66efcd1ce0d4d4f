"""Matrix files: the schema, their expansion into cells, filters and stable test ids.

A matrix file (YAML) lists rows of GPU x providers x models, with workload and offer
defaults that rows may override. :func:`load_matrix` validates a file into a
:class:`Matrix`; :func:`expand` turns it into one frozen :class:`Cell` per
(row, provider, model), in file order. Every problem in a file is a
:class:`~pytest_gpubench.errors.MatrixError` naming the file, the field in dotted
form (``matrix[2].workload.duration``) and what is allowed, on one line.

The filters (:func:`gpu_matches`, :func:`provider_matches`, :func:`model_matches`,
:func:`cell_selected`) are what ``--gpu``, ``--provider`` and ``--model`` use.
The reference for users is ``docs/matrix.md``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .errors import MatrixError

KNOWN_PROVIDERS: tuple[str, ...] = ("vastai", "tensordock", "bluelobster")
"""Providers a matrix may name (GPU Shopper's provider names)."""

DEFAULT_MIN_AVAILABILITY_CONFIDENCE = 0.5
"""Seed 000's bar; TensorDock offers always report 0.3, so give it its own bar."""

MAX_DURATION_S = 24 * 3600.0

SEED_PROMPTS: tuple[str, ...] = (
    "Write a Python function to implement binary search on a sorted list.",
    "Explain quantum computing in simple terms for a 10-year-old.",
    "What are the key differences between REST and GraphQL APIs?",
    "Write a haiku about programming.",
    "Debug this code: for i in range(10): print(i",
    "Explain the CAP theorem and its implications for distributed systems.",
    "Write a regex pattern to match valid email addresses.",
    "What is the time complexity of quicksort and why?",
    "Describe three design patterns used in object-oriented programming.",
    "How does garbage collection work in modern programming languages?",
)
"""Seed 000's prompt mix, in its order: the default ``workload.prompts``."""

MODEL_VRAM_GB: Mapping[str, int] = MappingProxyType({
    "llama3:8b": 8,
    "llama3:70b": 48,
    "mistral:7b": 8,
    "phi3:mini": 4,
    "phi3:medium": 16,
    "codellama:34b": 24,
    "deepseek-r1:14b": 12,
    "deepseek-r1:32b": 24,
    "deepseek-r1:70b": 48,
})
"""Seed 000's VRAM minimums in GB; other models are inferred from their tag."""

_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_MODEL_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*(?::{_SEGMENT})?")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_PARAMS_RE = re.compile(
    r"(?<![a-z0-9.])(?:(\d+(?:\.\d+)?)x)?(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", re.I
)
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?"
)


# ---------------------------------------------------------------- names and filters


def normalize_gpu(name: str) -> str:
    """``"RTX 4090"``, ``"rtx-4090"`` and ``"RTX_4090"`` all become ``"rtx4090"``."""
    return re.sub(r"[\s_-]+", "", name).lower()


def gpu_matches(wanted: str, gpu_type: str) -> bool:
    """True if ``wanted`` names ``gpu_type`` exactly, ignoring case, spaces, ``-``, ``_``.

    ``RTX4090`` matches ``"RTX 4090"``; ``A100`` does not match ``"A100 80GB"``,
    like the API's own ``gpu_type`` filter.
    """
    key = normalize_gpu(wanted)
    return bool(key) and key == normalize_gpu(gpu_type)


def normalize_provider(name: str) -> str:
    """``"Vast.ai"`` -> ``"vastai"``, ``"TensorDock"`` -> ``"tensordock"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def provider_matches(wanted: str, provider: str) -> bool:
    """True if both name the same provider (``Vast.ai`` matches ``vastai``)."""
    key = normalize_provider(wanted)
    return bool(key) and key == normalize_provider(provider)


def _split_tag(model: str) -> tuple[str, str | None]:
    """``"ns/name:tag"`` -> ``("ns/name", "tag")``; the tag is None when absent."""
    head, _, last = model.rpartition("/")
    if ":" not in last:
        return model, None
    name, _, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), tag


def model_ref(model: str) -> str:
    """The Ollama reference with its tag: ``"llama3"`` -> ``"llama3:latest"``."""
    model = model.strip()
    name, tag = _split_tag(model)
    return model if tag is not None else f"{name}:latest"


def model_matches(wanted: str, model: str) -> bool:
    """True if ``wanted`` selects ``model`` (case-insensitive).

    With a tag the match is exact after ``:latest`` normalisation (``llama3``
    equals ``llama3:latest``); without one, ``wanted`` names a family and matches
    every tag of it: ``deepseek-r1`` selects ``deepseek-r1:14b`` and ``:32b``.
    """
    wanted, model = wanted.strip().lower(), model_ref(model).lower()
    if not wanted:
        return False
    name, tag = _split_tag(wanted)
    return model == wanted if tag is not None else _split_tag(model)[0] == name


def _values(values: Iterable[str] | None) -> list[str]:
    """Filter values; each may itself be a comma-separated list."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


def cell_selected(
    cell: Cell,
    gpus: Iterable[str] | None = (),
    providers: Iterable[str] | None = (),
    models: Iterable[str] | None = (),
) -> bool:
    """True if ``cell`` passes the ``--gpu``/``--provider``/``--model`` filters.

    Within one filter any value may match; an empty filter selects everything.
    """
    checks = (
        (_values(gpus), gpu_matches, cell.gpu),
        (_values(providers), provider_matches, cell.provider),
        (_values(models), model_matches, cell.model),
    )
    return all(not wanted or any(match(w, have) for w in wanted) for wanted, match, have in checks)


def select_cells(
    cells: Iterable[Cell],
    gpus: Iterable[str] | None = (),
    providers: Iterable[str] | None = (),
    models: Iterable[str] | None = (),
) -> list[Cell]:
    """The cells :func:`cell_selected` keeps, in order."""
    return [c for c in cells if cell_selected(c, gpus, providers, models)]


# ---------------------------------------------------------------------------- VRAM


def infer_parameters_b(model: str) -> float | None:
    """Billions of parameters named in the tag (``7b``, ``1.5b``, ``8x7b``, ``135m``)."""
    tag = _split_tag(model.strip())[1]
    found = _PARAMS_RE.search(tag or "")
    if not found:
        return None
    return float(_parameters(found))


def _parameters(found: re.Match[str]) -> Fraction:
    experts, size, unit = found.groups()
    params = Fraction(size) * (Fraction(experts) if experts else 1)
    return params / 1000 if unit.lower() == "m" else params


def infer_vram_gb(model: str) -> int | None:
    """``ceil(params_b * 0.65 / 4) * 4`` GB, at least 4; None without a size in the tag.

    The rule gives every entry of :data:`MODEL_VRAM_GB` whose tag names a size.
    """
    found = _PARAMS_RE.search(_split_tag(model.strip())[1] or "")
    if not found:
        return None
    return max(4, math.ceil(_parameters(found) * Fraction(13, 20) / 4) * 4)


def model_vram_gb(model: str, overrides: Mapping[str, int] | None = None) -> int | None:
    """GB of VRAM ``model`` needs: the override, else the seed table, else inferred."""
    ref = model_ref(model).lower()
    for table in (overrides or {}, MODEL_VRAM_GB):
        if ref in table:
            return table[ref]
    return infer_vram_gb(model)


# ------------------------------------------------------------------ field validators


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("gpubench", "{message}", {"message": message})


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list" if value else "an empty list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, allowed: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise _invalid(f"{allowed}; got {_kind(value)}")
    return Fraction(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"5m"``, ``"1h30m"``, ``"300"``."""
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise ValueError(f"not a duration: {value!r}")
    return float(value)


def _seconds(value: Any) -> float:
    allowed = (
        "must be a number of seconds or a string such as '90s', '5m', '1h30m', "
        "more than 0 and at most 24h"
    )
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise _invalid(f"{allowed}; got {_kind(value)}") from None
    if not (_finite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise _invalid(f"{allowed}; got {_kind(value)}")
    return seconds


def _whole(low: int, high: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _invalid(f"must be a whole number from {low} to {high}; got {_kind(value)}")
        return value

    return BeforeValidator(check)


def _price(value: Any) -> float:
    allowed = "must be a price in dollars per hour, more than 0 (or null for no cap)"
    if _number(value, allowed) <= 0:
        raise _invalid(f"{allowed}; got {_kind(value)}")
    return float(value)


def _confidence(value: Any, allowed: str) -> float:
    if not 0 <= _number(value, allowed) <= 1:
        raise _invalid(f"{allowed}; got {_kind(value)}")
    return float(value)


def _confidences(value: Any) -> dict[str, float]:
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
            raise _invalid(f"unknown key {key!r}; allowed keys: {', '.join(keys)}")
        out[name] = _confidence(bar, f"{key}: {allowed}")
    return out


def _text(what: str, example: str):
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _invalid(f"must be {what}, such as {example}; got {_kind(value)}")
        return value

    return check


def _gpu(value: Any) -> str:
    allowed = (
        "must be a GPU name as the inventory writes it, such as 'RTX 4090' or 'A100 80GB' "
        "(letters, digits, spaces, '.', '_', '-')"
    )
    name = " ".join(_text("a GPU name", "'RTX 4090'")(value).split())
    if not _GPU_RE.fullmatch(name):
        raise _invalid(f"{allowed}; got {value!r}")
    return name


def _provider(value: Any) -> str:
    raw = _text("a provider name", "'vastai'")(value)
    name = normalize_provider(raw)
    if name not in KNOWN_PROVIDERS:
        raise _invalid(
            f"unknown provider {raw!r}{_did_you_mean(name, KNOWN_PROVIDERS)}; "
            f"known providers: {', '.join(KNOWN_PROVIDERS)}"
        )
    return name


def _model(value: Any) -> str:
    name = _text("an Ollama model name", "'qwen2:7b'")(value).strip()
    if len(name) > 200 or not _MODEL_RE.fullmatch(name):
        raise _invalid(
            f"not a valid Ollama model name: {value!r}; write NAME or NAME:TAG such as "
            "'qwen2:7b' (letters, digits, '.', '_', '-', and '/' for a namespace)"
        )
    return name


def _prompts(value: Any) -> tuple[str, ...]:
    allowed = "must be a non-empty list of non-empty strings"
    if not isinstance(value, (list, tuple)) or not value:
        raise _invalid(f"{allowed}; got {_kind(value)}")
    for i, prompt in enumerate(value):
        if not isinstance(prompt, str) or not prompt.strip():
            raise _invalid(f"{allowed}; item {i} is {_kind(prompt)}")
    return tuple(value)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Seconds = Annotated[float, BeforeValidator(_seconds)]
GpuName = Annotated[str, BeforeValidator(_gpu)]
ProviderName = Annotated[str, BeforeValidator(_provider)]
ModelName = Annotated[str, BeforeValidator(_model)]
Prompts = Annotated[tuple[str, ...], BeforeValidator(_prompts)]
MaxTokens = Annotated[int, _whole(1, 131072)]
Warmup = Annotated[int, _whole(0, 1000)]
CheckpointEvery = Annotated[int, _whole(1, 1_000_000)]
Price = Annotated[float, BeforeValidator(_price)]


# ---------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    """Frozen, and an unknown key is an error that lists the allowed keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    hint = _did_you_mean(str(key), allowed)
                    message = f"unknown key{hint}; allowed keys: {', '.join(allowed)}"
                    raise PydanticCustomError(
                        "unknown_key", "{message}", {"key": str(key), "message": message}
                    )
        return data


class Workload(_Strict):
    """What one cell's benchmark does; the defaults are seed 000's."""

    duration: Seconds = 300.0
    max_tokens: MaxTokens = 256
    warmup_requests: Warmup = 1
    progress_interval: Seconds = 60.0
    checkpoint_every: CheckpointEvery = 10
    prompts: Prompts = SEED_PROMPTS

    @property
    def duration_minutes(self) -> float:
        """The duration as BenchmarkResult's ``test_config.duration_minutes``."""
        return self.duration / 60


class WorkloadOverride(_Strict):
    """A row's ``workload:``: only the keys it sets replace the file's."""

    duration: Seconds | None = None
    max_tokens: MaxTokens | None = None
    warmup_requests: Warmup | None = None
    progress_interval: Seconds | None = None
    checkpoint_every: CheckpointEvery | None = None
    prompts: Prompts | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        if value is None:
            raise _invalid("must not be null; leave the key out to use the file's value")
        return value


class OfferSpec(_Strict):
    """``offer:`` in the file or in a row: constraints on the offer a cell rents."""

    max_price: Price | None = None
    min_availability_confidence: dict[str, float] | None = None

    @field_validator("min_availability_confidence", mode="before")
    @classmethod
    def _bars(cls, value: Any) -> dict[str, float]:
        return _confidences(value)


class OfferConstraints(_Strict):
    """One cell's offer constraints, resolved for its provider."""

    max_price: float | None = None
    min_availability_confidence: float = DEFAULT_MIN_AVAILABILITY_CONFIDENCE


class RuntimeSpec(_Strict):
    """``runtime:``: how to set the model server up on an instance."""

    ollama_install: str | None = None

    @field_validator("ollama_install", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        text = _text("a shell command", "'curl -fsSL https://ollama.com/install.sh | sh'")(value)
        if not text.strip() or "\0" in text:
            raise _invalid("must be a non-empty shell command without NUL characters")
        return text.strip()


class ModelSpec(_Strict):
    """``models: {NAME: {...}}``: per-model overrides."""

    vram_gb: Annotated[int, _whole(1, 4096)]


class RowSpec(_Strict):
    """One row of ``matrix:``: a GPU, its providers and its models."""

    gpu: GpuName
    provider: ProviderName | None = None
    providers: list[ProviderName] | None = None
    model: ModelName | None = None
    models: list[ModelName] | None = None
    workload: WorkloadOverride | None = None
    offer: OfferSpec | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> RowSpec:
        for one, many in (("provider", "providers"), ("model", "models")):
            given = getattr(self, one) is not None, getattr(self, many) is not None
            if all(given):
                raise _invalid(f"give either `{one}` or `{many}`, not both")
            if not any(given):
                raise _invalid(f"needs `{one}: ...` or `{many}: [...]`")
            if getattr(self, many) == []:
                raise _invalid(f"`{many}` is empty; list at least one")
        return self

    def provider_entries(self) -> list[tuple[str, str]]:
        """``(field path suffix, provider)`` for each provider of the row."""
        if self.provider is not None:
            return [("provider", self.provider)]
        return [(f"providers[{i}]", p) for i, p in enumerate(self.providers or [])]

    def model_entries(self) -> list[tuple[str, str]]:
        """``(field path suffix, model)`` for each model of the row."""
        if self.model is not None:
            return [("model", self.model)]
        return [(f"models[{i}]", m) for i, m in enumerate(self.models or [])]


class MatrixSpec(_Strict):
    """A matrix file as written (see ``docs/matrix.md``)."""

    name: str | None = None
    description: str | None = None
    workload: Workload = Workload()
    offer: OfferSpec = OfferSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    models: dict[str, ModelSpec] = {}
    matrix: list[RowSpec]

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise _invalid(
                f"must be letters, digits, '.', '_', '-' (such as 'seed'); got {_kind(value)}"
            )
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _description(cls, value: Any) -> Any:
        return _text("text", "'RTX cards for 7-32B models'")(value)

    @field_validator("models", mode="before")
    @classmethod
    def _model_keys(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            seen: dict[str, str] = {}
            for key in value:
                ref = model_ref(_model(key)).lower()
                if ref in seen:
                    raise _invalid(f"{key!r} and {seen[ref]!r} name the same model")
                seen[ref] = key
        return value

    @field_validator("matrix")
    @classmethod
    def _not_empty(cls, rows: list[RowSpec]) -> list[RowSpec]:
        if not rows:
            raise _invalid("the matrix has no rows; add at least one, such as "
                           "`- {gpu: RTX 4090, provider: vastai, model: qwen2:7b}`")
        return rows


class Matrix(BaseModel):
    """A validated matrix file: its defaults and rows, ready for :func:`expand`."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    source: str
    workload: Workload
    offer: OfferSpec
    ollama_install: str | None = None
    vram_overrides: dict[str, int] = {}
    rows: tuple[RowSpec, ...]
    row_lines: tuple[int | None, ...] = ()


class Cell(BaseModel):
    """One test: a GPU, a provider, a model, and how to benchmark it."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    gpu: str
    provider: str
    model: str
    model_ref: str
    workload: Workload
    offer: OfferConstraints
    vram_gb: int
    ollama_install: str | None = None
    matrix_name: str
    source: str
    row: int

    @property
    def cell_id(self) -> str:
        """``RTX_4090-vastai-qwen2:7b``: GPU (spaces as ``_``), provider, model as written."""
        return cell_id(self.gpu, self.provider, self.model)

    @property
    def gpu_compact(self) -> str:
        """The GPU name without spaces: ``RTX4090``."""
        return re.sub(r"[\s_-]+", "", self.gpu)

    @property
    def reuse_group(self) -> str:
        """Cells in one group can share a rented session: ``RTX_4090-vastai``."""
        return f"{_id_part(self.gpu)}-{self.provider}"

    @property
    def keywords(self) -> frozenset[str]:
        """Extra ``-k`` names: ``RTX4090``, the model's full reference and its family."""
        return frozenset({self.gpu_compact, self.model_ref, _split_tag(self.model_ref)[0]})


def _id_part(text: str) -> str:
    return re.sub(r"[\s/]+", "_", text.strip())


def cell_id(gpu: str, provider: str, model: str) -> str:
    """The test id of a cell: ``{GPU with _ for spaces}-{provider}-{model}``."""
    return f"{_id_part(gpu)}-{normalize_provider(provider)}-{_id_part(model)}"


# ------------------------------------------------------------------- loading, errors


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raises :class:`MatrixError` for any problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(source, "", f"cannot read the file: {exc}") from None
    return parse_matrix(text, source)


def load_cells(path: str | Path) -> list[Cell]:
    """``expand(load_matrix(path))``."""
    return expand(load_matrix(path))


def parse_matrix(text: str, source: str) -> Matrix:
    """Validate matrix YAML ``text``; ``source`` names it in errors and in cells."""
    root, data = _parse_yaml(text, source)
    return matrix_from_data(data, source, root=root)


def matrix_from_data(data: Any, source: str, *, root: yaml.Node | None = None) -> Matrix:
    """Validate an already-parsed matrix (``root`` only adds line numbers to errors)."""
    if data is None:
        raise MatrixError(
            source, "", "the file is empty; a matrix needs at least `matrix:` with one row"
        )
    if not isinstance(data, Mapping):
        raise MatrixError(
            source,
            "",
            f"the top level must be a mapping with a `matrix:` list of rows; got {_kind(data)}",
        )
    try:
        spec = MatrixSpec.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, source, root) from None
    stem = Path(source).stem
    matrix = Matrix(
        name=spec.name or re.sub(r"^gpubench[_-]", "", stem) or stem,
        description=spec.description or "",
        source=source,
        workload=spec.workload,
        offer=spec.offer,
        ollama_install=spec.runtime.ollama_install,
        vram_overrides={model_ref(k).lower(): v.vram_gb for k, v in spec.models.items()},
        rows=tuple(spec.matrix),
        row_lines=tuple(_line(root, ("matrix", i)) for i in range(len(spec.matrix))),
    )
    expand(matrix)  # a Matrix that exists expands: duplicates and VRAM are checked here
    return matrix


def expand(matrix: Matrix) -> list[Cell]:
    """One :class:`Cell` per (row, provider, model), in file order."""
    cells: list[Cell] = []
    seen: dict[tuple[str, str, str], int] = {}
    ids: dict[str, int] = {}
    for r, row in enumerate(matrix.rows):
        where = _at_line(_row_line(matrix, r))
        workload = matrix.workload
        if row.workload is not None:
            workload = workload.model_copy(update=row.workload.model_dump(exclude_unset=True))
        row_offer = row.offer or OfferSpec()
        fields = row_offer.model_fields_set
        max_price = row_offer.max_price if "max_price" in fields else matrix.offer.max_price
        bars = {**(matrix.offer.min_availability_confidence or {}),
                **(row_offer.min_availability_confidence or {})}
        for _, provider in row.provider_entries():
            offer = OfferConstraints(
                max_price=max_price,
                min_availability_confidence=bars.get(
                    provider, bars.get("default", DEFAULT_MIN_AVAILABILITY_CONFIDENCE)),
            )
            for field, model in row.model_entries():
                vram = model_vram_gb(model, matrix.vram_overrides)
                if vram is None:
                    raise MatrixError(matrix.source, f"matrix[{r}].{field}", (
                        f"cannot tell how much VRAM {model!r} needs: it is not in the seed table "
                        f"and its tag names no size such as '7b'; add "
                        f"`models: {{{model}: {{vram_gb: N}}}}` to the file{where}"))
                cell = Cell(gpu=row.gpu, provider=provider, model=model, model_ref=model_ref(model),
                            workload=workload, offer=offer, vram_gb=vram,
                            ollama_install=matrix.ollama_install, matrix_name=matrix.name,
                            source=matrix.source, row=r)
                key = (normalize_gpu(row.gpu), provider, cell.model_ref.lower())
                first = seen.get(key, ids.get(cell.cell_id.lower()))
                if first is not None:
                    raise MatrixError(matrix.source, f"matrix[{r}]", (
                        f"duplicate cell {cell.cell_id} ({row.gpu} / {provider} / {model}), "
                        f"already in matrix[{first}]{_at_line(_row_line(matrix, first))}; "
                        f"a GPU, provider and model may appear once in a file{where}"))
                seen[key] = ids[cell.cell_id.lower()] = r
                cells.append(cell)
    return cells


class _Loader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: the base class reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        return root, None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        problem = f"{context}: {problem}" if context else problem
        field = f"line {mark.line + 1}" if mark else ""
        column = f" (column {mark.column + 1})" if mark else ""
        raise MatrixError(source, field, f"invalid YAML: {problem}{column}") from None
    finally:
        loader.dispose()


def _translate(exc: ValidationError, source: str, root: yaml.Node | None) -> MatrixError:
    """pydantic's errors -> one line: the first error's path and message, and a count."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    kind, ctx = first["type"], first.get("ctx") or {}
    if kind == "unknown_key":
        loc += (ctx["key"],)
    if kind in ("gpubench", "unknown_key"):
        message = ctx["message"]
    elif kind == "missing":
        message = "required key is missing"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        message = f"must be a mapping (key: value); got {_kind(first['input'])}"
    elif kind == "list_type":
        message = f"must be a list; got {_kind(first['input'])}"
    else:
        message = first["msg"]
    message += _at_line(_line(root, loc))
    more = len(errors) - 1
    if more:
        message += f"; and {more} more problem{'s' if more > 1 else ''}"
    return MatrixError(source, _dotted(loc), message)


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out


def _line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the node at ``loc`` (or of its nearest ancestor)."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if getattr(k, "value", None) == str(part)]
            if not match:
                break
            line, node = match[0][0].start_mark.line + 1, match[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _row_line(matrix: Matrix, row: int) -> int | None:
    return matrix.row_lines[row] if row < len(matrix.row_lines) else None


def _at_line(line: int | None) -> str:
    return f" (line {line})" if line else ""
