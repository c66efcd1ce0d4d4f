"""The report's files: ``BENCHMARK_REPORT.md`` and ``index.html``."""

from __future__ import annotations

from pathlib import Path

from .html import render_html
from .markdown import render_markdown
from .model import Report

MARKDOWN_NAME, HTML_NAME = "BENCHMARK_REPORT.md", "index.html"


def write_reports(report: Report, directory: Path) -> tuple[Path, Path]:
    """Write ``BENCHMARK_REPORT.md`` and ``index.html`` into ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    markdown, html = directory / MARKDOWN_NAME, directory / HTML_NAME
    markdown.write_text(render_markdown(report), encoding="utf-8")
    html.write_text(render_html(report), encoding="utf-8")
    return markdown, html
