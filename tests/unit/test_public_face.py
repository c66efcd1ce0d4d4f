"""The package's public face: a curated ``__all__`` whose names resolve, a version,
and nothing heavy imported until a name is used."""

import importlib.metadata
import subprocess
import sys

import pytest_gpubench


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in pytest_gpubench.__all__:
        value = getattr(pytest_gpubench, name)
        assert value is not None
        if name != "__version__":
            assert value.__name__ == name and value.__module__.startswith("pytest_gpubench.")


def test_the_version_is_the_installed_distribution_s():
    assert pytest_gpubench.__version__ == importlib.metadata.version("pytest-gpubench")


def test_importing_the_package_imports_nothing_heavy():
    code = ("import sys, pytest_gpubench; "
            "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'asyncssh', 'httpx', 'pytest_gpubench.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error():
    try:
        pytest_gpubench.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
