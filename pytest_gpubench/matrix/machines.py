"""The clouds of machines a run does not rent but finds and leaves as it found them.

``cloud: hosts`` benchmarks on the machines of an inventory (``hosts.yaml``, named by the
matrix's top-level ``hosts:`` or ``--gpubench-hosts``); ``cloud: local`` on this machine.
Their providers (``cloud/hosts_provider.py``) lease GPUs instead of renting sessions, so a
cell's session is its own (``reuse: cell``): nothing is paid per session, and each cell
holds only its own GPUs, which lets workers spread cells over hosts.
"""

from __future__ import annotations

HOSTS_CLOUD = "hosts"
LOCAL_CLOUD = "local"
#: Clouds whose machines stay after a run: servers a cell started are stopped in its teardown.
KEPT_MACHINES = frozenset({HOSTS_CLOUD, LOCAL_CLOUD})

