"""The pytest side, and the only folder that imports pytest: hooks, collection, fixtures, xdist glue, terminal, lifecycle."""
