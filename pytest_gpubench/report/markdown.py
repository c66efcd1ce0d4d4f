"""``BENCHMARK_REPORT.md``: the report as Markdown, laid out like the GPU Shopper
team's own benchmark report (headline findings, leaderboards, a table per model,
provider head-to-head), plus failures by stage and spend.

Everything from the manifest is user data: :func:`cell` keeps it from breaking a
table row or turning into HTML where the Markdown is rendered.
"""

from __future__ import annotations

import re

from . import tables as fmt
from .frontier_view import FRONTIER_INTRO, NO_TARGETS, TARGETS_INTRO, headlines, setup_notes, target_table
from .comparison import RunComparison, comparison_intro, comparison_table, one_sided_lines
from .model import Report
from .sweep import SATURATION_INTRO, percentile_table, saturated, saturation_table, steps_table, sweep_table, sweeps
from .tables import HARDWARE_INTRO, MICROBENCH_INTRO, NO_HARDWARE, hardware_table, microbench_table, peak_sources

__all__ = ["cell", "comparison_markdown", "render_markdown"]

SWEEP_INTRO = ("Each GPU and model measured at several loads, per provider, lowest load first: what more load "
               "buys in output throughput and costs in latency (the HTML report draws it).")
PERCENTILES_INTRO = ("Per cell, in ms: time to first token, time per output token, inter-token latency and "
                     "end-to-end request latency (docs/metrics.md).")


#: What data may not bring into Markdown: HTML (``< > &``, as entities), a column break (``|``) and
#: every CommonMark punctuation that makes a link, an image, emphasis, code, a heading or strikethrough
#: (backslash-escaped: ``[x](https://evil)`` and ``![x](...)`` stay text).
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPED = frozenset("\\`*_[]()!#|~{}")
#: A list marker (``- x``, ``+ x``) where a text starts a line.
_LIST_MARKER = re.compile(r"^([-+])(?=\s|$)")


def cell(text: object) -> str:
    """``text`` safe inside Markdown (and a table cell): one line, no column break, no HTML, no link,
    image, emphasis or code span, no heading or list item where it starts a line."""
    value = " ".join(str(text).split())
    value = "".join(_ENTITIES.get(ch) or (f"\\{ch}" if ch in _ESCAPED else ch) for ch in value)
    return _LIST_MARKER.sub(r"\\\1", value)


def _table(table: fmt.Table) -> list[str]:
    lines = ["| " + " | ".join(table.header) + " |", "|" + "|".join("---" for _ in table.header) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in table.rows]
    return lines + [""]


def _bullets(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"- **{cell(lead)}**: {cell(text)}" for lead, text in pairs]


def comparison_markdown(comparison: RunComparison) -> list[str]:
    """The "Comparison" section (``gpubench report --compare``), also what the terminal shows."""
    lines = ["## Comparison", "", cell(comparison_intro(comparison)), ""]
    if comparison.cells:
        lines += _table(comparison_table(comparison))
    lines += [f"- {cell(line)}" for line in one_sided_lines(comparison)]
    return lines + ([""] if one_sided_lines(comparison) else [])


def render_markdown(report: Report, comparison: RunComparison | None = None) -> str:
    """The whole ``BENCHMARK_REPORT.md``; with ``comparison``, its section comes first."""
    lines = [f"# {report.title}", ""]
    if report.sandbox_note:
        lines += [f"> **{cell(report.sandbox_note)}**", ""]
    lines += ["  \n".join(f"**{cell(label)}**: {cell(text)}" for label, text in fmt.facts(report)), ""]
    if comparison is not None:
        lines += comparison_markdown(comparison)
    lines += ["## Headline findings", "", *_bullets(headlines(report)), ""]
    if report.frontiers:
        lines += ["## Frontiers", "", FRONTIER_INTRO + " The HTML report draws them.", ""]
        for group in report.frontiers:
            lines += [f"### {cell(group.name)}", ""]
            if group.answers:
                lines += [TARGETS_INTRO, "", *_table(target_table(group))]
            else:
                lines += [NO_TARGETS, ""]
            notes = setup_notes(group)
            lines += [f"- {cell(note)}" for note in notes] + ([""] if notes else [])
    lines += ["## Tokens/s leaderboard", "", fmt.TOKENS_INTRO, ""]
    for model, _, table in fmt.tokens_leaderboards(report):
        lines += [f"### {cell(model)}", "", *_table(table)]
    lines += ["## $ per million tokens leaderboard", "", fmt.COST_INTRO, ""]
    for model, _, table in fmt.cost_leaderboards(report):
        lines += [f"### {cell(model)}", "", *_table(table)]
    lines += ["## Results by model", ""]
    for table in report.models:
        lines += [f"### {cell(table.model)}", "", *_table(fmt.model_table(table))]
        lines += [" ".join(f"**{lead}**: {cell(text)}." for lead, text in fmt.picks(table)), ""]
        invalid = fmt.invalid_notes(table)
        lines += [f"- ! {cell(note)}" for note in invalid] + ([""] if invalid else [])
    found = sweeps(report)
    if found:
        lines += ["## Load sweeps", "", SWEEP_INTRO, ""]
        for sweep in found:
            lines += [f"### {cell(sweep.name)}", "", *_table(sweep_table(sweep))]
    swept = saturated(report)
    if swept:
        lines += ["## Saturation", "", SATURATION_INTRO, "", *_table(saturation_table(swept))]
        for row in swept:
            lines += [f"### {cell(row.machine)} / {cell(row.model)}: sweep steps", "",
                      *_table(steps_table(row))]
    if report.microbench:
        lines += ["## GPU microbenchmarks", "", MICROBENCH_INTRO, "", *_table(microbench_table(report)),
                  "Datasheet peaks:", "", *_bullets(peak_sources(report)), ""]
    lines += ["## Latency percentiles", "", PERCENTILES_INTRO, ""]
    for table in report.models:
        lines += [f"### {cell(table.model)}", ""]
        for row in table.rows:
            lines += [f"#### {cell(fmt.where(row))}", "", *_table(percentile_table(row))]
    lines += ["## Provider head-to-head", ""]
    if report.matchups:
        lines += [fmt.HEAD_TO_HEAD_INTRO, "", *_table(fmt.head_to_head_table(report))]
        lines += [f"- **{cell(w.provider)}**: faster in {w.faster} of {w.matchups}, cheaper in {w.cheaper} of "
                  f"{w.matchups} matchups" for w in report.provider_wins] + [""]
    else:
        lines += [fmt.NO_HEAD_TO_HEAD, ""]
    lines += ["## Hardware", ""]
    lines += ([HARDWARE_INTRO, "", *_table(hardware_table(report.machines))] if report.machines
              else [NO_HARDWARE, ""])
    lines += ["## Failures by stage", ""]
    if report.failures:
        lines += [fmt.FAILURES_INTRO, "", *_table(fmt.failure_table(report.failures))]
    else:
        lines += [fmt.NO_FAILURES, ""]
    if report.skipped:
        lines += ["### Skipped cells", "", *_table(fmt.failure_table(report.skipped, "Reason"))]
    lines += ["## Spend", "", fmt.SPEND_INTRO, "", *_table(fmt.spend_table(report))]
    notes = fmt.spend_notes(report)
    lines += [f"- {cell(note)}" for note in notes] + ([""] if notes else [])
    lines += ["## Figures", ""]
    lines += [f"- **{cell(name)}**: {cell(text)}." for name, text in (*fmt.FIGURES, *fmt.MARKS)]
    lines += ["", "See docs/report.md and docs/metrics.md."]
    return "\n".join(lines).rstrip("\n") + "\n"
