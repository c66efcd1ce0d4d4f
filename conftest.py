"""The repository's own test setup: pytester for plugin tests."""

pytest_plugins = ["pytester"]
