"""The clouds of machines a run does not rent but finds and leaves as it found them.

``cloud: hosts`` benchmarks on the machines of an inventory (``hosts.yaml``, named by the
matrix's top-level ``hosts:`` or ``--gpubench-hosts``); ``cloud: local`` on this machine.
Their providers (``cloud/hosts_provider.py``) lease GPUs instead of renting sessions, so a
cell's session is its own (``reuse: cell``): nothing is paid per session, and each cell
holds only its own GPUs, which lets workers spread cells over hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .fields import describe, invalid

HOSTS_CLOUD = "hosts"
LOCAL_CLOUD = "local"
#: Clouds whose machines stay after a run: servers a cell started are stopped in its teardown.
KEPT_MACHINES = frozenset({HOSTS_CLOUD, LOCAL_CLOUD})


def hosts_file(value: Any, base_dir: Path) -> str:
    """The inventory's path; a relative one is relative to the matrix file's folder."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the path of a hosts inventory, such as 'hosts.yaml'; got {describe(value)}")
    path = Path(value.strip()).expanduser()
    return str((path if path.is_absolute() else base_dir / path).resolve())
