"""The ``gpubench`` command: plan, report, offers, cleanup, import, export, browse."""
