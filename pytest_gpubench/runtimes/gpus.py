"""Which GPUs a cell's server runs on: how many (the matrix's ``gpus:``) and which (a provider's lease).

A provider that rents a whole machine leaves ``SshDetails.gpu_indices`` empty (the
machine has exactly the cell's GPUs: offers are chosen by count); one that shares a
machine (``hosts``, ``local``) fills it with the GPUs it leased to the cell. Every
server a runtime starts gets ``CUDA_VISIBLE_DEVICES`` set to those indices when there
are any (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: the indices are nvidia-smi's, in PCI bus
order), so it never touches another cell's GPUs, and spans ``count`` GPUs its own
way: a tensor-parallel flag (vLLM, SGLang, TGI), Ollama's ``OLLAMA_SCHED_SPREAD``, the
layers llama.cpp splits over the GPUs it sees, Docker's ``--gpus "device=0,1"``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import Stage, StageError


@dataclass(frozen=True)
class GpuPlacement:
    """The GPUs of one machine a cell's server runs on."""

    #: GPUs the server spans (the cell's ``gpus``).
    count: int = 1
    #: The machine's GPUs (nvidia-smi indices) the cell's server runs on; empty: all of them.
    indices: tuple[int, ...] = ()

    @classmethod
    def of(cls, count: int = 1, indices: Iterable[int] = ()) -> GpuPlacement:
        """A checked placement: whole, distinct, non-negative indices, at least ``count`` of them when given.

        The server gets the first ``count`` of them: a runtime with one server per machine (Ollama, a
        worker) leases the whole machine so no other cell shares its server, but spans only the cell's GPUs."""
        given = tuple(indices)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in given) or len(set(given)) < len(given):
            raise StageError(Stage.RUNTIME_SETUP, f"GPU indices {list(given)} are not distinct whole numbers >= 0")
        if given and len(given) < count:
            raise StageError(Stage.RUNTIME_SETUP, f"the cell spans {count} GPUs but was given {len(given)}: "
                                                   f"{list(given)}")
        count = max(1, int(count))
        return cls(count=count, indices=given[:count])

    @property
    def visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES``'s value: ``"0,1"``; ``""`` when the cell may use every GPU."""
        return ",".join(map(str, self.indices))

    def owns(self, gpu: int) -> bool:
        """Whether nvidia-smi's GPU ``gpu`` is the cell's: any GPU without indices, else one of them."""
        return not self.indices or gpu in self.indices

    def environment(self) -> dict[str, str]:
        """The variables a server started for the cell gets: ``CUDA_VISIBLE_DEVICES`` with the indices,
        and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers the GPUs as nvidia-smi (and the lease) does;
        by default CUDA puts the fastest first, and on a machine with mixed GPUs ``1`` would be another card."""
        if not self.indices:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": self.visible_devices}

    def shell_prefix(self) -> str:
        """``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 `` before a command (quoted), or ``""``."""
        return "".join(f"{name}={shlex.quote(value)} " for name, value in self.environment().items())

    @property
    def docker_devices(self) -> str:
        """Docker's ``--gpus`` value: ``device=0`` or ``"device=0,1"`` (quoted: Docker reads the option as
        CSV, where a bare comma would split it); the given GPUs, else the first ``count``."""
        devices = ",".join(map(str, self.indices or range(self.count)))
        return f'"device={devices}"' if "," in devices else f"device={devices}"

    def describe(self, tensor_parallel: int | None) -> dict[str, Any]:
        """What the result records: the GPUs spanned, the tensor-parallel size (None: the server
        spreads layers instead), and the visible devices ("": all of the machine's)."""
        return {"count": self.count, "tensor_parallel": tensor_parallel, "visible_devices": self.visible_devices}
