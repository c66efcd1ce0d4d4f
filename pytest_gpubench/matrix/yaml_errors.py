"""YAML with line numbers, and pydantic errors as one line a person can act on.

Matrix files are validated with pydantic; its error dumps are replaced by the
first problem's dotted field path (``matrix[2].workload.duration``), a message
saying what is allowed, the line in the file, and how many more problems there are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import MatrixError, dotted


def describe(value: Any) -> str:
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


#: How deep a YAML document may nest (a matrix nests about seven levels). PyYAML composes
#: nodes recursively: past this, its pure-Python composer raised RecursionError and libyaml's
#: (C) composer overflowed the C stack, killing the interpreter (30,000 ``[`` in a file).
MAX_DEPTH = 100


class _UniqueKeys:
    """Refuses duplicate keys (PyYAML silently keeps the last), and nesting deeper than
    :data:`MAX_DEPTH` (both composers call ``descend_resolver`` once per node, going down)."""

    _depth = 0

    def descend_resolver(self, current_node: yaml.Node | None, current_index: Any) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                              getattr(current_node, "start_mark", None))
        super().descend_resolver(current_node, current_index)  # type: ignore[misc]

    def ascend_resolver(self) -> None:
        self._depth -= 1
        super().ascend_resolver()  # type: ignore[misc]

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


class _Loader(_UniqueKeys, yaml.SafeLoader):
    """Safe YAML in pure Python: what a YAML error is reported from."""


#: The same with libyaml's parser (when PyYAML has it): a 10,000-cell matrix parses
#: in a sixth of the time. Its nodes carry the same lines; its error texts differ.
_FastLoader: type = type("_FastLoader", (_UniqueKeys, yaml.CSafeLoader), {}) \
    if getattr(yaml, "__with_libyaml__", False) else _Loader


def parse_yaml(text: str, source: str, error: type[MatrixError] = MatrixError) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data; YAML that does not parse is an
    ``error`` (the file's own kind: a hosts inventory's is an InventoryError, which its callers catch)."""
    if _FastLoader is not _Loader:
        try:
            return _load(_FastLoader, text)
        except yaml.YAMLError:
            pass  # the pure-Python parser says what is wrong, in the words users have seen
    try:
        return _load(_Loader, text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        problem = f"{context}: {problem}" if context else problem
        field = f"line {mark.line + 1}" if mark else ""
        column = f" (column {mark.column + 1})" if mark else ""
        raise error(source, field, f"invalid YAML: {problem}{column}") from None


Checked = TypeVar("Checked", bound=BaseModel)


def read_text(path: str | os.PathLike[str], error: type[MatrixError] = MatrixError, source: str = "") -> str:
    """The UTF-8 text of the file at ``path``; a file that is not UTF-8, a folder, or one that cannot be
    read is an ``error`` naming ``source`` (default the path) and what is wrong, in one line."""
    source = source or str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(source, "", f"the file is not UTF-8 text (byte {exc.start} is invalid); "
                                "save it as UTF-8") from None
    except OSError as exc:
        raise error(source, "", f"cannot read the file: {exc.strerror or exc}") from None


def validate_file(path: str, model: type[Checked], error: type[MatrixError], not_a_mapping: str,
                  **extra: Any) -> tuple[Checked, yaml.Node | None]:
    """The YAML file at ``path`` validated as ``model`` (with ``extra`` keys; relative paths resolve
    against its folder), and its node tree for line numbers. A problem is an ``error`` naming the
    file, the field and the line; a document that is not a mapping says ``not_a_mapping``."""
    root, data = parse_yaml(read_text(path, error), path, error)
    if not isinstance(data, dict):
        raise error(path, "", not_a_mapping)
    try:
        return model.model_validate({**data, **extra}, context={"base_dir": str(Path(path).parent)}), root
    except ValidationError as exc:
        found = translate(exc, path, root)
        raise error(path, found.field, str(found).removeprefix(f"{path}: {found.field}: ")) from None


def load_while_unchanged(path: str | os.PathLike[str], load: Callable[[str, int], Checked],
                         error: type[MatrixError], what: str) -> Checked:
    """``load(resolved path, modification time)``: a loader cached by both (``functools.lru_cache``)
    reads a file again only once it changed. A file that cannot be read is an ``error``."""
    resolved = Path(path).expanduser().resolve()
    try:
        mtime = resolved.stat().st_mtime_ns
    except OSError as exc:
        raise error(str(resolved), "", f"cannot read {what}: {exc.strerror or exc}") from None
    return load(str(resolved), mtime)


def _load(loader_class: type, text: str) -> tuple[yaml.Node | None, Any]:
    loader = loader_class(text)
    try:
        root = loader.get_single_node()
        return root, None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def translate(exc: ValidationError, source: str, root: yaml.Node | None) -> MatrixError:
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
        message = f"must be a mapping (key: value); got {describe(first['input'])}"
    elif kind == "list_type":
        message = f"must be a list; got {describe(first['input'])}"
    else:
        message = first["msg"]
    message += at_line(node_line(root, loc))
    more = len(errors) - 1
    if more:
        message += f"; and {more} more problem{'s' if more > 1 else ''}"
    return MatrixError(source, dotted(loc), message)


def node_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
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


def at_line(line: int | None) -> str:
    return f" (line {line})" if line else ""
