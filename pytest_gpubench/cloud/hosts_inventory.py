"""``hosts.yaml``: the inventory of machines the ``hosts`` provider benchmarks on (docs/providers.md).

::

    hosts:
      lab1:
        address: 10.0.0.5          # SSH host (name or IP)
        port: 22
        user: bench
        key_file: ~/.ssh/id_ed25519  # or `agent: true` (the running ssh-agent)
        gpu: RTX 4090
        gpus: 2                    # how many of them the machine has
        price_per_hour: 0          # declared cost of the whole machine; 0: owned
        tags: [lab, ada]
        keep_models: true          # models a run pulled stay as a cache (false: removed after the cell)
        known_hosts: ./known_hosts # checked before ~/.ssh/known_hosts; optional, must exist
    local:                         # this machine (`cloud: local`); optional
      price_per_hour: 0
      keep_models: true

A bad file is an :class:`~pytest_gpubench.errors.InventoryError` naming the file, the
field (``hosts.lab1.gpus``), the line and what is allowed. Relative paths (``key_file``,
``known_hosts``) are relative to the inventory's folder.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..errors import InventoryError
from ..matrix.fields import NAME_RE, StrictModel, describe, invalid
from ..matrix.yaml_errors import load_while_unchanged, validate_file

__all__ = ["Host", "HostsInventory", "LocalMachine", "load_inventory"]

#: What a host's port may be.
_PORTS = range(1, 65536)


def _named(value: Any, what: str) -> str:
    """A name-like word (letters, digits, '.', '_', '-'), or an error saying ``what`` it must be."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise invalid(f"must be {what} (letters, digits, '.', '_', '-'); got {describe(value)}")
    return value


def _path(value: Any, info: ValidationInfo, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"must be the path of {what}; got {describe(value)}")
    path = Path(value.strip()).expanduser()
    base = Path((info.context or {}).get("base_dir") or ".")
    return str((path if path.is_absolute() else base / path).resolve())


def _price_per_hour(value: Any) -> Any:
    """A machine's declared price (a host's or this machine's), checked."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1000:
        raise invalid(f"must be the machine's cost in dollars per hour from 0 to 1000 (0: owned); "
                      f"got {describe(value)}")
    return float(value)


class Host(StrictModel):
    """One machine of the inventory."""

    #: Its inventory name (the key), filled in by :class:`HostsInventory`.
    name: str = ""
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    agent: bool = False
    gpu: str
    gpus: int = Field(default=1)
    price_per_hour: float = 0.0
    tags: tuple[str, ...] = ()
    keep_models: bool = True
    known_hosts: str | None = None

    @field_validator("address", mode="before")
    @classmethod
    def _address(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value.strip() or any(ch.isspace() for ch in value.strip()):
            raise invalid(f"must be the SSH host name or IP address, such as '10.0.0.5'; got {describe(value)}")
        return value.strip()

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value not in _PORTS:
            raise invalid(f"must be a TCP port from 1 to 65535; got {describe(value)}")
        return value

    @field_validator("user", mode="before")
    @classmethod
    def _user(cls, value: Any) -> Any:
        return _named(value, "a user name")

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            raise invalid(f"must name the machine's GPU, such as 'RTX 4090'; got {describe(value)}")
        return value.strip()

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
            raise invalid(f"must be how many GPUs the machine has, from 1 to 64; got {describe(value)}")
        return value

    _price = field_validator("price_per_hour", mode="before")(_price_per_hour)

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise invalid(f"must be a list of tags, such as [lab, ada]; got {describe(value)}")
        return tuple(_named(tag, "a list of tags") for tag in value)

    @field_validator("key_file", mode="before")
    @classmethod
    def _key_file(cls, value: Any, info: ValidationInfo) -> Any:
        path = _path(value, info, "a private key file, such as '~/.ssh/id_ed25519'")
        if not Path(path).is_file():
            raise invalid(f"no such file: {path!r}")
        return path

    @field_validator("known_hosts", mode="before")
    @classmethod
    def _known_hosts(cls, value: Any, info: ValidationInfo) -> Any:
        path = _path(value, info, "a known_hosts file")
        # A file that is not there would leave the host to trust on first use: the key the
        # user meant to check against would silently check nothing (issue 21 item 7).
        if not Path(path).is_file():
            raise invalid(f"no such file: {path!r} (a known_hosts file the host's SSH key is checked against)")
        return path

    @model_validator(mode="after")
    def _one_way_in(self) -> Host:
        if self.key_file is None and not self.agent:
            raise invalid("needs `key_file: PATH` (a private key) or `agent: true` (the running ssh-agent)")
        if self.key_file is not None and self.agent:
            raise invalid("give `key_file` or `agent: true`, not both")
        return self

    def matches(self, wanted: str) -> bool:
        """Whether a matrix row's ``provider:`` picks this host: ``hosts`` (any), its name or a tag."""
        wanted = wanted.lower()
        return wanted == "hosts" or wanted == self.name.lower() or wanted in (t.lower() for t in self.tags)


class LocalMachine(StrictModel):
    """What the inventory declares of this machine (``cloud: local``)."""

    price_per_hour: float = 0.0
    keep_models: bool = True

    _price = field_validator("price_per_hour", mode="before")(_price_per_hour)


class HostsInventory(StrictModel):
    """A whole ``hosts.yaml``."""

    #: The file it was read from.
    source: str = ""
    hosts: dict[str, Host] = {}
    local: LocalMachine = LocalMachine()

    @field_validator("hosts", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, host in value.items():
                _named(name, "a host name")
                if isinstance(host, dict):
                    host.setdefault("name", name)
        return value


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int) -> HostsInventory:
    inventory, _ = validate_file(path, HostsInventory, InventoryError,
                                 "must be a mapping with `hosts:` (name -> host); see docs/providers.md", source=path)
    return inventory


def load_inventory(path: str | os.PathLike[str]) -> HostsInventory:
    """Read and check the inventory at ``path`` (cached while the file is unchanged)."""
    return load_while_unchanged(path, _load, InventoryError, "the hosts inventory")
