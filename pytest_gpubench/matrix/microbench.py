"""``microbench:``: a row's GPU microbenchmarks, a cell that runs no model.

A row may say ``microbench: [memory_bandwidth, matmul]`` (with or without ``models:``):
one more cell per GPU x provider, ``RTX_4090-vastai-microbench``, that measures the
GPU itself with torch on the instance (docs/hardware.md, "GPU microbenchmarks"). The
mapping form sets the optional settings:

.. code-block:: yaml

    microbench: {kinds: [memory_bandwidth, matmul], runs: 5, warmup: 2,
                 memory_mib: 1024, matmul_size: 8192, precisions: [fp16, bf16]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, model_validator

from .fields import StrictModel, did_you_mean, invalid, whole
from .yaml_errors import describe

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
