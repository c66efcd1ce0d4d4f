"""Cell names and selection: GPU/provider/model matching, test ids, VRAM needs.

What ``--gpubench-gpu``, ``--gpubench-provider`` and ``--gpubench-model`` use (:func:`cell_selected`;
the run's :class:`CellFilters` and :func:`split_by_filters`), how a cell's test id is formed
(:func:`cell_id`, with its load point), and how much GPU memory a model needs (seed 000's table, else
inferred from the parameter count in its tag).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any

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
"""Seed 000's VRAM minimums in GB; other models are inferred from the size their name states."""

_PARAMS_RE = re.compile(
    r"(?<![a-z0-9.])(?:(\d+(?:\.\d+)?)x)?(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", re.I
)


# ---------------------------------------------------------------- names and filters


def compact_gpu(name: str) -> str:
    """The GPU name without spaces, ``-`` or ``_``: ``"RTX 4090"`` -> ``"RTX4090"``."""
    return re.sub(r"[\s_-]+", "", name)


def normalize_gpu(name: str) -> str:
    """``"RTX 4090"``, ``"rtx-4090"`` and ``"RTX_4090"`` all become ``"rtx4090"``."""
    return compact_gpu(name).lower()


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


def split_tag(model: str) -> tuple[str, str | None]:
    """``"ns/name:tag"`` -> ``("ns/name", "tag")``; the tag is None when absent."""
    head, _, last = model.rpartition("/")
    if ":" not in last:
        return model, None
    name, _, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), tag


def model_ref(model: str) -> str:
    """The Ollama reference with its tag: ``"llama3"`` -> ``"llama3:latest"``."""
    model = model.strip()
    name, tag = split_tag(model)
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
    name, tag = split_tag(wanted)
    return model == wanted if tag is not None else split_tag(model)[0] == name


def filter_values(values: Iterable[str] | None) -> list[str]:
    """Filter values; each may itself be a comma-separated list."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


def cell_selected(
    cell: Any,
    gpus: Iterable[str] | None = (),
    providers: Iterable[str] | None = (),
    models: Iterable[str] | None = (),
) -> bool:
    """True if ``cell`` passes the ``--gpubench-gpu``/``-provider``/``-model`` filters.

    Within one filter any value may match; an empty filter selects everything.
    """
    checks = (
        (filter_values(gpus), gpu_matches, cell.gpu),
        (filter_values(providers), provider_matches, cell.provider),
        (filter_values(models), model_matches, cell.model),
    )
    return all(not wanted or any(match(w, have) for w in wanted) for wanted, match, have in checks)


def select_cells(
    cells: Iterable[Any],
    gpus: Iterable[str] | None = (),
    providers: Iterable[str] | None = (),
    models: Iterable[str] | None = (),
) -> list[Any]:
    """The cells :func:`cell_selected` keeps, in order."""
    return [c for c in cells if cell_selected(c, gpus, providers, models)]


# ---------------------------------------------------------------------------- VRAM


def _size_named(model: str) -> re.Match[str] | None:
    """The size the model's name states: in its tag first (``qwen2:7b``), else in the name
    itself (``llama-7b``, ``Qwen/Qwen2.5-7B-Instruct``, ``mixtral-8x7b``); the organisation or
    folder before the last ``/`` is not read (it names who made the model, not its size)."""
    name, tag = split_tag(model.strip())
    return _PARAMS_RE.search(tag or "") or _PARAMS_RE.search(name.rpartition("/")[2])


def infer_parameters_b(model: str) -> float | None:
    """Billions of parameters the name states (``7b``, ``1.5b``, ``8x7b``, ``135m``): see :func:`_size_named`."""
    found = _size_named(model)
    if not found:
        return None
    return float(_parameters(found))


def _parameters(found: re.Match[str]) -> Fraction:
    experts, size, unit = found.groups()
    params = Fraction(size) * (Fraction(experts) if experts else 1)
    return params / 1000 if unit.lower() == "m" else params


def infer_vram_gb(model: str) -> int | None:
    """``ceil(params_b * 0.65 / 4) * 4`` GB, at least 4; None when the name states no size.

    The rule gives every entry of :data:`MODEL_VRAM_GB` whose tag names a size.
    """
    found = _size_named(model)
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


def id_part(text: str) -> str:
    return re.sub(r"[\s/]+", "_", text.strip())


def cell_id(gpu: str, provider: str, model: str, concurrency: int = 1, rate: float | None = None,
            sweep: bool | str = False, gpus: int = 1) -> str:
    """The test id of a cell: ``{GPU with _ for spaces}-{provider}-{model}``, its GPU count, then its load.

    ``RTX_4090-vastai-qwen2:7b`` at concurrency 1 without a rate (so ids from
    before load axes existed stay the same), ``...-c8`` at concurrency 8,
    ``...-r2.5`` at 2.5 requests/s, ``...-sweep`` for a saturation sweep (``rate: sweep``),
    ``...-csweep`` for a concurrency sweep (``sweep="concurrency"``);
    ``...-x2-c8`` for the same on two GPUs (:func:`gpus_suffix`).
    """
    return cell_id_base(gpu, provider, model, gpus) + axes_suffix(concurrency, rate, sweep)


def gpus_suffix(gpus: int) -> str:
    """``-x2`` for a cell on two GPUs; ``""`` for one, so one-GPU ids and groups are as they were."""
    return f"-x{int(gpus)}" if gpus > 1 else ""


def gpus_label(gpu: str, count: int) -> str:
    """``RTX 4090`` for one GPU, ``2x RTX 4090`` for a machine of two: how plans, offer listings,
    errors and reports name a cell's or an offer's GPUs."""
    return f"{count}x {gpu}" if count > 1 else gpu


def cell_id_base(gpu: str, provider: str, model: str, gpus: int = 1) -> str:
    """A cell id without its load part: ``RTX_4090-vastai-qwen2:7b`` (``...-x2`` on two GPUs)."""
    return f"{id_part(gpu)}-{normalize_provider(provider)}-{id_part(model)}{gpus_suffix(gpus)}"


def reuse_group_name(gpu: str, provider: str, template: str | None = None, gpus: int = 1) -> str:
    """The reuse group of a GPU and provider: ``RTX_4090-vastai`` (``RTX_4090-vastai-x2`` for
    two-GPU cells: another machine, never shared with one-GPU cells).

    A provider template names the instance's image, so cells asking for different
    ones cannot share a session: the template's first characters join the name then.
    """
    group = f"{id_part(gpu)}-{provider}{gpus_suffix(gpus)}"
    return f"{group}-t{template[:12]}" if template else group


def cell_keywords(gpu: str, ref: str) -> frozenset[str]:
    """A cell's extra ``-k`` names: the compact GPU name, the model's full reference ``ref``
    (:func:`model_ref`) and its family."""
    return frozenset({compact_gpu(gpu), ref, split_tag(ref)[0]})


def axes_suffix(concurrency: int = 1, rate: float | None = None, sweep: bool | str = False) -> str:
    """``""``, ``"-c8"``, ``"-r2.5"``, ``"-sweep"`` (``rate: sweep``; ``sweep`` True or ``"rate"``) or
    ``"-csweep"`` (``concurrency: sweep``; ``sweep="concurrency"``): the load part of a cell id."""
    if sweep == "concurrency":
        return "-csweep"
    if sweep:
        return "-sweep"
    if rate is not None:
        return f"-r{number_text(rate)}"
    return f"-c{concurrency}" if concurrency != 1 else ""


def number_text(value: float) -> str:
    """``2.0`` -> ``"2"``, ``2.5`` -> ``"2.5"``, ``0.00001`` -> ``"0.00001"`` (never an exponent)."""
    text = format(Decimal(repr(float(value))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# --------------------------------------------------------------------------------------------------
# Where ``--gpubench-gpu``/``--gpubench-provider``/``--gpubench-model`` select cells.
#
# One function decides, :func:`split_by_filters`, for matrix files (before their
# items are built, so a filter that keeps 10% of a big matrix builds 10% of its
# items) and for Python tests parametrized by the ``gpubench`` marker (at
# ``pytest_collection_modifyitems``). The run's filters are a :class:`CellFilters` on
# ``config.stash[CELL_FILTERS_KEY]``; what they keep out is deselected, so pytest's
# counts read as with ``-k``. When they keep nothing, ``plugin.matrix_scan.filter_hint_lines``
# says which values exist.


@dataclass(frozen=True)
class CellFilters:
    """The run's filters: within one, any value may match; an empty one keeps everything."""

    gpus: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Any) -> CellFilters:
        """The filters ``settings`` hold (``--gpubench-gpu`` etc.)."""
        return cls(tuple(settings.gpu), tuple(settings.provider), tuple(settings.model))

    @property
    def active(self) -> bool:
        return bool(self.gpus or self.providers or self.models)


def split_by_filters(cells: Iterable[Any], filters: CellFilters) -> tuple[list[Any], list[Any]]:
    """``(kept, dropped)``: the cells the filters select, in order, and the others
    (:func:`cell_selected` has the matching rules)."""
    cells = list(cells)
    if not filters.active:
        return cells, []
    kept: list[Any] = []
    dropped: list[Any] = []
    for cell in cells:
        (kept if cell_selected(cell, filters.gpus, filters.providers, filters.models) else dropped).append(cell)
    return kept, dropped
