"""The repository's own test setup: pytester for plugin tests, and the short filter flags.

This is a benchmark repository, so its command lines may say ``pytest matrix/ --gpu
RTX4090``: ``add_short_filters`` gives this project ``--gpu``, ``--provider`` and
``--model`` (the plugin alone takes only ``--gpubench-gpu`` etc., never the bare
names other projects may use).
"""

from pytest_gpubench.options import add_short_filters

pytest_plugins = ["pytester"]


def pytest_addoption(parser):
    add_short_filters(parser)
