"""``index.html``: the report as one self-contained page that works offline.

Inline CSS, inline SVG charts (:mod:`.report_charts`) and a few lines of inline
JavaScript that sort a table when its header is clicked. A Content-Security-Policy
forbids every fetch, so the page cannot depend on the network by accident. Every
string from the manifest passes through :func:`html.escape`.
"""

from __future__ import annotations

from html import escape

from . import tables as fmt
from .comparison import RunComparison, comparison_intro, comparison_table, one_sided_lines
from .tables import HARDWARE_INTRO, MICROBENCH_INTRO, NO_HARDWARE, hardware_table, microbench_table, peak_sources
from .model import Report, ResultRow
from .charts import Bar, Point, bar_chart, line_chart, provider_color, scatter_chart
from .frontier_view import (COST_LABEL, FRONTIER_INTRO, INTERACTIVITY_LABEL, NO_TARGETS, TARGETS_INTRO,
                            THROUGHPUT_LABEL, curve_points, headlines, setup_notes, target_table)
from .sweep import (SATURATION_INTRO, percentile_table, saturated, saturation_table, step_points, steps_table,
                    sweep_table, sweeps)

__all__ = ["render_html"]

_CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'")

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1100px;
padding:16px 24px;color:#1b1f24;background:#fff}
h1{font-size:26px;margin:8px 0 12px}h2{font-size:20px;margin:32px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:16px;margin:20px 0 6px}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:0}dl.facts dt{font-weight:600}
dl.facts dd{margin:0}
table{border-collapse:collapse;margin:8px 0 4px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;white-space:nowrap}td.num{text-align:right;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}table.sortable th:hover{background:#eaeef2}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tr.partial td{color:#6e7781;font-style:italic}
.chart{display:block;max-width:100%;height:auto;margin:4px 0 12px}
.chart text{font:12px system-ui,sans-serif;fill:#1b1f24}.chart .tick{fill:#57606a}
.chart .grid{stroke:#eaeef2}.chart .axis-label{fill:#57606a}
.chart .point-label{font-size:10px;fill:#424a53}.chart .leader{stroke:#afb8c1;stroke-width:1}
.chart .bar.muted{opacity:.45}.chart .bar-row:hover .bar,.chart .point:hover{stroke:#1b1f24;stroke-width:1.5}
.note{color:#57606a}ul.notes{margin:4px 0}
div.table-wrap{max-width:100%;overflow-x:auto}td{overflow-wrap:anywhere}
"""

# Sorting: numbers by data-sort (missing values last), text by locale order.
_SCRIPT = """
(function(){
  function key(cell){
    if(!cell){return [1,""];}
    var raw=cell.getAttribute("data-sort");
    if(raw!==null){return raw===""?[1,0]:[0,parseFloat(raw)];}
    return [0,cell.textContent.trim().toLowerCase()];
  }
  function compare(a,b){
    if(a[0]!==b[0]){return a[0]-b[0];}
    if(typeof a[1]==="number"){return a[1]-b[1];}
    return a[1]<b[1]?-1:(a[1]>b[1]?1:0);
  }
  document.querySelectorAll("table.sortable").forEach(function(table){
    var heads=table.querySelectorAll("thead th");
    heads.forEach(function(th,column){
      th.setAttribute("tabindex","0");
      function sort(){
        var ascending=th.getAttribute("aria-sort")!=="ascending";
        heads.forEach(function(other){other.removeAttribute("aria-sort");});
        th.setAttribute("aria-sort",ascending?"ascending":"descending");
        var body=table.tBodies[0];
        var rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(r1,r2){
          var k1=key(r1.cells[column]),k2=key(r2.cells[column]);
          if(k1[0]!==k2[0]){return k1[0]-k2[0];}
          var order=compare(k1,k2);
          return ascending?order:-order;
        });
        rows.forEach(function(row){body.appendChild(row);});
      }
      th.addEventListener("click",sort);
      th.addEventListener("keydown",function(event){if(event.key==="Enter"){sort();}});
    });
  });
})();
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _table(table: fmt.Table, name: str, *, partial_rows: list[bool] | None = None, total_row: bool = False) -> str:
    """A sortable table; the last row stays in a tfoot when ``total_row``."""
    head = "".join(f"<th scope=\"col\">{_e(title)}</th>" for title in table.header)

    def row_html(values: tuple[fmt.Value, ...], partial: bool) -> str:
        cells = []
        for value in values:
            if isinstance(value, fmt.Figure):
                sort = "" if value.value is None else f"{value.value:.10g}"
                cells.append(f'<td class="num" data-sort="{sort}">{_e(value.text)}</td>')
            else:
                cells.append(f"<td>{_e(value)}</td>")
        return f'<tr{" class=partial" if partial else ""}>{"".join(cells)}</tr>'

    rows = list(table.rows)
    footer = rows.pop() if total_row and rows else None
    flags = partial_rows or [False] * len(rows)
    body = "".join(row_html(values, partial) for values, partial in zip(rows, flags, strict=True))
    foot = f"<tfoot>{row_html(footer, False)}</tfoot>" if footer is not None else ""
    # A table wider than the page scrolls inside its own box: the page itself never scrolls sideways.
    return (f'<div class="table-wrap"><table class="sortable" data-table="{_e(name)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody>{foot}</table></div>")


def _pairs(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"<li><strong>{_e(lead)}</strong>: {_e(text)}</li>" for lead, text in pairs)


def _partial(rows: list[ResultRow]) -> list[bool]:
    return [row.status == "partial" for row in rows]


def _bars(rows: list[ResultRow]) -> list[Bar]:
    return [Bar(label=row.label + (" (partial)" if row.status == "partial" else ""),
                color=provider_color(row.provider), value=row.output_tokens_per_second or 0.0,
                text=fmt.tps_marked(row),
                title=f"{row.model} on {fmt.where(row)}: {fmt.tps_marked(row)} output tok/s, "
                      f"{fmt.per_million(row.cost_per_million_tokens)}/M tokens, {fmt.price(row.price_per_hour)}/h",
                muted=row.status == "partial" or row.valid is False)
            for row in rows]


def _charts(report: Report) -> list[str]:
    parts = ["<h2>Charts</h2>", "<h3>Output tokens/s per GPU</h3>",
             '<p class="note">Output throughput per GPU and provider, one chart per model, a colour per '
             "provider (the same in every report); light bars are partial or not valid GPU figures. Hover for the "
             "figures.</p>"]
    for table in report.models:
        parts.append(f"<h4>{_e(table.model)}</h4>")
        parts.append(bar_chart(_bars(table.rows), name=f"tokens/s {table.model}", unit="output tok/s"))
    parts.append("<h3>$/M tokens against output tokens/s</h3>")
    parts.append('<p class="note">One chart per model, one point per result, labelled GPU / provider (/ runtime), '
                 "a colour per provider: down and to the right is cheaper and faster.</p>")
    for table in report.models:
        points = [Point(x=row.output_tokens_per_second or 0.0, y=row.cost_per_million_tokens or 0.0,
                        series=row.provider, label=row.label,
                        title=f"{row.model} on {fmt.where(row)}: {fmt.tps_marked(row)} output tok/s, "
                              f"{fmt.per_million(row.cost_per_million_tokens)}/M tokens")
                  for row in table.rows if row.cost_per_million_tokens is not None]
        parts.append(f"<h4>{_e(table.model)}</h4>")
        if points:
            parts.append(scatter_chart(points, name=f"cost against tokens/s {table.model}",
                                       x_label="output tokens/s", y_label="$ per million output tokens",
                                       colors={p.series: provider_color(p.series) for p in points}))
        else:
            parts.append("<p>No priced results.</p>")
    return parts


def _frontiers(report: Report) -> list[str]:
    if not report.frontiers:
        return []
    parts = ["<h2>Frontiers</h2>", f'<p class="note">{_e(FRONTIER_INTRO)}</p>']
    for group in report.frontiers:
        parts.append(f"<h3>{_e(group.name)}</h3>")
        for kind, y_label in (("throughput", THROUGHPUT_LABEL), ("cost", COST_LABEL)):
            lines, faint, colors = curve_points(group, kind)
            if lines:
                parts.append(line_chart(lines, name=f"frontier {kind} {group.name}", x_label=INTERACTIVITY_LABEL,
                                        y_label=y_label, colors=colors, faint=faint,
                                        log_y=None if kind == "cost" else False))
        parts.append("<h4>Cost at target interactivity</h4>")
        if group.answers:
            parts += [f'<p class="note">{_e(TARGETS_INTRO)}</p>',
                      _table(target_table(group), f"targets {group.name}")]
        else:
            parts.append(f"<p>{_e(NO_TARGETS)}</p>")
        notes = setup_notes(group)
        if notes:
            parts.append('<ul class="notes">' + "".join(f"<li>{_e(note)}</li>" for note in notes) + "</ul>")
    return parts


def _sweeps(report: Report) -> list[str]:
    found = sweeps(report)
    if not found:
        return []
    parts = ["<h2>Load sweeps</h2>",
             '<p class="note">Each GPU and model measured at several loads: median end-to-end latency against '
             "output throughput, one line per provider through its loads (labelled c1, c4 ... or r2/s). Up and "
             "to the right: more throughput, paid for in latency.</p>"]
    for sweep in found:
        lines = {series: [Point(x=r.output_tokens_per_second or 0.0, y=r.figures.get("e2e_p50_ms") or 0.0,
                                series=series, label=r.load,
                                title=f"{fmt.where(r)}: {fmt.tps_marked(r)} output tok/s, e2e p50 "
                                      f"{fmt.ms(r.figures.get('e2e_p50_ms'))} ms, p99 "
                                      f"{fmt.ms(r.figures.get('e2e_p99_ms'))} ms")
                          for r in rows]
                 for series, rows in sweep.lines.items()}
        colors = {series: provider_color(rows[0].provider) for series, rows in sweep.lines.items()}
        parts += [f"<h3>{_e(sweep.name)}</h3>",
                  line_chart(lines, name=f"latency against throughput {sweep.name}", x_label="output tokens/s",
                             y_label="e2e latency p50 (ms)", colors=colors),
                  _table(sweep_table(sweep), f"sweep {sweep.name}")]
    return parts


def _saturation(report: Report) -> list[str]:
    swept = saturated(report)
    if not swept:
        return []
    parts = ["<h2>Saturation</h2>", f'<p class="note">{_e(SATURATION_INTRO)}</p>',
             _table(saturation_table(swept), "saturation")]
    for row in swept:
        name = f"{row.machine} / {row.model}"
        points = [Point(x=x, y=y, series=row.provider, label=label, title=title)
                  for x, y, label, title in step_points(row)]
        parts.append(f"<h3>{_e(name)}: sweep steps</h3>")
        if points:
            parts.append(line_chart({row.provider: points}, name=f"sweep steps {name}", x_label="output tokens/s",
                                    y_label="TTFT p95 (ms)", colors={row.provider: provider_color(row.provider)}))
        parts.append(_table(steps_table(row), f"sweep steps {name}"))
    return parts


def _percentiles(report: Report) -> list[str]:
    parts = ["<h2>Latency percentiles</h2>",
             '<p class="note">Per cell, in ms: time to first token, time per output token, inter-token latency '
             "and end-to-end request latency (docs/metrics.md).</p>"]
    for table in report.models:
        parts.append(f"<h3>{_e(table.model)}</h3>")
        for row in table.rows:
            parts += [f"<h4>{_e(fmt.where(row))}</h4>",
                      _table(percentile_table(row), f"percentiles {row.model} {row.label}")]
    return parts


def _comparison(comparison: RunComparison) -> list[str]:
    parts = ['<h2 id="comparison">Comparison</h2>', f'<p class="note">{_e(comparison_intro(comparison))}</p>']
    if comparison.cells:
        parts.append(_table(comparison_table(comparison), "comparison"))
    lines = one_sided_lines(comparison)
    if lines:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>")
    return parts


def render_html(report: Report, comparison: RunComparison | None = None) -> str:
    """The whole ``index.html``; with ``comparison``, its section comes first."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{_e(_CSP)}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_e(report.title)}</title>", f"<style>{_STYLE}</style></head><body>",
             f"<h1>{_e(report.title)}</h1>"]
    if report.sandbox_note:
        parts.append(f'<p class="sandbox-note"><strong>{_e(report.sandbox_note)}</strong></p>')
    parts.append('<dl class="facts">')
    parts += [f"<dt>{_e(label)}</dt><dd>{_e(text)}</dd>" for label, text in fmt.facts(report)]
    parts.append("</dl>")
    if comparison is not None:
        parts += _comparison(comparison)
    parts += ["<h2>Headline findings</h2>", f"<ul>{_pairs(headlines(report))}</ul>"]
    parts += _charts(report)
    parts += _frontiers(report)
    parts += ["<h2>Tokens/s leaderboard</h2>", f"<p>{_e(fmt.TOKENS_INTRO)}</p>"]
    for model, rows, table in fmt.tokens_leaderboards(report):
        parts += [f"<h3>{_e(model)}</h3>", _table(table, f"tokens {model}", partial_rows=_partial(rows))]
    parts += ["<h2>$ per million tokens leaderboard</h2>", f"<p>{_e(fmt.COST_INTRO)}</p>"]
    for model, rows, table in fmt.cost_leaderboards(report):
        parts += [f"<h3>{_e(model)}</h3>", _table(table, f"cost {model}", partial_rows=_partial(rows))]
    parts += ["<h2>Results by model</h2>"]
    for table in report.models:
        parts += [f"<h3>{_e(table.model)}</h3>",
                  _table(fmt.model_table(table), f"model {table.model}", partial_rows=_partial(table.rows)),
                  "<p>" + " ".join(f"<strong>{_e(lead)}</strong>: {_e(text)}." for lead, text in fmt.picks(table))
                  + "</p>"]
        invalid = fmt.invalid_notes(table)
        if invalid:
            parts.append('<ul class="notes">' + "".join(f"<li>! {_e(note)}</li>" for note in invalid) + "</ul>")
    parts += _sweeps(report)
    parts += _saturation(report)
    if report.microbench:
        parts += ["<h2>GPU microbenchmarks</h2>", f"<p>{_e(MICROBENCH_INTRO)}</p>",
                  _table(microbench_table(report), "microbench"),
                  f"<p>Datasheet peaks:</p><ul>{_pairs(peak_sources(report))}</ul>"]
    parts += _percentiles(report)
    parts.append("<h2>Provider head-to-head</h2>")
    if report.matchups:
        parts += [f"<p>{_e(fmt.HEAD_TO_HEAD_INTRO)}</p>", _table(fmt.head_to_head_table(report), "head-to-head"),
                  "<ul>" + "".join(f"<li><strong>{_e(w.provider)}</strong>: faster in {w.faster} of {w.matchups}, "
                                   f"cheaper in {w.cheaper} of {w.matchups} matchups</li>"
                                   for w in report.provider_wins) + "</ul>"]
    else:
        parts.append(f"<p>{_e(fmt.NO_HEAD_TO_HEAD)}</p>")
    parts.append("<h2>Hardware</h2>")
    parts += ([f"<p>{_e(HARDWARE_INTRO)}</p>", _table(hardware_table(report.machines), "hardware")]
              if report.machines else [f"<p>{_e(NO_HARDWARE)}</p>"])
    parts.append("<h2>Failures by stage</h2>")
    if report.failures:
        parts += [f"<p>{_e(fmt.FAILURES_INTRO)}</p>", _table(fmt.failure_table(report.failures), "failures")]
    else:
        parts.append(f"<p>{_e(fmt.NO_FAILURES)}</p>")
    if report.skipped:
        parts += ["<h3>Skipped cells</h3>", _table(fmt.failure_table(report.skipped, "Reason"), "skipped")]
    parts += ["<h2>Spend</h2>", f"<p>{_e(fmt.SPEND_INTRO)}</p>",
              _table(fmt.spend_table(report), "spend", total_row=True)]
    notes = fmt.spend_notes(report)
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(note)}</li>" for note in notes) + "</ul>")
    parts += ["<h2>Figures</h2>", "<dl class=\"facts\">"]
    parts += [f"<dt>{_e(name)}</dt><dd>{_e(text)}.</dd>" for name, text in (*fmt.FIGURES, *fmt.MARKS)]
    parts += ["</dl>", '<p class="note">See docs/report.md and docs/metrics.md in pytest-gpubench.</p>',
              f"<script>{_SCRIPT}</script>", "</body></html>"]
    return "\n".join(parts) + "\n"
