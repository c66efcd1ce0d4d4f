"""Matrix files: the schema, their expansion into cells, filters and stable test ids.

A matrix file (YAML) lists rows of GPU x providers x models, with workload, offer,
SLO and threshold defaults that rows may override. :func:`load_matrix` validates a
file into a :class:`Matrix`; :func:`expand` turns it into one frozen :class:`Cell`
per (row, provider, model, load point: a concurrency or a rate), in file order.
Every problem in a file is a :class:`~pytest_gpubench.errors.MatrixError` naming
the file, the field in dotted form (``matrix[2].workload.duration``) and what is
allowed, on one line.

The filters (:func:`gpu_matches`, :func:`provider_matches`, :func:`model_matches`,
:func:`cell_selected`) are what ``--gpubench-gpu``, ``--gpubench-provider`` and
``--gpubench-model`` use (through :func:`pytest_gpubench.matrix.selection.split_by_filters`).
A row's ``microbench:`` (:class:`MicrobenchSpec`, a cell that runs no model) is defined
first, as the row's schema names it; the command line's overrides of a cell
(``--gpubench-duration`` and friends: :func:`apply_overrides`) come last. The reference for
users is ``docs/matrix.md``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from ..errors import MatrixError
from ..settings import MIN_SANDBOX_INTERVAL, Settings
from .fields import (  # noqa: F401 - re-exported
    DEFAULT_RUNTIME,
    KNOWN_PROVIDERS,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    NAME_RE,
    CheckpointEvery,
    GPU_COUNTS,
    GpuCount,
    GpuName,
    MaxTokens,
    ModelName,
    Price,
    ProviderName,
    Runs,
    RuntimeName,
    Seconds,
    StrictModel,
    Warmup,
    confidences,
    did_you_mean,
    invalid,
    model_name,
    number_text,
    runtime_name,
    text_field,
    whole,
)
from .worker_presets import load_presets
from .workload import (  # noqa: F401 - re-exported
    PROMPT_SETS,
    QUALITY_PROMPTS,
    SEED_PROMPTS,
    Prompt,
    Prompts,
    Workload,
    WorkloadOverride,
    trace_conflict,
    load_conflict,
    prompt_set_name,
)
from .selection import (  # noqa: F401 - re-exported: the matrix module is where users look
    MODEL_VRAM_GB,
    axes_suffix,
    cell_id,
    cell_id_base,
    cell_keywords,
    cell_selected,
    compact_gpu,
    gpu_matches,
    gpus_label,
    gpus_suffix,
    id_part,
    infer_parameters_b,
    infer_vram_gb,
    model_matches,
    model_ref,
    model_vram_gb,
    normalize_gpu,
    normalize_provider,
    provider_matches,
    reuse_group_name,
    select_cells,
    split_tag,
)
from .launch import LaunchSpec, launch_problem, resolved
from .fields import (ENDPOINT_CLOUD, ENDPOINT_KEYS, ENDPOINT_PROVIDER, ENDPOINT_RUNTIME, KEPT_MACHINES, EndpointPrice,
                     EndpointSpec, EndpointUrl, EnvName, hosts_file)
from .fields import ca_file as endpoint_ca_file
from .prototype import Prototype
from .workload import SWEEP, SweepSpec, sweep_problem
from .thresholds import Slo, Thresholds, merged
from .yaml_errors import at_line, describe, node_line, parse_yaml, read_text, translate


# --------------------------------------------------------------------------------------------------
# ``microbench:``: a row's GPU microbenchmarks, a cell that runs no model.
#
# A row may say ``microbench: [memory_bandwidth, matmul]`` (with or without ``models:``):
# one more cell per GPU x provider, ``RTX_4090-vastai-microbench``, that measures the
# GPU itself with torch on the instance (docs/hardware.md, "GPU microbenchmarks"). The
# mapping form sets the optional settings:
#
# .. code-block:: yaml
#
#     microbench: {kinds: [memory_bandwidth, matmul], runs: 5, warmup: 2,
#                  memory_mib: 1024, matmul_size: 8192, precisions: [fp16, bf16]}


#: What a microbenchmark cell can measure.
KINDS = ("memory_bandwidth", "matmul")
#: The matmul precisions, in the order reports show them.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
#: The model name and id part of a microbenchmark cell.
MICROBENCH_MODEL = "microbench"


def _names(allowed: tuple[str, ...], what: str):
    def check(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise invalid(f"must be a list of {what} from {', '.join(allowed)}; got {describe(value)}")
        names = []
        for item in value:
            if not isinstance(item, str) or item.strip().lower() not in allowed:
                hint = did_you_mean(item, allowed) if isinstance(item, str) else ""
                raise invalid(f"unknown {what[:-1]} {describe(item)}{hint}; allowed: {', '.join(allowed)}")
            if item.strip().lower() not in names:
                names.append(item.strip().lower())
        return tuple(name for name in allowed if name in names)  # the canonical order

    return BeforeValidator(check)


def _matmul_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 256 <= value <= 32768 or value % 16:
        raise invalid(f"must be the side of the square matrices, a multiple of 16 from 256 to 32768 "
                      f"(such as 8192); got {describe(value)}")
    return value


class MicrobenchSpec(StrictModel):
    """``microbench:`` as written in a row: which kinds, and how each is measured."""

    kinds: Annotated[tuple[str, ...], _names(KINDS, "kinds")] = KINDS
    #: Timed runs of each figure (after the warm-up), summarised by ``measure/results.py``.
    runs: Annotated[int, whole(2, 100)] = 5
    #: Untimed runs first (clocks up, kernels chosen).
    warmup: Annotated[int, whole(0, 100)] = 2
    #: The device-to-device copy's buffer, MiB (big enough to defeat the L2 cache).
    memory_mib: Annotated[int, whole(16, 65536)] = 1024
    #: The square matmul's side.
    matmul_size: Annotated[int, BeforeValidator(_matmul_size)] = 8192
    precisions: Annotated[tuple[str, ...], _names(PRECISIONS, "precisions")] = PRECISIONS

    @model_validator(mode="before")
    @classmethod
    def _list_alone(cls, value: Any) -> Any:
        if isinstance(value, (str, list, tuple)):
            return {"kinds": value}
        if not isinstance(value, (Mapping, MicrobenchSpec)):
            raise invalid(f"must be a list of kinds such as [{', '.join(KINDS)}], or a mapping such as "
                          f"{{kinds: [matmul], runs: 5}}; got {describe(value)}")
        return value


DEFAULT_MIN_AVAILABILITY_CONFIDENCE = 0.5
"""Seed 000's bar; TensorDock offers always report 0.3, so give it its own bar."""
DEFAULT_MAX_ATTEMPTS = 3
"""Offers a cell tries when provisioning fails (seed 001: "retry with different location")."""
DEFAULT_CLOUD = "shopper"
"""``cloud:``: the Provider a matrix rents through (``cloud/registry.py``); ``provider:`` is the marketplace."""


def seam_suffix(runtime: str = DEFAULT_RUNTIME, cloud: str = DEFAULT_CLOUD, *, entrypoint: bool = False) -> str:
    """The part of a cell id and of a reuse group that names a runtime and a cloud other
    than the defaults: ``""`` for ``ollama`` on ``shopper`` (ids and groups as they were
    before these seams existed), ``-runtime_vllm``, ``-cloud_moon``, or both in that order;
    ``-entrypoint`` after the runtime when GPU Shopper's image starts the server
    (``runtime.launch``), which is another measurement than the plugin starting it.

    Cells on another runtime or cloud are other cells (two rows differing only in
    ``runtime:`` are no duplicates) and never share a session with the defaults' cells.
    """
    runtime_part = f"-runtime_{id_part(runtime)}" if runtime != DEFAULT_RUNTIME else ""
    runtime_part += "-entrypoint" if entrypoint else ""
    # A running endpoint's cloud goes with its runtime: `-runtime_openai` says both.
    implied = cloud == DEFAULT_CLOUD or (cloud == ENDPOINT_CLOUD and runtime == ENDPOINT_RUNTIME)
    return runtime_part + ("" if implied else f"-cloud_{id_part(cloud)}")


_TEMPLATE_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
Reuse = Literal["group", "cell"]
"""``group``: cells of one GPU and provider share a rented session; ``cell``: one session each."""


# ---------------------------------------------------------------------------- schema


_Strict = StrictModel


class OfferSpec(_Strict):
    """``offer:`` in the file or in a row: constraints on the offer a cell rents."""

    max_price: Price | None = None
    min_availability_confidence: dict[str, float] | None = None
    max_attempts: Annotated[int, whole(1, 10)] | None = None
    template: str | None = None

    @field_validator("min_availability_confidence", mode="before")
    @classmethod
    def _bars(cls, value: Any) -> dict[str, float]:
        return confidences(value)

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> Any:
        if value is None:
            return None
        # Sent as template_hash_id; a Vast.ai hash id is hex, other providers' ids are similar.
        if not isinstance(value, str) or not _TEMPLATE_RE.fullmatch(value):
            raise invalid("must be a template hash id: 1-128 letters, digits, '-' or '_' "
                          f"(such as '9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6'); got {describe(value)}")
        return value


class OfferConstraints(_Strict):
    """One cell's offer constraints, resolved for its provider."""

    max_price: float | None = None
    min_availability_confidence: float = DEFAULT_MIN_AVAILABILITY_CONFIDENCE
    #: Offers to try, one session each, before the cell fails (failover).
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: A provider template (``template_hash_id``) the session is created from.
    template: str | None = None


class RuntimeSpec(_Strict):
    """``runtime:``: which model server serves the cells, and how to set it up on an instance.

    A name alone (``runtime: ollama``) is short for ``{name: ollama}``.
    """

    name: RuntimeName = DEFAULT_RUNTIME
    ollama_install: str | None = None
    #: Extra arguments of the server's launch command (``vllm serve MODEL --port P ARGS``), each one word.
    args: tuple[str, ...] = ()
    #: A fixed port for the server: one found running there with the cell's model is used;
    #: None: a free port picked on the instance (docs/runtimes.md).
    port: int | None = Field(default=None, ge=1, le=65535)
    #: The address the server the plugin starts listens on (``--host``, TGI's ``--hostname``,
    #: ``OLLAMA_HOST``); None: 127.0.0.1, the instance's loopback only (docs/runtimes.md).
    host: str | None = None
    #: The server's limit on requests batched at once (``{parallel}``: vLLM ``--max-num-seqs``, Ollama
    #: ``OLLAMA_NUM_PARALLEL`` ...); None: the default for the cell's load (:func:`batch_limit_of`).
    batch_limit: Annotated[int, whole(1, MAX_CONCURRENCY)] | None = None
    #: How GPU Shopper launches the instance (``mode: entrypoint``: its image serves the model; see launch.py).
    launch: LaunchSpec | None = None
    # A running endpoint (``name: openai``, matrix/fields.py): nothing is rented or started.
    endpoint: EndpointUrl | None = None
    api: Literal["chat", "completions"] | None = None
    api_key_env: EnvName | None = None
    price_per_hour: EndpointPrice | None = None
    ca_file: str | None = None
    #: ``runtime: worker``'s ``model_presets.yaml`` (seed 004), relative to the matrix file; checked here.
    presets: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_alone(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"name": runtime_name(value)}
        if not isinstance(value, (Mapping, RuntimeSpec)):
            raise invalid(f"must be a runtime name such as '{DEFAULT_RUNTIME}', or a mapping such as "
                          f"{{name: {DEFAULT_RUNTIME}, ollama_install: '...'}}; got {describe(value)}")
        return value

    @field_validator("ollama_install", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        text = text_field("a shell command", "'curl -fsSL https://ollama.com/install.sh | sh'")(value)
        if not text.strip() or "\0" in text:
            raise invalid("must be a non-empty shell command without NUL characters")
        return text.strip()

    @field_validator("host", mode="before")
    @classmethod
    def _host(cls, value: Any) -> Any:
        text = text_field("an IP address", "'0.0.0.0'")(value)
        try:
            return str(ipaddress.ip_address(text.strip()))
        except ValueError:
            raise invalid(f"must be an IP address to listen on, such as 127.0.0.1 (the default) or 0.0.0.0 "
                          f"(every interface); got {describe(value)}") from None

    @field_validator("presets", mode="before")
    @classmethod
    def _presets_file(cls, value: Any, info: ValidationInfo) -> Any:
        text = text_field("a presets file", "'model_presets.yaml'")(value)
        context = info.context if isinstance(info.context, Mapping) else {}
        path = Path(text) if Path(text).is_absolute() else Path(context.get("base_dir") or ".") / text
        try:
            load_presets(path)
        except MatrixError as exc:  # the presets file's own path and key: the message says it all
            raise invalid(str(exc)) from None
        return str(path)

    @field_validator("args", mode="before")
    @classmethod
    def _arguments(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(arg, str) and arg and arg.isprintable() and len(arg) <= 500 for arg in value):
            raise invalid("must be a list of launch arguments such as ['--max-model-len', '4096'], "
                          f"each one printable line; got {describe(value)}")
        return tuple(value)

    @field_validator("ca_file", mode="before")
    @classmethod
    def _ca_file(cls, value: Any, info: ValidationInfo) -> Any:
        return endpoint_ca_file(value, Path((info.context or {}).get("base_dir") or "."))

    @model_validator(mode="after")
    def _endpoint_goes_with_openai(self) -> RuntimeSpec:
        given = [key for key in ENDPOINT_KEYS if key in self.model_fields_set]
        if self.name != ENDPOINT_RUNTIME:
            if given:
                raise invalid(f"`{given[0]}` describes a running endpoint: it goes with `name: {ENDPOINT_RUNTIME}` "
                              f"in the same mapping")
            return self
        if self.endpoint is None:
            raise invalid(f"`name: {ENDPOINT_RUNTIME}` benchmarks a server that is already up: give its "
                          "`endpoint: URL` beside the name, such as {name: openai, endpoint: 'http://127.0.0.1:8000'}")
        if self.ollama_install is not None or self.args or self.batch_limit is not None:
            raise invalid(f"`name: {ENDPOINT_RUNTIME}` starts nothing: `ollama_install`, `args` and `batch_limit` "
                          "do not apply")
        return self

    def endpoint_spec(self) -> EndpointSpec | None:
        """The running endpoint this mapping describes, or None for a runtime the plugin starts."""
        if self.endpoint is None:
            return None
        return EndpointSpec(url=self.endpoint, api=self.api or "chat", api_key_env=self.api_key_env,
                            price_per_hour=self.price_per_hour or 0.0, ca_file=self.ca_file)


class ModelSpec(_Strict):
    """``models: {NAME: {...}}``: per-model overrides."""

    vram_gb: Annotated[int, whole(1, 4096)]


class RowSpec(_Strict):
    """One row of ``matrix:``: a GPU, its providers and its models."""

    gpu: GpuName
    provider: ProviderName | None = None
    providers: list[ProviderName] | None = None
    model: ModelName | None = None
    models: list[ModelName] | None = None
    workload: WorkloadOverride | None = None
    offer: OfferSpec | None = None
    slo: Slo | None = None
    thresholds: Thresholds | None = None
    reuse: Reuse | None = None
    runtime: RuntimeSpec | None = None
    #: GPU microbenchmarks (matrix/cells.py): one more cell per provider, which runs no model.
    microbench: MicrobenchSpec | None = None
    #: GPUs of one machine the row's cells span (``gpus: 2``); None: the file's ``gpus``.
    gpus: GpuCount | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> RowSpec:
        for one, many in (("provider", "providers"), ("model", "models")):
            given = getattr(self, one) is not None, getattr(self, many) is not None
            if all(given):
                raise invalid(f"give either `{one}` or `{many}`, not both")
            # A row without a provider is checked with the file's runtime; one without a model may measure the GPU.
            if not any(given) and one == "model" and self.microbench is None:
                raise invalid(f"needs `{one}: ...` or `{many}: [...]` (or `microbench: [...]`)")
            if getattr(self, many) == []:
                raise invalid(f"`{many}` is empty; list at least one")
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
    slo: Slo = Slo()
    thresholds: Thresholds = Thresholds()
    reuse: Reuse = "group"
    cloud: str = DEFAULT_CLOUD
    #: GPUs of one machine each cell spans unless its row says otherwise.
    gpus: GpuCount = 1
    #: The hosts inventory for ``cloud: hosts`` / ``local`` (matrix/fields.py), relative to this file.
    hosts: str | None = None

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any, info: ValidationInfo) -> Any:
        return hosts_file(value, Path((info.context or {}).get("base_dir") or "."))

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not NAME_RE.fullmatch(value):
            raise invalid(
                f"must be letters, digits, '.', '_', '-' (such as 'seed'); got {describe(value)}"
            )
        return value

    @field_validator("cloud", mode="before")
    @classmethod
    def _cloud(cls, value: Any) -> Any:
        # Only the form here: which names exist is the registry's (cloud/), checked at collection.
        if not isinstance(value, str) or not NAME_RE.fullmatch(value):
            raise invalid(f"must name a cloud such as '{DEFAULT_CLOUD}'; got {describe(value)}")
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _description(cls, value: Any) -> Any:
        return text_field("text", "'RTX cards for 7-32B models'")(value)

    @field_validator("models", mode="before")
    @classmethod
    def _model_keys(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            seen: dict[str, str] = {}
            for key in value:
                ref = model_ref(model_name(key)).lower()
                if ref in seen:
                    raise invalid(f"{key!r} and {seen[ref]!r} name the same model")
                seen[ref] = key
        return value

    @field_validator("matrix")
    @classmethod
    def _not_empty(cls, rows: list[RowSpec]) -> list[RowSpec]:
        if not rows:
            raise invalid("the matrix has no rows; add at least one, such as "
                           "`- {gpu: RTX 4090, provider: vastai, model: qwen2:7b}`")
        return rows


class Matrix(BaseModel):
    """A validated matrix file: its defaults and rows, ready for :func:`expand`."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    source: str
    cloud: str = DEFAULT_CLOUD
    hosts_file: str | None = None
    workload: Workload
    offer: OfferSpec
    runtime: str = DEFAULT_RUNTIME
    ollama_install: str | None = None
    runtime_args: tuple[str, ...] = ()
    runtime_port: int | None = None
    runtime_host: str | None = None
    runtime_batch_limit: int | None = None
    launch: LaunchSpec | None = None
    endpoint: EndpointSpec | None = None
    runtime_presets: str | None = None
    vram_overrides: dict[str, int] = {}
    slo: Slo = Slo()
    thresholds: Thresholds = Thresholds()
    reuse: Reuse = "group"
    gpus: int = 1
    rows: tuple[RowSpec, ...]
    row_lines: tuple[int | None, ...] = ()
    #: The cells, once expanded: validation expands the matrix, and collection reuses that.
    _cells: tuple[Cell, ...] | None = PrivateAttr(default=None)


#: The server's default batch limit for a rate cell (``rate:``, ``rate: sweep``), whose number of
#: requests in flight is not fixed: enough not to queue at the rates a single GPU sustains.
RATE_BATCH_LIMIT = 64


class Cell(BaseModel):
    """One test: a GPU, a provider, a model, and how to benchmark it."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    gpu: str
    provider: str
    model: str
    model_ref: str
    #: The Provider it rents through (``cloud:``); ``provider`` is the marketplace behind it.
    cloud: str = DEFAULT_CLOUD
    workload: Workload
    offer: OfferConstraints
    vram_gb: int
    #: GPUs the cell runs on, all on one machine (``gpus:``); the runtime spans them.
    gpus: int = 1
    #: The hosts inventory the matrix names (``hosts:``, resolved path); None: none.
    hosts_file: str | None = None
    #: The model server (a name in ``runtimes/registry.py``).
    runtime: str = DEFAULT_RUNTIME
    ollama_install: str | None = None
    #: The runtime's extra launch arguments (``runtime.args``), recorded with the result.
    runtime_args: tuple[str, ...] = ()
    #: The server's fixed port (``runtime.port``); None: a free one picked on the instance.
    runtime_port: int | None = None
    #: The address a server the plugin starts listens on (``runtime.host``); None: 127.0.0.1.
    runtime_host: str | None = None
    #: ``runtime.batch_limit``: the server's limit on requests batched at once; None: the load's
    #: default (:attr:`batch_limit`).
    runtime_batch_limit: int | None = None
    #: ``runtime.launch`` with the server's defaults filled; None: a plain SSH launch.
    launch: LaunchSpec | None = None
    #: The running server a ``runtime: openai`` cell benchmarks (matrix/fields.py); None otherwise.
    endpoint: EndpointSpec | None = None
    #: ``runtime: worker``'s presets file (resolved path), where the cell's model is a key.
    runtime_presets: str | None = None
    matrix_name: str
    source: str
    row: int
    slo: Slo = Slo()
    thresholds: Thresholds = Thresholds()
    reuse: Reuse = "group"
    #: Which of its reuse group's sessions it runs on when a run splits the group over
    #: several (:mod:`pytest_gpubench.cloud.reuse_split`); None: the group has one session.
    session_part: int | None = None
    #: A GPU microbenchmark cell's settings (``microbench:``); None for a cell that benchmarks a model.
    microbench: MicrobenchSpec | None = None

    # The id and names below are computed once per cell (collection asks for them often;
    # expansion gives them to the cells it builds); what they depend on (GPU, provider,
    # model, GPU count, load, template, runtime, cloud) no override changes.
    @cached_property
    def cell_id(self) -> str:
        """``RTX_4090-vastai-qwen2:7b``: GPU (spaces as ``_``), provider, model as written;
        then ``-x2`` on more than one GPU (:func:`gpus_suffix`); ``-c8`` for a concurrency other than 1,
        ``-r2.5`` for a request rate, ``-sweep`` for ``rate: sweep`` or ``-csweep`` for ``concurrency:
        sweep``; then a runtime and cloud other than the defaults (:func:`seam_suffix`)."""
        return cell_id(self.gpu, self.provider, self.model, self.concurrency, self.rate,
                       self.sweep_kind or False, self.gpus) + seam_suffix(
            self.runtime, self.cloud, entrypoint=self.launch is not None and self.launch.entrypoint)

    @property
    def rate(self) -> float | None:
        """The cell's request rate (requests/s; None for a concurrency cell and for a ``rate: sweep``
        cell, whose rates its steps choose): stored once, in ``workload.rate`` (``(2.5,)`` for a
        ``-r2.5`` cell). A user's hook cannot change it (matrix/adjust.py)."""
        rate = self.workload.rate
        return rate[0] if isinstance(rate, tuple) else None

    @property
    def concurrency(self) -> int:
        """The cell's concurrency (requests in flight; 1 for a rate cell and for a ``concurrency: sweep``
        cell, whose levels its steps set): its load point, stored once, in ``workload.concurrency``
        (``(8,)`` for a ``-c8`` cell). A user's hook cannot change it (matrix/adjust.py)."""
        concurrency = self.workload.concurrency
        return concurrency[0] if isinstance(concurrency, tuple) else 1

    @property
    def lease_runtime(self) -> str:
        """What a machine provider (``hosts``, ``local``) leases GPUs for: the cell's runtime, or
        ``microbench`` for a microbenchmark cell, a process on its own GPU
        (``cloud/hosts_provider.py`` decides by it how many of the machine's GPUs the cell holds)."""
        return MICROBENCH_MODEL if self.microbench is not None else self.runtime

    @property
    def sweep(self) -> SweepSpec | None:
        """A ``rate: sweep`` or ``concurrency: sweep`` cell's sweep settings (``matrix/workload.py``);
        None for a cell at one load. :attr:`sweep_kind` says which."""
        return self.workload.sweep_spec

    @property
    def sweep_kind(self) -> str | None:
        """``"rate"`` (``rate: sweep``), ``"concurrency"`` (``concurrency: sweep``) or None."""
        return self.workload.sweep_kind

    @property
    def batch_limit(self) -> int:
        """The server's limit on requests batched at once (``{parallel}`` in a launch command, Ollama's
        ``OLLAMA_NUM_PARALLEL``): ``runtime.batch_limit`` when the matrix gives it, else a default for
        the load (docs/runtimes.md): a concurrency cell's concurrency; a ``concurrency: sweep``'s top
        level; a rate cell's or a ``rate: sweep``'s :data:`RATE_BATCH_LIMIT` (its throughput probe's
        concurrency when higher), since an open-loop load has no fixed number in flight."""
        if self.runtime_batch_limit is not None:
            return self.runtime_batch_limit
        sweep = self.sweep
        if sweep is not None and self.sweep_kind == "concurrency":
            return sweep.top_concurrency
        if sweep is not None:
            return max(sweep.probe_concurrency, RATE_BATCH_LIMIT)
        return self.concurrency if self.rate is None else max(self.concurrency, RATE_BATCH_LIMIT)

    @property
    def runs(self) -> Runs:
        """How many times the benchmark is measured (``workload.runs``)."""
        return self.workload.runs

    @cached_property
    def gpu_compact(self) -> str:
        """The GPU name without spaces: ``RTX4090``."""
        return compact_gpu(self.gpu)

    @cached_property
    def reuse_group(self) -> str:
        """Cells in one group can share a rented session: ``RTX_4090-vastai``
        (:func:`~pytest_gpubench.matrix.selection.reuse_group_name`), then a runtime and
        cloud other than the defaults (:func:`seam_suffix`)."""
        return (reuse_group_name(self.gpu, self.provider, self.offer.template, self.gpus)
                + seam_suffix(self.runtime, self.cloud))

    @property
    def session_group(self) -> str | None:
        """The reuse group whose session this cell runs on (``RTX_4090-vastai``, or
        ``RTX_4090-vastai/2`` for the second session of a split group); None with ``reuse: cell``."""
        if self.reuse != "group":
            return None
        return self.reuse_group if self.session_part is None else f"{self.reuse_group}/{self.session_part}"

    @cached_property
    def keywords(self) -> frozenset[str]:
        """Extra ``-k`` names: ``RTX4090``, the model's full reference and its family."""
        return cell_keywords(self.gpu, self.model_ref)


# ------------------------------------------------------------------- loading, errors


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raises :class:`MatrixError` for any problem."""
    source = str(path)
    return parse_matrix(read_text(path, MatrixError, source), source)


def load_cells(path: str | Path) -> list[Cell]:
    """``expand(load_matrix(path))``, read once per file version.

    Collection, the xdist controller's grouping and ``gpubench plan`` may each ask
    for the same file; while its size and modification time stay the same, the
    cells (frozen) are reused.
    """
    source = Path(path)
    try:
        stat = source.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return expand(load_matrix(path))  # load_matrix says what is wrong with the file
    cached = _CELLS_CACHE.get(str(path))
    if cached is None or cached[0] != key:
        cached = _CELLS_CACHE[str(path)] = (key, tuple(expand(load_matrix(path))))
    return list(cached[1])


#: ``{path: ((path, mtime_ns, size), cells)}`` for :func:`load_cells`.
_CELLS_CACHE: dict[str, tuple[tuple[str, int, int], tuple[Cell, ...]]] = {}


def parse_matrix(text: str, source: str) -> Matrix:
    """Validate matrix YAML ``text``; ``source`` names it in errors and in cells."""
    root, data = parse_yaml(text, source)
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
            f"the top level must be a mapping with a `matrix:` list of rows; got {describe(data)}",
        )
    try:
        # A dataset's path in `workload.prompts` is relative to the matrix file's folder.
        # `provider:` means a host, not a marketplace, under `cloud: hosts`/`local` (fields._provider).
        cloud = data.get("cloud") if isinstance(data, Mapping) else None
        spec = MatrixSpec.model_validate(data, context={"base_dir": str(Path(source).parent), "cloud": cloud})
    except ValidationError as exc:
        raise translate(exc, source, root) from None
    for r, row in enumerate(spec.matrix):
        runtime = row.runtime if row.runtime is not None and "name" in row.runtime.model_fields_set else spec.runtime
        if row.provider is None and row.providers is None and runtime.name != ENDPOINT_RUNTIME:
            raise MatrixError(source, f"matrix[{r}]", "needs `provider: ...` or `providers: [...]`"
                                                      + at_line(node_line(root, ("matrix", r))))
    stem = Path(source).stem
    matrix = Matrix(
        name=spec.name or re.sub(r"^gpubench[_-]", "", stem) or stem,
        description=spec.description or "",
        source=source,
        cloud=spec.cloud,
        hosts_file=spec.hosts,
        workload=spec.workload,
        offer=spec.offer,
        runtime=spec.runtime.name,
        ollama_install=spec.runtime.ollama_install,
        runtime_args=spec.runtime.args,
        runtime_port=spec.runtime.port,
        runtime_host=spec.runtime.host,
        runtime_batch_limit=spec.runtime.batch_limit,
        launch=spec.runtime.launch,
        endpoint=spec.runtime.endpoint_spec(),
        runtime_presets=spec.runtime.presets,
        vram_overrides={model_ref(k).lower(): v.vram_gb for k, v in spec.models.items()},
        slo=spec.slo,
        thresholds=spec.thresholds,
        reuse=spec.reuse,
        gpus=spec.gpus,
        rows=tuple(spec.matrix),
        row_lines=tuple(node_line(root, ("matrix", i)) for i in range(len(spec.matrix))),
    )
    matrix._cells = tuple(_expand(matrix))  # a Matrix that exists expands: duplicates and VRAM are checked here
    return matrix


def expand(matrix: Matrix) -> list[Cell]:
    """One :class:`Cell` per (row, provider, model, load point), in file order."""
    if matrix._cells is None:
        matrix._cells = tuple(_expand(matrix))
    return list(matrix._cells)


def _check_worker_models(matrix: Matrix, r: int, row: RowSpec, runtime: str, presets: str | None) -> None:
    """A ``worker`` row needs a presets file holding each of its models (seed 004)."""
    if runtime != "worker":
        return
    if presets is None:
        raise MatrixError(matrix.source, f"matrix[{r}].runtime", (
            "runtime worker needs `presets: model_presets.yaml`, the file naming each model's docker_image "
            "(seed 004's shape), in the row's or the file's runtime"))
    known = load_presets(presets)
    for field, model in row.model_entries():
        if model not in known:
            raise MatrixError(matrix.source, f"matrix[{r}].{field}", (
                f"{model!r} is not in the presets file {presets}; models there: {', '.join(sorted(known))}"))


def _expand(matrix: Matrix) -> list[Cell]:
    cells: list[Cell] = []
    seen: dict[tuple[Any, ...], int] = {}
    ids: dict[str, int] = {}
    # What depends on the model (and GPU) alone is worked out once per file, not per row and load.
    vram_of: dict[str, int | None] = {}
    keywords_of: dict[tuple[str, str], frozenset[str]] = {}
    for r, row in enumerate(matrix.rows):
        where = at_line(_row_line(matrix, r))
        workload = _row_workload(matrix, r, row)
        slo, thresholds = merged(matrix.slo, row.slo), merged(matrix.thresholds, row.thresholds)
        if thresholds.min_match_rate is not None and not workload.has_expectations:
            raise MatrixError(matrix.source, f"matrix[{r}]", (
                "thresholds.min_match_rate is set but no prompt of this row has `expect` answers, "
                "so no match rate can be measured; use `prompts: quality`, give prompts "
                f"{{prompt: ..., expect: [...]}}, or set `min_match_rate: null` in the row{where}"))
        problem = sweep_problem(workload.rate, workload.sweep, slo.is_set, workload.runs != Runs(),
                                workload.concurrency)
        if problem and (workload.sweep_kind is not None
                        or "sweep" in (row.workload.model_fields_set if row.workload else ())):
            raise MatrixError(matrix.source, f"matrix[{r}].workload", problem + where)
        sweeping = workload.sweep_kind  # "rate", "concurrency" or None
        points = ([(1, None)] if sweeping else [(1, rate) for rate in workload.rate] if workload.rate is not None
                  else [(c, None) for c in workload.concurrency])
        # One workload and id suffix per load point, shared by the row's cells (frozen, so sharing is safe).
        point_parts = [(concurrency, rate, axes_suffix(concurrency, rate, sweeping or False), workload.model_copy(
            update={"concurrency": SWEEP if sweeping == "concurrency" else (concurrency,),
                    "rate": SWEEP if sweeping == "rate" else None if rate is None else (rate,)}))
            for concurrency, rate in points]
        reuse = row.reuse or matrix.reuse
        row_runtime = row.runtime or RuntimeSpec()
        runtime_set = row_runtime.model_fields_set
        runtime = row_runtime.name if "name" in runtime_set else matrix.runtime
        install = row_runtime.ollama_install if "ollama_install" in runtime_set else matrix.ollama_install
        runtime_args = row_runtime.args if "args" in runtime_set else matrix.runtime_args
        runtime_port = row_runtime.port if "port" in runtime_set else matrix.runtime_port
        runtime_host = row_runtime.host if "host" in runtime_set else matrix.runtime_host
        batch_limit = row_runtime.batch_limit if "batch_limit" in runtime_set else matrix.runtime_batch_limit
        launch = row_runtime.launch if "launch" in runtime_set else matrix.launch
        # A running endpoint is described beside its name (RuntimeSpec), so it comes with the name.
        endpoint = row_runtime.endpoint_spec() if "name" in runtime_set else matrix.endpoint
        cloud = ENDPOINT_CLOUD if runtime == ENDPOINT_RUNTIME else matrix.cloud
        presets = row_runtime.presets if "presets" in runtime_set else matrix.runtime_presets
        _check_worker_models(matrix, r, row, runtime, presets)
        row_offer = row.offer or OfferSpec()
        fields = row_offer.model_fields_set
        max_price = row_offer.max_price if "max_price" in fields else matrix.offer.max_price
        max_attempts = (row_offer.max_attempts if "max_attempts" in fields else matrix.offer.max_attempts)
        template = row_offer.template if "template" in fields else matrix.offer.template
        if launch is not None and (problem := launch_problem(launch, runtime, template)):
            raise MatrixError(matrix.source, f"matrix[{r}].runtime.launch", problem + where)
        if launch is not None and launch.entrypoint and runtime_port is not None:
            raise MatrixError(matrix.source, f"matrix[{r}].runtime.port",
                              "runtime.port cannot be combined with runtime.launch mode entrypoint: the image's "
                              "server listens on launch.api_port; set that instead" + where)
        cell_launch = resolved(launch, runtime)
        if launch is not None and launch.entrypoint:
            reuse = "cell"  # the image serves one model, started with the session: nothing to share
        if cloud in KEPT_MACHINES:
            reuse = "cell"  # a leased GPU, not a rented session: each cell holds only its own GPUs
        bars = {**(matrix.offer.min_availability_confidence or {}),
                **(row_offer.min_availability_confidence or {})}
        gpu_key = normalize_gpu(row.gpu)
        gpus = row.gpus or matrix.gpus
        if gpus > 1 and endpoint is not None:
            raise MatrixError(matrix.source, f"matrix[{r}].gpus", (
                f"`gpus: {gpus}` asks for a machine to spread the model over, but `runtime: {ENDPOINT_RUNTIME}` "
                "benchmarks a server that is already up: nothing is rented or started; drop `gpus`" + where))
        if gpus > 1 and cell_launch is not None and cell_launch.entrypoint:
            # The create request has no tensor-parallel field (CreateSessionRequest; buildWorkloadConfig
            # leaves WorkloadConfig.TensorParallel at 0): the image's server would use one GPU.
            raise MatrixError(matrix.source, f"matrix[{r}].gpus", (
                f"`gpus: {gpus}` cannot be combined with runtime.launch mode entrypoint: GPU Shopper's API "
                "cannot ask the image's server for tensor parallelism, so it would serve on one GPU; "
                "use the default ssh launch, where the plugin starts the server across the GPUs" + where))
        seams = seam_suffix(runtime, cloud, entrypoint=cell_launch is not None and cell_launch.entrypoint)
        row_shared = dict(
            gpu=row.gpu, runtime=runtime, cloud=cloud, hosts_file=matrix.hosts_file, ollama_install=install,
            matrix_name=matrix.name,
            runtime_args=runtime_args, runtime_port=runtime_port, runtime_host=runtime_host, endpoint=endpoint,
            runtime_batch_limit=batch_limit, runtime_presets=presets,
            source=matrix.source,
            launch=cell_launch,
            row=r, slo=slo, thresholds=thresholds, reuse=reuse, gpu_compact=compact_gpu(row.gpu), microbench=None,
            gpus=gpus,
        )
        row_cells = Prototype(Cell, row_shared, varying=("provider", "model", "model_ref", "workload", "offer", "vram_gb",
                    "cell_id", "keywords", "reuse_group"))
        for _, provider in row.provider_entries() or [("provider", ENDPOINT_PROVIDER)]:
            offer = OfferConstraints(
                max_price=max_price,
                min_availability_confidence=bars.get(
                    provider, bars.get("default", DEFAULT_MIN_AVAILABILITY_CONFIDENCE)),
                max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
                template=template,
            )
            group = reuse_group_name(row.gpu, provider, template, gpus) + seams
            for field, model in row.model_entries():
                if model not in vram_of:
                    vram_of[model] = model_vram_gb(model, matrix.vram_overrides)
                vram = vram_of[model]
                if endpoint is not None:
                    vram = 0  # nothing is rented for a running endpoint: no VRAM to look for, whatever its name says
                if vram is None:
                    raise MatrixError(matrix.source, f"matrix[{r}].{field}", (
                        f"cannot tell how much VRAM {model!r} needs: it is not in the seed table "
                        f"and its name states no size such as '7b'; add "
                        f"`models: {{{model}: {{vram_gb: N}}}}` to the file{where}"))
                ref = model_ref(model)
                keywords = keywords_of.get((row.gpu, ref))
                if keywords is None:
                    keywords = keywords_of[row.gpu, ref] = cell_keywords(row.gpu, ref)
                base_id, ref_key = cell_id_base(row.gpu, provider, model, gpus), ref.lower()
                for concurrency, rate, suffix, point_workload in point_parts:
                    cell = row_cells.new(
                        provider=provider, model=model, model_ref=ref, workload=point_workload, offer=offer,
                        vram_gb=vram, cell_id=base_id + suffix + seams,
                        keywords=keywords, reuse_group=group)
                    key = (gpu_key, gpus, provider, ref_key, concurrency, sweeping or rate, runtime, seams)
                    id_key = cell.cell_id.lower()
                    first = seen.get(key, ids.get(id_key))
                    if first is not None:
                        raise MatrixError(matrix.source, f"matrix[{r}]", (
                            f"duplicate cell {cell.cell_id} ({gpus_label(row.gpu, gpus)} / {provider} / {model}"
                            f"{_load_text(concurrency, rate, sweeping)}), already in matrix[{first}]"
                            f"{at_line(_row_line(matrix, first))}; a GPU, provider, model and "
                            f"load may appear once per runtime (and launch mode) in a file{where}"))
                    seen[key] = ids[id_key] = r
                    cells.append(cell)
            if row.microbench is not None:
                cell = _microbench_cell(matrix, r, row, row_shared, provider, offer, point_parts[0][3],
                                        endpoint=runtime == ENDPOINT_RUNTIME)
                id_key = cell.cell_id.lower()
                if id_key in ids:
                    raise MatrixError(matrix.source, f"matrix[{r}].microbench", (
                        f"duplicate cell {cell.cell_id}, already in matrix[{ids[id_key]}]"
                        f"{at_line(_row_line(matrix, ids[id_key]))}; a GPU and provider's microbenchmarks "
                        f"may appear once in a file{where}"))
                ids[id_key] = r
                cells.append(cell)
    if matrix.workload.sweep is not None and not any(cell.sweep for cell in cells):
        raise MatrixError(matrix.source, "workload.sweep", sweep_problem(None, matrix.workload.sweep, True) or "")
    return cells


def _microbench_cell(matrix: Matrix, r: int, row: RowSpec, row_shared: dict[str, Any], provider: str,
                     offer: OfferConstraints, workload: Workload, *, endpoint: bool) -> Cell:
    """A row's microbenchmark cell on ``provider``: the row's cells' settings (cloud, hosts
    inventory, SLO, ...) but no model, no runtime, one GPU and its own session (``reuse: cell``:
    a model server an earlier cell left would share the GPU it measures)."""
    if endpoint:
        raise MatrixError(matrix.source, f"matrix[{r}].microbench", (
            "microbenchmarks need a rented GPU reached over SSH; a running endpoint has none"
            + at_line(_row_line(matrix, r))))
    no_server = {"runtime": DEFAULT_RUNTIME, "runtime_args": (), "runtime_port": None, "runtime_host": None,
                 "runtime_batch_limit": None,
                 "launch": None, "runtime_presets": None, "endpoint": None}
    shared = {name: value for name, value in row_shared.items() if name != "gpu_compact"}  # a cached property
    return Cell(**{
        **shared, **no_server, "gpus": 1, "reuse": "cell", "microbench": row.microbench,
        "provider": provider, "model": MICROBENCH_MODEL, "model_ref": MICROBENCH_MODEL, "offer": offer, "vram_gb": 0,
        "workload": workload.model_copy(update={"concurrency": (1,), "rate": None})})


def _row_workload(matrix: Matrix, r: int, row: RowSpec) -> Workload:
    """The file's workload with the row's keys over it; load axes checked once merged."""
    if row.workload is None:
        return matrix.workload
    update = {key: getattr(row.workload, key) for key in row.workload.model_fields_set}
    workload = matrix.workload.model_copy(update=update)
    conflict = load_conflict(workload.concurrency, workload.rate)
    if conflict:
        origin = {k: "this row" if k in update else "the file's workload" for k in ("concurrency", "rate")}
        raise MatrixError(matrix.source, f"matrix[{r}].workload", (
            f"{conflict}; here `concurrency` comes from {origin['concurrency']} and `rate` from "
            f"{origin['rate']}: in the row, set `concurrency: 1`, or `rate: null` to drop the "
            f"file's rate{at_line(_row_line(matrix, r))}"))
    conflict = trace_conflict(workload.trace, workload.concurrency, workload.rate)
    if conflict:
        raise MatrixError(matrix.source, f"matrix[{r}].workload", conflict + at_line(_row_line(matrix, r)))
    return workload


def _load_text(concurrency: int, rate: float | None, sweep: str | None = None) -> str:
    if sweep:
        return f" / {sweep} sweep"
    if rate is not None:
        return f" / rate {number_text(rate)}/s"
    return f" / concurrency {concurrency}" if concurrency != 1 else ""


def _row_line(matrix: Matrix, row: int) -> int | None:
    return matrix.row_lines[row] if row < len(matrix.row_lines) else None


# --------------------------------------------------------------------------------------------------
# The command line over the matrix: ``--gpubench-duration`` and friends applied to a cell.
#
# Light (the matrix and the settings only): collection applies it to every cell
# before ordering the run.


def apply_overrides(cell: Cell, settings: Settings) -> Cell:
    """Apply ``--gpubench-duration`` and friends on top of what the matrix says."""
    workload: dict[str, object] = {}
    if settings.duration is not None:
        workload["duration"] = settings.duration
    if settings.progress_interval is not None:
        workload["progress_interval"] = settings.progress_interval
    if settings.telemetry_interval is not None:
        workload["telemetry_interval"] = settings.telemetry_interval
    if settings.stall_timeout is not None:
        workload["stall_timeout"] = settings.stall_timeout
    if settings.benchmark_scale != 1.0:
        # The run's own sandbox: the benchmark runs on the sandbox's clock, as its
        # setup does (the stall timeout is scaled where it is used). No warm-up
        # requests: the runtime's one-token warm-up has loaded the model, and an
        # emulated GPU has nothing else to warm, while a full-length warm-up at a slow
        # model's real rate (256 tokens at 3.6 tokens/s: 71 s) would outlast the run.
        current = cell.workload.model_copy(update=workload)
        workload.update(
            duration=settings.benchmark_seconds(current.duration),
            progress_interval=settings.benchmark_seconds(current.progress_interval, MIN_SANDBOX_INTERVAL),
            telemetry_interval=settings.benchmark_seconds(current.telemetry_interval, MIN_SANDBOX_INTERVAL),
            warmup_requests=0,
        )
        sweep = current.sweep
        if sweep is not None and sweep.duration is not None:  # each step of a saturation sweep, likewise
            workload["sweep"] = sweep.model_copy(update={"duration": settings.benchmark_seconds(sweep.duration)})
    update: dict[str, object] = {}
    if workload:
        update["workload"] = cell.workload.model_copy(update=workload)
    if settings.max_price is not None:
        cap = settings.max_price if cell.offer.max_price is None else min(settings.max_price, cell.offer.max_price)
        update["offer"] = cell.offer.model_copy(update={"max_price": cap})
    if settings.ollama_install:
        update["ollama_install"] = settings.ollama_install
    if settings.reuse is not None and cell.launch is None:  # an entrypoint session serves its one cell
        update["reuse"] = settings.reuse
    return cell.model_copy(update=update) if update else cell
