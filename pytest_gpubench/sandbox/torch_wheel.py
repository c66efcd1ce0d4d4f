"""The stand-in ``torch`` on a sandbox instance: importable at once, or installable with pip.

An instance has the stand-in (:mod:`.torch_standin`) as the package ``torch`` in its
``python/`` directory, which is on its ``PYTHONPATH``, so ``python3 -c 'import torch'``
works as on an image with torch. An instance booted without it (the ``missing_tools``
fault with ``torch``) has instead a wheel of it in ``wheels/``, and its environment says
``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=<wheels>``: the plugin's ``python3 -m venv`` and
``pip install torch`` then install the stand-in into the venv, offline, as they would
install the real torch from PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

#: The version pip sees (the package's ``__version__`` adds the sandbox's local label).
WHEEL_VERSION = "2.5.1"
STANDIN = Path(__file__).with_name("torch_standin.py")


def write_torch_package(python_dir: Path) -> None:
    """``python_dir/torch/__init__.py``: the stand-in, importable as ``torch``."""
    package = python_dir / "torch"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STANDIN.read_text(encoding="utf-8"), encoding="utf-8")


def build_torch_wheel(directory: Path) -> Path:
    """A pure-Python wheel of the stand-in in ``directory`` (for ``pip install torch``); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"torch-{WHEEL_VERSION}.dist-info"
    files = {
        "torch/__init__.py": STANDIN.read_bytes(),
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: torch\nVersion: {WHEEL_VERSION}\n"
                                  "Summary: gpubench sandbox stand-in for torch\n").encode(),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: pytest-gpubench sandbox\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"torch-{WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
