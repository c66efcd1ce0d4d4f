"""The sandbox chooses ports that servers bind later (Ollama's stand-in, OpenSSH's sshd)
outside the kernel's ephemeral range, where no bind(0) or outgoing connection can take
them in the meantime."""

from __future__ import annotations

import socket

import pytest

from pytest_gpubench.sandbox.instances import _ephemeral_low, free_port


def test_a_chosen_port_is_below_the_ephemeral_range_and_free():
    low = _ephemeral_low()
    for _ in range(50):
        port = free_port()
        assert 20000 <= port < min(low, 32768)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nobody holds it


def test_a_port_in_use_or_to_avoid_is_never_chosen(monkeypatch):
    import pytest_gpubench.sandbox.instances as instances

    port = next(p for p in (free_port() for _ in range(100)) if _bindable(p + 1))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        monkeypatch.setattr(instances, "_CHOSEN_PORTS", range(port, port + 2))
        assert {free_port() for _ in range(20)} == {port + 1}
        with pytest.raises(RuntimeError, match="no free loopback port"):
            free_port({port + 1})


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
