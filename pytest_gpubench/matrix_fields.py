"""Field types of the matrix schema: each validator says what is allowed.

Every value a user can write in a matrix file is checked here, and a bad one
raises an error whose message names what would be accepted (``must be a number
of seconds or a string such as '90s'...``); ``yaml_errors`` adds the file, the
field path and the line.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from .selection import normalize_provider
from .yaml_errors import describe

KNOWN_PROVIDERS: tuple[str, ...] = ("vastai", "tensordock", "bluelobster")
"""Providers a matrix may name (GPU Shopper's provider names)."""

MAX_DURATION_S = 24 * 3600.0


_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_MODEL_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*(?::{_SEGMENT})?")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?"
)


# ------------------------------------------------------------------ field validators


def invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("gpubench", "{message}", {"message": message})


def _number(value: Any, allowed: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise invalid(f"{allowed}; got {describe(value)}")
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
        raise invalid(f"{allowed}; got {describe(value)}") from None
    if not (_finite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise invalid(f"{allowed}; got {describe(value)}")
    return seconds


def whole(low: int, high: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise invalid(f"must be a whole number from {low} to {high}; got {describe(value)}")
        return value

    return BeforeValidator(check)


def _price(value: Any) -> float:
    allowed = "must be a price in dollars per hour, more than 0 (or null for no cap)"
    if _number(value, allowed) <= 0:
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


def _provider(value: Any) -> str:
    raw = text_field("a provider name", "'vastai'")(value)
    name = normalize_provider(raw)
    if name not in KNOWN_PROVIDERS:
        raise invalid(
            f"unknown provider {raw!r}{did_you_mean(name, KNOWN_PROVIDERS)}; "
            f"known providers: {', '.join(KNOWN_PROVIDERS)}"
        )
    return name


def model_name(value: Any) -> str:
    name = text_field("an Ollama model name", "'qwen2:7b'")(value).strip()
    if len(name) > 200 or not _MODEL_RE.fullmatch(name):
        raise invalid(
            f"not a valid Ollama model name: {value!r}; write NAME or NAME:TAG such as "
            "'qwen2:7b' (letters, digits, '.', '_', '-', and '/' for a namespace)"
        )
    return name


def _prompts(value: Any) -> tuple[str, ...]:
    allowed = "must be a non-empty list of non-empty strings"
    if not isinstance(value, (list, tuple)) or not value:
        raise invalid(f"{allowed}; got {describe(value)}")
    for i, prompt in enumerate(value):
        if not isinstance(prompt, str) or not prompt.strip():
            raise invalid(f"{allowed}; item {i} is {describe(prompt)}")
    return tuple(value)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Seconds = Annotated[float, BeforeValidator(_seconds)]
GpuName = Annotated[str, BeforeValidator(_gpu)]
ProviderName = Annotated[str, BeforeValidator(_provider)]
ModelName = Annotated[str, BeforeValidator(model_name)]
Prompts = Annotated[tuple[str, ...], BeforeValidator(_prompts)]
MaxTokens = Annotated[int, whole(1, 131072)]
Warmup = Annotated[int, whole(0, 1000)]
CheckpointEvery = Annotated[int, whole(1, 1_000_000)]
Price = Annotated[float, BeforeValidator(_price)]
