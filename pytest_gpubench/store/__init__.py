"""Where outcomes go: the SQLite manifest, progress files, export and resume."""
