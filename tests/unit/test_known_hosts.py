"""gpubench's pin file: a host key pinned once however many processes meet the host first, and a
second key for a pinned host refused (``remote/ssh.py``)."""

from __future__ import annotations

import asyncssh
import pytest

from pytest_gpubench.errors import HostKeyChanged
from pytest_gpubench.remote.ssh import known_keys, pin


def test_a_host_is_pinned_once_and_another_key_for_it_is_refused(tmp_path):
    """Two xdist workers meeting a new host both pin it: the second, under the file lock, finds the
    first's line and adds none; a worker that met another key is refused naming both."""
    pin_file = tmp_path / "gpubench" / "known_hosts"
    key = asyncssh.generate_private_key("ssh-ed25519")
    assert pin(str(pin_file), "127.0.0.1", 2222, key) is True
    assert pin(str(pin_file), "127.0.0.1", 2222, key) is False
    assert len(pin_file.read_text().splitlines()) == 1
    other = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(HostKeyChanged) as changed:
        pin(str(pin_file), "127.0.0.1", 2222, other)
    assert key.get_fingerprint() in str(changed.value) and other.get_fingerprint() in str(changed.value)
    assert pin(str(pin_file), "127.0.0.1", 2200, other) is True  # another port: another host


def test_ca_and_revoked_entries_are_kept(tmp_path):
    ca, bad, good = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(3))
    public = {name: k.export_public_key("openssh").decode().strip() for name, k in
              {"ca": ca, "bad": bad, "good": good}.items()}
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(f"@cert-authority [10.0.0.1]:2222 {public['ca']}\n")
    second.write_text(f"@revoked [10.0.0.1]:2222 {public['bad']}\n[10.0.0.1]:2222 {public['good']}\n")
    keys = known_keys([str(first), str(second)], "10.0.0.1", 2222)
    assert keys.known and keys.source == str(first) and not keys.trusted
    assert [k.get_fingerprint() for k in keys.ca] == [ca.get_fingerprint()]
    assert keys.is_revoked(bad) and not keys.is_revoked(good)

    # A revoked key alone (nothing trusts the host there): still found, for the port's name.
    only = tmp_path / "only_revoked"
    only.write_text(f"@revoked [10.0.0.1]:2222 {public['bad']}\n")
    alone = known_keys([str(only)], "10.0.0.1", 2222)
    assert not alone.known and alone.is_revoked(bad)
