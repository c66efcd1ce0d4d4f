"""``model_presets.yaml``: the container workers of seed 004, by model name.

The file has the shape the seed's GPU service reads::

    models:
      NAME:
        inference:
          docker_image: "loading-worker:latest"     # required
          command: ["python", "/app/worker.py"]     # optional: the image's CMD otherwise
          env_vars: {MODEL_NAME: "test-loading"}   # optional: strings only

A matrix names it with ``runtime: {name: worker, presets: PATH}`` (relative to the
matrix file) and each cell's model must be a key of ``models``. Everything in it
reaches the instance's shell through ``docker run``, so it is validated here, at
collection: an image reference, environment names and printable values, command
words. Every problem is a :class:`~pytest_gpubench.errors.MatrixError` naming the file, the key path and
what is allowed (never a traceback); :mod:`..runtimes.worker` quotes what passes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MatrixError
from .fields import is_image_reference
from .yaml_errors import describe, parse_yaml

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Set by the runtime itself for every worker (seed 004); a preset may override MODEL_NAME only.
RESERVED_ENV = ("MODEL_PATH", "GPU_DEVICE")
_KEYS = {"docker_image", "command", "env_vars"}


@dataclass(frozen=True)
class WorkerPreset:
    """One model's worker: the image, its command (empty: the image's own) and extra environment."""

    model: str
    docker_image: str
    command: tuple[str, ...] = ()
    env_vars: tuple[tuple[str, str], ...] = ()


def _printable(value: str) -> bool:
    return value.isprintable() and 0 < len(value) <= 1000


def parse_preset(path: str, model: str, entry: Any) -> WorkerPreset:
    """Validate ``models.MODEL`` of the file at ``path``."""
    where = f"models.{model}" if model.isprintable() else f"models.{model!r}"  # the error stays one line
    if not isinstance(entry, Mapping) or not isinstance(entry.get("inference"), Mapping):
        raise MatrixError(path, where, f"must be a mapping with `inference: {{docker_image: ...}}`; "
                                        f"got {describe(entry)}")
    inference = entry["inference"]
    where += ".inference"
    unknown = sorted(set(map(str, inference)) - _KEYS)
    if unknown:
        raise MatrixError(path, f"{where}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(_KEYS))}")
    image = inference.get("docker_image")
    if image is None:
        raise MatrixError(path, f"{where}.docker_image", "missing: every worker needs a docker_image "
                                                          "such as 'loading-worker:latest'")
    if not is_image_reference(image):
        raise MatrixError(path, f"{where}.docker_image", f"must be a Docker image reference such as "
                                                          f"'registry.example.com/team/worker:1.2'; got {image!r}")
    command = inference.get("command") or []
    if not isinstance(command, list) or not all(isinstance(w, str) and _printable(w) for w in command):
        raise MatrixError(path, f"{where}.command", f"must be a list of words such as "
                                                     f"['python', '/app/worker.py'], each printable text; "
                                                     f"got {describe(command)}")
    env = inference.get("env_vars") or {}
    if not isinstance(env, Mapping):
        raise MatrixError(path, f"{where}.env_vars", f"must be a mapping of NAME: 'value'; got {describe(env)}")
    pairs = []
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise MatrixError(path, f"{where}.env_vars", f"{name!r} is not an environment variable name "
                                                          "(letters, digits and _, not first a digit)")
        if name in RESERVED_ENV:
            raise MatrixError(path, f"{where}.env_vars.{name}", "is set by gpubench for every worker "
                                                                 f"({', '.join(RESERVED_ENV)}); remove it")
        if not isinstance(value, str) or not (value == "" or _printable(value)):
            raise MatrixError(path, f"{where}.env_vars.{name}", f"must be a string (quote it in YAML) of "
                                                                 f"printable text; got {describe(value)}")
        pairs.append((name, value))
    return WorkerPreset(model=model, docker_image=image, command=tuple(command), env_vars=tuple(pairs))


def load_presets(path: str | Path) -> dict[str, WorkerPreset]:
    """Every model of the presets file at ``path``, validated."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MatrixError(shown, "", f"the presets file is not UTF-8 text (byte {exc.start} is invalid); "
                                     "save it as UTF-8") from None
    except OSError as exc:
        raise MatrixError(shown, "", f"cannot read the presets file: {exc.strerror or exc}") from None
    _, data = parse_yaml(text, shown)  # the matrix's own YAML: its errors, its bound on nesting
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping) or not data["models"]:
        raise MatrixError(shown, "models", "the file needs `models:` mapping model names to "
                                            "`{inference: {docker_image: ...}}` (seed 004's model_presets.yaml)")
    return {str(name): parse_preset(shown, str(name), entry) for name, entry in data["models"].items()}
