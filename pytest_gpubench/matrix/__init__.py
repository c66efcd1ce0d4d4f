"""Matrix files: the schema, its fields and workload, expansion into cells, names, ids and filters."""
