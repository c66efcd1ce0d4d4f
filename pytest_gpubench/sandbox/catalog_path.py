"""Where the shipped sandbox catalog is: a module of its own, so that reading its GPU
names (``hints``) does not import the sandbox."""

from pathlib import Path

DEFAULT_CATALOG = Path(__file__).with_name("catalog.yaml")
