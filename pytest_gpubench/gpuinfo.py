"""What nvidia-smi says, parsed without ever crashing, and the GPU-name check.

``[N/A]`` and ``[Not Supported]`` become None; numbers lose their units; names and
versions stay text. :func:`gpu_name_matches` checks that the machine we got is the
GPU we paid for.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

# nvidia-smi's ways of saying "no value"; it brackets most of them.
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]",
            "unknown error", "[insufficient permissions]", "[gpu is lost]"}
_NUMBER_WITH_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:MiB|GiB|W|%|MHz|C|°C)?$")


def _scalar(raw: str | None) -> int | float | str | None:
    """A number when the text is one (units tolerated), ``None`` when nvidia-smi has none."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in _MISSING:
        return None
    match = _NUMBER_WITH_UNIT.match(text)
    if not match:
        return text
    number = match.group(1)
    return float(number) if "." in number else int(number)


# Query fields whose values are names, not quantities: "12.10" is not the number 12.1,
# and compute capability "8.10" is not 8.1.
_TEXT_FIELDS = re.compile(r"version|name|uuid|serial|bus_id|compute_cap")


def _csv_value(field: str, raw: str | None) -> int | float | str | None:
    value = _scalar(raw)
    if value is not None and _TEXT_FIELDS.search(field):
        return raw.strip() if raw is not None else None
    return value


def parse_gpu_query_csv(text: str, fields: Sequence[str] | str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` output.

    One dict per GPU line, keyed by the queried field names in order. Numbers become
    ``int`` / ``float``, ``[N/A]`` / ``[Not Supported]`` and the like become
    ``None``, anything else stays text, and so do names and versions
    (``name``, ``driver_version``, ``uuid``, ...). A short line is padded with ``None``; extra
    columns are dropped. Never raises on odd values.
    """
    names = [f.strip() for f in fields.split(",")] if isinstance(fields, str) else list(fields)
    rows: list[dict[str, Any]] = []
    for values in csv.reader(text.splitlines(), skipinitialspace=True):
        if not values or all(not v.strip() for v in values):
            continue
        padded = list(values[: len(names)]) + [None] * (len(names) - len(values))
        rows.append({name: _csv_value(name, value) for name, value in zip(names, padded, strict=False)})
    return rows


def _xml_raw(node: ET.Element, path: str) -> str | None:
    """Text of ``path`` under ``node``; ``None`` when absent or nvidia-smi says N/A."""
    found = node.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text.lower() in _MISSING else text


def _xml_number(node: ET.Element, path: str) -> int | float | None:
    value = _scalar(_xml_raw(node, path))
    return value if isinstance(value, (int, float)) else None


# Where a figure sits, oldest layout last: drivers from 530 on moved the power readings
# to <gpu_power_readings> (the limit as <current_power_limit>), and from 555 on split the
# draw into <average_power_draw> and <instant_power_draw>; earlier ones have
# <power_readings> with <power_limit> and <enforced_power_limit>.
_POWER_DRAW = ("power_readings/power_draw", "gpu_power_readings/power_draw",
               "gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw")
_POWER_LIMIT = ("gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit",
                "power_readings/power_limit")


def _first_number(node: ET.Element, paths: Sequence[str]) -> int | float | None:
    """The first of ``paths`` that holds a number."""
    for path in paths:
        value = _xml_number(node, path)
        if value is not None:
            return value
    return None


def parse_nvidia_smi_xml(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -q -x`` output into the figures a result needs.

    Returns ``{"driver_version", "cuda_version", "attached_gpus", "gpus": [...]}``,
    each GPU with ``index`` (its place in the list, nvidia-smi's order),
    ``product_name``, ``uuid``, ``pci_bus_id``, ``compute_capability``,
    ``memory_total_mib``, ``memory_used_mib``, ``temperature_c``, ``power_draw_w``,
    ``power_limit_w``, ``sm_clock_mhz``, ``mem_clock_mhz`` (now) and
    ``sm_clock_max_mhz``, ``mem_clock_max_mhz`` (units such as ``"24564 MiB"``
    stripped). Missing or ``N/A`` values are ``None``. Text that is not XML raises
    ``ValueError``.
    """
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -x output is not XML: {exc}") from exc
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        gpus.append(
            {
                "index": index,
                "product_name": _xml_raw(gpu, "product_name"),
                "uuid": _xml_raw(gpu, "uuid"),
                "pci_bus_id": _xml_raw(gpu, "pci/pci_bus_id"),
                # <compute_cap> appears in the logs of recent drivers only (seen in 550-series
                # samples; the release that added it is unconfirmed): None before.
                "compute_capability": _xml_raw(gpu, "compute_cap"),
                "memory_total_mib": _xml_number(gpu, "fb_memory_usage/total"),
                "memory_used_mib": _xml_number(gpu, "fb_memory_usage/used"),
                "temperature_c": _xml_number(gpu, "temperature/gpu_temp"),
                "power_draw_w": _first_number(gpu, _POWER_DRAW),
                "power_limit_w": _first_number(gpu, _POWER_LIMIT),
                "sm_clock_mhz": _xml_number(gpu, "clocks/sm_clock"),
                "mem_clock_mhz": _xml_number(gpu, "clocks/mem_clock"),
                "sm_clock_max_mhz": _xml_number(gpu, "max_clocks/sm_clock"),
                "mem_clock_max_mhz": _xml_number(gpu, "max_clocks/mem_clock"),
            }
        )
    return {
        # Versions stay text: "12.10" is not the number 12.1.
        "driver_version": _xml_raw(root, "driver_version"),
        "cuda_version": _xml_raw(root, "cuda_version"),
        "attached_gpus": _xml_number(root, "attached_gpus"),
        "gpus": gpus,
    }


# Words that name the vendor, brand line, form factor or memory type: they differ
# between a provider's offer name and nvidia-smi's product name for the same card.
_IGNORED_WORDS = {
    "nvidia", "geforce", "tesla", "quadro", "generation",
    "pcie", "pci", "sxm", "sxm2", "sxm3", "sxm4", "sxm5",
    "hbm", "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7",
}
_MEMORY_SIZE = re.compile(r"(\d+)\s*gi?b\b")


def _gpu_name_key(name: str) -> tuple[list[str], set[str]]:
    """Significant tokens (sorted) and memory sizes of a GPU name."""
    text = name.lower().replace("pci-e", "pcie")
    memory = set(_MEMORY_SIZE.findall(text))
    text = _MEMORY_SIZE.sub(" ", text)
    tokens: list[str] = []
    for word in re.split(r"[^a-z0-9]+", text):
        if not word or word in _IGNORED_WORDS:
            continue
        # "RTX4090" and "RTX 4090" are the same name: split at letter/digit changes.
        tokens.extend(re.findall(r"[a-z]+|[0-9]+", word))
    return sorted(tokens), memory


def gpu_name_matches(expected_gpu_type: str, product_name: str) -> bool:
    """Whether nvidia-smi's ``product_name`` is the GPU an offer's ``gpu_type`` promised.

    Case, spaces, punctuation, vendor words (NVIDIA, GeForce, Tesla, Quadro), form
    factors (PCIe, SXM4, ...) and memory types (HBM3, ...) are ignored; every other
    word must appear on both sides, so variant suffixes keep cards apart: "RTX 5070"
    does not match "RTX 5070 Ti", "H200" does not match "H200 NVL". A memory size
    ("80GB") must agree when both names state one and is ignored when only one does,
    so "H100" matches "NVIDIA H100 80GB HBM3" but "A100 80GB" does not match
    "NVIDIA A100-SXM4-40GB".
    """
    expected_tokens, expected_memory = _gpu_name_key(expected_gpu_type)
    actual_tokens, actual_memory = _gpu_name_key(product_name)
    if not expected_tokens or expected_tokens != actual_tokens:
        return False
    return not (expected_memory and actual_memory) or expected_memory == actual_memory


def gpu_type_of(product_name: str) -> str:
    """The inventory-style name of nvidia-smi's ``product_name``, for results that only have the latter.

    The words :func:`gpu_name_matches` ignores (vendor, brand line, form factor, memory
    type) are dropped and ``-`` becomes a space: "NVIDIA GeForce RTX 4090" -> "RTX 4090",
    "NVIDIA A100-SXM4-80GB" -> "A100 80GB", "NVIDIA H100 80GB HBM3" -> "H100 80GB".
    So ``gpu_name_matches(gpu_type_of(name), name)`` holds. Empty for an empty name.
    """
    words = re.sub(r"(?i)pci-e", "PCIe", product_name).replace("-", " ").split()
    return " ".join(word for word in words if word.lower() not in _IGNORED_WORDS)
