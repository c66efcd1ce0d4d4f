"""The report: figures gathered from the manifest, as Markdown and as an HTML page with charts."""
