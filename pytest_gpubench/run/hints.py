"""Names that match nothing: which values exist, and the close ones.

Two places a person's name for something meets the names the matrix or the market uses:

* ``--gpu``/``--provider``/``--model`` filters that select no cell:
  :func:`no_match_message` says which values the matrix files have
  ("no cell has GPU '4090'; GPUs in these matrix files: A100 80GB, RTX 3090, RTX 4090").
* A GPU name in a matrix that no known GPU has: :func:`gpu_name_problem`. At
  collection there is no network, so "known" means :data:`KNOWN_GPUS` (the GPU names
  of the seeds) and the sandbox catalog's GPUs. The market has GPUs neither lists, so
  an unknown name is only a warning with the close names; it is an error only when it
  is a known name with two neighbouring characters swapped ("RTX 4900" for
  "RTX 4090"), a typo no real product name is (GPU names differ from their siblings by
  a changed digit or an added suffix, like RTX 5090 or L40S, never by a swap).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..matrix.selection import filter_values, gpu_matches, model_matches, normalize_gpu, provider_matches, split_tag

#: GPU names the seeds use (examples, matrices and progress lines).
KNOWN_GPUS: tuple[str, ...] = (
    "A100 80GB", "H100", "H200 NVL", "L40", "RTX 3090", "RTX 4080", "RTX 4090", "RTX 5060 Ti",
    "RTX 5070", "RTX 5090",
)
#: How many values a message lists before "...".
SHOWN = 12
#: difflib's similarity cutoff for "close" names (on normalised names).
CLOSE = 0.6


@lru_cache(maxsize=1)
def known_gpus() -> tuple[str, ...]:
    """:data:`KNOWN_GPUS` and the sandbox catalog's GPU names, sorted, once per process."""
    names = set(KNOWN_GPUS)
    try:
        names.update(_catalog_gpu_names())
    except Exception:  # noqa: BLE001 - the seeds' names are enough to check against
        pass
    return tuple(sorted(names))


def _catalog_gpu_names() -> set[str]:
    """The GPU names of the shipped sandbox catalog: its ``gpus`` keys and its offers'
    ``gpu_type``. Read as plain YAML: validating the whole catalog (``load_catalog``)
    would cost a large matrix's collection a third of a second for a list of names."""
    import yaml

    from ..sandbox import DEFAULT_CATALOG

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(DEFAULT_CATALOG.read_text(encoding="utf-8"), Loader=loader) or {}
    names = {str(name) for name in data.get("gpus") or {}}
    names.update(str(offer["gpu_type"]) for offer in data.get("offers") or [] if "gpu_type" in offer)
    return names


def close_names(wanted: str, names: Iterable[str], normalize: Callable[[str], str] = normalize_gpu) -> list[str]:
    """The names in ``names`` closest to ``wanted`` (difflib, on normalised forms), best first."""
    import difflib  # only when a name matched nothing: plugin loading stays light

    by_key: dict[str, str] = {}
    for name in names:
        by_key.setdefault(normalize(name), name)
    found = difflib.get_close_matches(normalize(wanted), list(by_key), n=3, cutoff=CLOSE)
    return [by_key[key] for key in found]


def _swapped(a: str, b: str) -> bool:
    """True if ``a`` is ``b`` with two neighbouring (different) characters swapped."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def gpu_name_problem(name: str, known: Sequence[str] | None = None) -> tuple[str, str] | None:
    """``None`` for a known GPU name, else ``("error" | "warning", message)``.

    An error for a known name with two neighbouring characters swapped; a warning,
    naming the close names if any, for every other unknown name (the inventory may
    well offer it).
    """
    key = normalize_gpu(name)
    if known is None:
        if any(normalize_gpu(k) == key for k in KNOWN_GPUS):
            return None  # without reading the catalog: collection stays quick
        known = known_gpus()
    if any(normalize_gpu(k) == key for k in known):
        return None
    typo = [k for k in known if _swapped(key, normalize_gpu(k))]
    if typo:
        return "error", (f"no GPU is called {name!r}: did you mean {_or(typo)}? (two characters swapped; "
                         "GPU names are matched exactly, ignoring case, spaces, '-' and '_')")
    close = close_names(name, known)
    hint = f"close known names: {', '.join(close)}" if close else f"known names: {_listed(known)}"
    return "warning", (f"GPU {name!r} is not one the sandbox catalog or the seeds know ({hint}); "
                       "if the inventory offers it, fine; else the cell will find no offer "
                       "(`gpubench offers` lists what can be rented now)")


class UnknownGpuWarning(UserWarning):
    """A matrix names a GPU that neither the seeds nor the sandbox catalog know."""


class HostKeyPinnedWarning(UserWarning):
    """A host's SSH key was in no known_hosts file: trusted on first use and pinned."""


def host_key_pinned(recorder: Any, ssh: Any) -> Callable[[str, Path], None]:
    """What ``connect`` calls when a host's key is pinned on first use: it is said plainly, as a
    ``HOST_KEY_PINNED`` progress line and a warning in the terminal summary."""

    def said(fingerprint: str, pin_file: Path) -> None:
        recorder.progress.status("HOST_KEY_PINNED", fingerprint=fingerprint, known_hosts=str(pin_file))
        warnings.warn(HostKeyPinnedWarning(
            f"{recorder.record_key}: the SSH host key of {ssh.host}:{ssh.port} was in no known_hosts file; "
            f"trusted on first use and pinned ({fingerprint}) in {pin_file}: later runs refuse another key"))

    return said


def check_gpu_names(cells: Iterable[Any]) -> tuple[list[tuple[Any, str]], list[tuple[Any, str]]]:
    """The matrix cells' GPU names, checked once per name: ``(errors, warnings)``, each a
    list of ``(first cell with that name, "matrix[ROW].gpu: message")``."""
    found: dict[str, list[tuple[Any, str]]] = {"error": [], "warning": []}
    seen: set[str] = set()
    for cell in cells:
        if cell.gpu in seen or getattr(cell, "endpoint", None) is not None:
            continue  # a running endpoint's GPU is what its owner says it is: nothing is rented by that name
        seen.add(cell.gpu)
        problem = gpu_name_problem(cell.gpu)
        if problem is not None:
            kind, message = problem
            found[kind].append((cell, f"matrix[{cell.row}].gpu: {message}"))
    return found["error"], found["warning"]


# ------------------------------------------------------------ filters matching nothing

_FILTERS: tuple[tuple[str, str, str, Callable[[str, str], bool]], ...] = (
    ("gpu", "GPU", "GPUs", gpu_matches),
    ("provider", "provider", "providers", provider_matches),
    ("model", "model", "models", model_matches),
)


def no_match_message(
    cells: Sequence[Any],
    gpus: Iterable[str] | None = (),
    providers: Iterable[str] | None = (),
    models: Iterable[str] | None = (),
    where: str = "these matrix files",
) -> str | None:
    """Why the filters select none of ``cells``, with the values that exist; ``None``
    when some cell passes them (or no filter is given, or there are no cells)."""
    wanted = {"gpu": filter_values(gpus), "provider": filter_values(providers), "model": filter_values(models)}
    if not cells or not any(wanted.values()):
        return None
    lines: list[str] = []
    for attr, label, plural, match in _FILTERS:
        values = wanted[attr]
        have = sorted({getattr(cell, attr) for cell in cells})
        for value in values:
            if not any(match(value, h) for h in have):
                normalize = normalize_gpu if attr == "gpu" else _lower
                close = close_names(value, have, normalize)
                if attr == "model":
                    close += [h for h in have if h not in close and _same_family(value, h)]
                guess = f" (close: {', '.join(close)})" if close else ""
                lines.append(f"no cell has {label} {value!r}{guess}; {plural} in {where}: {_listed(have)}")
    if lines:
        return "\n".join(lines)
    # Every value matches some cell, but no cell matches them all together.
    def passes(cell: Any, attrs: Iterable[str]) -> bool:
        return all(any(match(w, getattr(cell, attr)) for w in wanted[attr])
                   for attr, _, _, match in _FILTERS if attr in attrs)

    given = [attr for attr, _, _, _ in _FILTERS if wanted[attr]]
    if any(passes(cell, given) for cell in cells):
        return None
    labels = {attr: (label, plural) for attr, label, plural, _ in _FILTERS}
    together = " and ".join(f"{labels[a][0]} {', '.join(repr(v) for v in wanted[a])}" for a in given)
    for attr in reversed(given):  # the last filter given is the likeliest to be loosened
        others = [a for a in given if a != attr]
        kept = [cell for cell in cells if passes(cell, others)]
        if kept:
            which = " and ".join(f"{labels[a][0]} {', '.join(wanted[a])}" for a in others)
            have = sorted({getattr(cell, attr) for cell in kept})
            return f"no cell has {together} together; {labels[attr][1]} of the cells with {which}: {_listed(have)}"
    combos = sorted({f"{c.gpu} / {c.provider} / {c.model}" for c in cells})
    return f"no cell has {together} together; cells (GPU / provider / model) in {where}: {_listed(combos)}"


def _lower(text: str) -> str:
    return text.strip().lower()


def _same_family(wanted: str, model: str) -> bool:
    return split_tag(wanted.strip().lower())[0] in split_tag(model.lower())[0]


def _listed(values: Sequence[str]) -> str:
    return ", ".join(values[:SHOWN]) + (f", ... ({len(values)} in all)" if len(values) > SHOWN else "")


def _or(values: Sequence[str]) -> str:
    return " or ".join(values)
