"""The sandbox's world: offers, GPUs, models, token rates and timings, from YAML.

The shipped ``catalog.yaml`` mirrors the real market the GPU Shopper sees (prices,
locations, the way each provider reports VRAM and confidence) and the rates of its
public benchmark report. Users can pass their own file; a file that does not
validate raises :class:`CatalogError`, whose text is one line naming the file and
the field.

Two numbers are *computed* here rather than written in the file, because the real
server computes them and a hand-written value could drift from its rules:

- ``vram_gb``: Vast.ai reports ``gpu_ram`` MiB // 1024 (an RTX 4090 shows 23),
  TensorDock parses the GB figure out of the GPU's display name (24).
- ``availability_confidence``: Vast.ai ``0.6 x reliability + 0.4 x bid safety``
  (bid safety 1 for on-demand, ``min_bid / price`` for interruptible offers);
  TensorDock a flat 0.3.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator

from ..errors import UsageProblem
from ..runtime_facts import is_runtime
from ..runtime_facts import unknown as unknown_runtime
from . import DEFAULT_CATALOG  # noqa: F401 - re-exported

TENSORDOCK_CONFIDENCE = 0.3


class CatalogError(UsageProblem):
    """A catalog file that cannot be used: ``file: field: message`` on one line."""

    def __init__(self, path: str | Path, field: str, message: str) -> None:
        self.path = str(path)
        self.field = field
        text = f"{path}: {field}: {message}" if field else f"{path}: {message}"
        super().__init__(" ".join(text.split()))


class _Entry(BaseModel):
    # Unknown keys are refused so that a misspelt field fails loudly instead of
    # silently falling back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostSpec(_Entry):
    """The machine around a GPU, as the benchmark's hardware section reports it."""

    cpu_model: str
    cpu_cores: int = Field(gt=0)
    ram_gib: int = Field(gt=0)


class DefaultRate(_Entry):
    """How to derive a rate the catalog does not list for this GPU.

    Decoding is memory-bandwidth bound, so tokens/s ~ effective GB/s divided by the
    model's size; small models hit a ceiling set by per-token overheads instead.
    """

    decode_gb_per_s: float = Field(gt=0)
    max_tokens_per_second: float = Field(gt=0)
    ttft_ms_per_gb: float = Field(ge=0)


def _check_runtime_keys(value: dict[str, float]) -> dict[str, float]:
    """A per-runtime mapping names only runtimes the sandbox imitates (a misspelt one fails loudly)."""
    wrong = sorted(str(key) for key in value if not is_runtime(str(key)))
    if wrong:
        raise ValueError(unknown_runtime(wrong[0]))
    return value


def _per_runtime(value: object) -> float | dict[str, float]:
    """A positive number, or ``{runtime: positive number}``; anything else in one clear sentence."""
    def positive(number: object, where: str) -> float:
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
            raise ValueError(f"{where}must be a number above 0, not {number!r}")
        return float(number)

    if isinstance(value, dict):
        return _check_runtime_keys({key: positive(number, f"{key}: ") for key, number in value.items()})
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return positive(value, "")
    raise ValueError(f"expected a number or a mapping {{runtime: number}}, not {value!r}")


#: A number for every runtime, or ``{runtime: number}`` for some (the others fall through).
PerRuntime = Annotated[float | dict[str, float], PlainValidator(_per_runtime)]


def for_runtime(value: float | dict[str, float] | None, runtime: str) -> float | None:
    """``value`` for ``runtime``: the number itself, the mapping's entry, or None."""
    if isinstance(value, dict):
        return value.get(runtime)
    return value


class Batching(_Entry):
    """How parallel requests share a GPU (the stand-ins' batching law).

    A decode step for ``b`` sequences takes ``t_w + b * t_s``, so each stream runs
    at ``r1 / (1 + (b - 1) / F)`` and all of them together approach ``F * r1``:
    ``F`` is the ceiling factor, the aggregate ceiling over the single-stream rate.
    ``ceiling_factor`` is Ollama's (and any runtime's ``runtimes`` leaves out);
    ``runtimes`` gives the others theirs.
    """

    ceiling_factor: float = Field(default=2.0, gt=0)
    runtimes: Annotated[dict[str, Annotated[float, Field(gt=0)]], AfterValidator(_check_runtime_keys)] = Field(
        default_factory=dict)


class GpuClocks(_Entry):
    """A card's highest clocks (MHz), as system detection reports them.

    ``sm_max_mhz`` is the datasheet boost clock (real cards' ``max_clocks`` often read
    higher: an RTX 4090 reports 3105); ``mem_max_mhz`` is what ``nvidia-smi`` shows as the
    memory clock, half the data rate of GDDR (21 Gbps GDDR6X: 10501).
    """

    sm_max_mhz: int = Field(gt=0)
    mem_max_mhz: int = Field(gt=0)


class MicrobenchRates(_Entry):
    """What the stand-in ``torch`` achieves on this GPU (``sandbox/torch_standin.py``)."""

    memory_gb_per_s: float = Field(gt=0)
    #: Dense matmul TFLOPS (INT8: TOPS) by precision; a precision left out is one the card cannot run.
    tflops: dict[Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"], float] = Field(default_factory=dict)


class GpuSpec(_Entry):
    """One GPU type: what ``nvidia-smi`` prints and how fast it decodes by default."""

    name: str
    memory_mib: int = Field(gt=0)
    nominal_gb: int = Field(gt=0)
    driver_version: str
    cuda_version: str
    power_limit_w: int = Field(gt=0)
    compute_capability: str
    #: None: the catalog does not say (nvidia-smi and NVML then answer N/A).
    clocks: GpuClocks | None = None
    host: HostSpec
    default_rate: DefaultRate
    #: The GPU microbenchmarks' figures on this card; None: the stand-in torch sees no CUDA device.
    microbench: MicrobenchRates | None = None
    #: This card's batching ceiling factor, when it differs from the catalog's: one for every
    #: runtime, or ``{runtime: F}`` for some.
    batch_ceiling_factor: PerRuntime | None = None


class ModelSpec(_Entry):
    """One model of the emulated Ollama registry."""

    size_bytes: int = Field(gt=0)
    family: str
    parameter_size: str
    quantization_level: str
    digest: str = ""
    vram_gb: float = Field(gt=0)
    load_seconds: float = Field(ge=0)
    #: Thinking-capable (Ollama's ``thinking`` capability): reasons first unless ``think: false``.
    thinking: bool = False
    #: The share of the built-in accuracy problems the emulated model answers right (docs/sandbox.md).
    accuracy: float = Field(default=1.0, ge=0, le=1)


class RateSpec(_Entry):
    """A measured rate for (GPU, model), optionally for one provider only."""

    gpu: str
    model: str
    provider: str | None = None
    tokens_per_second: float = Field(gt=0)
    ttft_ms: float = Field(ge=0)
    #: Aggregate tokens/s of many parallel requests (the batching ceiling), when measured: one
    #: for every runtime, or ``{runtime: tokens/s}`` for some.
    batch_ceiling_tokens_per_second: PerRuntime | None = None
    source: str = ""


class TemplateSpec(_Entry):
    """A provider template (Vast.ai image) that ships Ollama."""

    hash_id: str
    name: str
    image: str = ""
    ollama_preinstalled: bool = True
    ollama_autostart: bool = False


class ProviderTimings(_Entry):
    """One provider's delays (emulated seconds, multiplied by the time scale) and disk."""

    provisioning_seconds: float = Field(ge=0)
    pull_mb_per_s: float = Field(gt=0)
    cache_ttl_seconds: float = Field(default=60.0, ge=0)
    #: Disk (GB) of an instance whose session asked for none (``disk_gb`` 0 or absent).
    disk_gb: int = Field(default=50, gt=0)
    #: The provider gives every instance ``disk_gb``, whatever the session asked for.
    disk_gb_fixed: bool = False


class Timings(_Entry):
    """Emulated seconds of the server's own clocks (multiplied by the time scale)."""

    ollama_install_seconds: float = Field(default=30.0, ge=0)
    destroy_seconds: float = Field(default=5.0, ge=0)
    ssh_verify_timeout_seconds: float = Field(default=480.0, ge=0)
    ssh_check_interval_seconds: float = Field(default=15.0, ge=0)
    #: Entrypoint mode: how long the server polls the image's ``/health`` (``DefaultAPIVerifyTimeout``).
    api_verify_timeout_seconds: float = Field(default=600.0, ge=0)
    api_check_interval_seconds: float = Field(default=15.0, ge=0)
    lifecycle_check_seconds: float = Field(default=60.0, ge=0)


class OfferSpec(_Entry):
    """One inventory offer, as written in the catalog."""

    id: str
    provider: str
    provider_id: str
    gpu_type: str
    gpu_count: int = Field(default=1, gt=0)
    price_per_hour: float = Field(gt=0)
    location: str
    reliability: float = Field(ge=0, le=1)
    available: bool = True
    machine_id: str = ""
    interruptible: bool = False
    min_bid: float = Field(default=0.0, ge=0)
    cuda_version: float = Field(default=0.0, ge=0)
    ollama_preinstalled: bool = False
    provisioning_seconds: float | None = Field(default=None, ge=0)
    pull_mb_per_s: float | None = Field(default=None, gt=0)


class Catalog(_Entry):
    """The whole catalog; cross-references are checked after the fields."""

    ollama_version: str
    offload_penalty: float = Field(default=0.12, gt=0, le=1)
    batching: Batching = Batching()
    #: Disk (GB) the image and the operating system use on every instance.
    system_disk_gb: float = Field(default=15.0, ge=0)
    timings: Timings = Timings()
    providers: dict[str, ProviderTimings]
    gpus: dict[str, GpuSpec]
    models: dict[str, ModelSpec]
    rates: list[RateSpec] = Field(default_factory=list)
    templates: list[TemplateSpec] = Field(default_factory=list)
    #: Container images' sizes (GB) by repository, ``default`` for any other image: the ``docker``
    #: stand-in's pulls and an entrypoint image's pull before its server starts, both at the
    #: instance's pull rate. A heavy one (an inference server's) pulls for minutes.
    docker_images: dict[str, float] = Field(default_factory=lambda: {"default": 0.5})
    offers: list[OfferSpec]

    @model_validator(mode="after")
    def _check_references(self) -> Catalog:
        seen: set[str] = set()
        for index, offer in enumerate(self.offers):
            where = f"offers.{index}"
            if offer.id in seen:
                raise _FieldError(f"{where}.id", f"duplicate offer id {offer.id!r}")
            seen.add(offer.id)
            if offer.gpu_type not in self.gpus:
                raise _FieldError(f"{where}.gpu_type", f"unknown GPU type {offer.gpu_type!r}")
            if offer.provider not in self.providers:
                raise _FieldError(f"{where}.provider", f"unknown provider {offer.provider!r}")
        for index, rate in enumerate(self.rates):
            if rate.gpu not in self.gpus:
                raise _FieldError(f"rates.{index}.gpu", f"unknown GPU type {rate.gpu!r}")
            if rate.model not in self.models:
                raise _FieldError(f"rates.{index}.model", f"unknown model {rate.model!r}")
        return self

    # -- lookups ---------------------------------------------------------------

    def offer(self, offer_id: str) -> OfferSpec | None:
        """The offer with this id, available or not."""
        return next((o for o in self.offers if o.id == offer_id), None)

    def template(self, hash_id: str) -> TemplateSpec | None:
        """The template with this hash id, if the catalog knows it."""
        return next((t for t in self.templates if t.hash_id == hash_id), None)

    def model_digest(self, name: str) -> str:
        """The model's digest; a stable made-up one when the catalog gives none."""
        spec = self.models[name]
        if spec.digest:
            return spec.digest
        return "sha256:" + hashlib.sha256(f"gpubench-sandbox/{name}".encode()).hexdigest()

    def rate(self, gpu_type: str, provider: str, model: str) -> tuple[float, float, str]:
        """``(tokens_per_second, ttft_ms, origin)`` for a model on one card.

        A provider-specific measured rate wins over a generic one; without either,
        the rate is derived from the GPU's ``default_rate``, and a model that does
        not fit in the card's memory is slowed by ``offload_penalty`` (Ollama then
        runs some layers on the CPU, as the report's 24 GB cards show on 32B).
        """
        generic = None
        for rate in self.rates:
            if rate.gpu == gpu_type and rate.model == model:
                if rate.provider == provider:
                    return rate.tokens_per_second, rate.ttft_ms, "measured"
                if rate.provider is None:
                    generic = rate
        if generic is not None:
            return generic.tokens_per_second, generic.ttft_ms, "measured"
        gpu, spec = self.gpus[gpu_type], self.models[model]
        size_gb = spec.size_bytes / 1e9
        tps = min(gpu.default_rate.max_tokens_per_second, gpu.default_rate.decode_gb_per_s / size_gb)
        ttft = 15.0 + gpu.default_rate.ttft_ms_per_gb * size_gb
        if spec.vram_gb > gpu.memory_mib / 1024:
            tps *= self.offload_penalty
            ttft /= self.offload_penalty
        return round(tps, 1), round(ttft, 1), "derived"

    def batch_ceiling(self, gpu_type: str, provider: str, model: str, runtime: str = "ollama") -> float:
        """Aggregate tokens/s that parallel requests for ``model`` approach on one card under ``runtime``.

        The first that is set for ``runtime`` wins: a rate row's measured
        ``batch_ceiling_tokens_per_second`` (the provider's row first, as in :meth:`rate`);
        else the single-stream rate times the card's ``batch_ceiling_factor``, else times
        the catalog's ``batching`` factor for the runtime.
        """
        generic = None
        for row in self.rates:
            ceiling = for_runtime(row.batch_ceiling_tokens_per_second, runtime)
            if row.gpu == gpu_type and row.model == model and ceiling:
                if row.provider == provider:
                    return ceiling
                if row.provider is None:
                    generic = ceiling
        if generic is not None:
            return generic
        tps = self.rate(gpu_type, provider, model)[0]
        return round(tps * self.ceiling_factor(gpu_type, runtime), 1)

    def ceiling_factor(self, gpu_type: str, runtime: str = "ollama") -> float:
        """``F`` of ``runtime`` on this card when no rate row measures it: the card's, else the catalog's."""
        factor = for_runtime(self.gpus[gpu_type].batch_ceiling_factor, runtime)
        if factor is None:
            factor = self.batching.runtimes.get(runtime)
        return factor or self.batching.ceiling_factor

    def provisioning_seconds(self, offer: OfferSpec) -> float:
        """Emulated seconds from create to a booted instance."""
        if offer.provisioning_seconds is not None:
            return offer.provisioning_seconds
        return self.providers[offer.provider].provisioning_seconds

    def disk_gb(self, offer: OfferSpec, requested: int = 0) -> int:
        """The disk an instance of this offer gets when its session asked for ``requested`` GB."""
        provider = self.providers[offer.provider]
        if requested > 0 and not provider.disk_gb_fixed:
            return requested
        return provider.disk_gb

    def pull_mb_per_s(self, offer: OfferSpec) -> float:
        """Registry bandwidth seen from this offer's host."""
        return offer.pull_mb_per_s or self.providers[offer.provider].pull_mb_per_s


class _FieldError(ValueError):
    """Raised inside validators to name the exact field of a cross-reference."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# -- what the API shows -------------------------------------------------------


def offer_vram_gb(catalog: Catalog, offer: OfferSpec) -> int:
    """``vram_gb`` as the real server reports it for this provider."""
    gpu = catalog.gpus[offer.gpu_type]
    if offer.provider == "vastai":
        return gpu.memory_mib // 1024
    return gpu.nominal_gb


def availability_confidence(offer: OfferSpec) -> float:
    """The server's own confidence that the offer can really be rented."""
    if offer.provider == "tensordock":
        return TENSORDOCK_CONFIDENCE
    bid_safety = 1.0
    if offer.interruptible:
        bid_safety = min(1.0, offer.min_bid / offer.price_per_hour) if offer.price_per_hour else 0.0
    return round(0.6 * offer.reliability + 0.4 * bid_safety, 6)


def offer_json(catalog: Catalog, offer: OfferSpec, fetched_at: datetime) -> dict[str, Any]:
    """The offer in the server's JSON shape (Go ``omitempty`` fields left out when zero)."""
    body: dict[str, Any] = {
        "id": offer.id,
        "provider": offer.provider,
        "provider_id": offer.provider_id,
        "gpu_type": offer.gpu_type,
        "gpu_count": offer.gpu_count,
        "vram_gb": offer_vram_gb(catalog, offer),
        "price_per_hour": offer.price_per_hour,
        "location": offer.location,
        "reliability": offer.reliability,
        "available": offer.available,
        "max_duration_hours": 0,
        "fetched_at": format_time(fetched_at),
        "availability_confidence": availability_confidence(offer),
    }
    if offer.cuda_version:
        body["cuda_version"] = offer.cuda_version
    if offer.machine_id:
        body["machine_id"] = offer.machine_id
    if offer.interruptible:
        body["interruptible"] = True
    if offer.min_bid:
        body["min_bid"] = offer.min_bid
    return body


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, as Go marshals a UTC ``time.Time``."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- loading ------------------------------------------------------------------


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog file (the shipped one when ``path`` is None)."""
    source = Path(path) if path is not None else DEFAULT_CATALOG
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(source, "", f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise CatalogError(source, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise CatalogError(source, "", "expected a mapping at the top level")
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        raise _catalog_error(source, exc) from None


def _catalog_error(source: Path, exc: ValidationError) -> CatalogError:
    # A misspelt key shows up twice (unknown key, missing key): name the typo.
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    context = first.get("ctx") or {}
    inner = context.get("error")
    if isinstance(inner, _FieldError):
        return CatalogError(source, inner.field, inner.message)
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")  # our validators' own sentences
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    return CatalogError(source, field, message)
