"""The report's formats: Markdown, HTML and CSV, and writing them."""

from __future__ import annotations

import csv
import html
import io
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metavlm_ros.campaign.loading import SOLUTION_SETS
from metavlm_ros.campaign.plots import make_plots
from metavlm_ros.campaign.tables import WARP_NOTES, Report, Table
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID

__all__ = [
    'FORMATS',
    'render_csv',
    'render_html',
    'render_markdown',
    'write_report',
]


FORMATS = ('md', 'html', 'csv')


def render_markdown(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The report as Markdown; `plots` are (title, relative path) pairs to link."""
    lines = ['# metavlm_ros campaign report', '']
    lines += _header_lines(report)
    lines += [''] + [f'- {note}' for note in report.notes] + ['']
    for table in report.tables:
        lines += [f'## {table.title}', '']
        if table.rows:
            lines.append('| ' + ' | '.join(table.columns) + ' |')
            lines.append('|' + '---|' * len(table.columns))
            lines += ['| ' + ' | '.join(row) + ' |' for row in table.formatted()]
        else:
            lines.append('(no rows)')
        if table.note:
            lines += ['', table.note]
        lines.append('')
    if plots:
        lines += ['## Plots', '']
        lines += [f'![{title}]({path})' for title, path in plots]
        lines.append('')
    return '\n'.join(lines)


def _header_lines(report: Report) -> list[str]:
    campaign = report.results.campaign
    config = campaign.get('config', {})
    lines = [
        f'- Results: `{report.results.directory}` (campaign {campaign.get("fingerprint")}, metavlm_ros '
        f'{campaign.get("version")})',
        f'- Images: {len(report.results.images)}; runs: {config.get("runs")}; population '
        f'{config.get("population")}, {config.get("evaluations")} evaluations per search; base seed '
        f'{config.get("seed")}',
    ]
    for model in campaign.get('models', []):
        digest = model.get('weights_sha256') or 'unknown'
        lines.append(
            f'- Model {model["name"]}: {model["backend"]} `{model["model"]}`, weights sha256 {digest[:16]}'
        )
    # Campaigns made before the warp setting existed used fused warps.
    warp = config.get('warp', 'fused')
    lines.append(f'- Warps: {warp} ({WARP_NOTES.get(warp, "unknown")}; docs/method.md §8)')
    threads = Counter(str(c.info.get('torch_threads', 'not recorded')) for c in report.results.cells)
    if len(threads) > 1:
        mixed = ', '.join(f'{t} ({n} cells)' for t, n in sorted(threads.items()))
        lines.append(f'- Torch threads per cell: MIXED, {mixed}: float sums may differ in the last digits')
    elif threads:
        lines.append(f'- Torch threads per cell: {next(iter(threads))}')
    relations = report.results.relations
    if relations != list(DEFAULT_RELATIONS):
        numbered = ', '.join(f'MR{RELATION_BY_ID[rid].number} {rid}' for rid in relations)
        lines.append(f'- Relations: {numbered} (docs/method.md §1, §12)')
    lines.append(f'- Solution set: {SOLUTION_SETS[report.results.solutions]}')
    return lines


def render_csv(table: Table) -> str:
    """One table as CSV, unrounded (percentages in % columns); empty fields for 'not applicable'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator='\n')
    writer.writerow(table.columns)
    formats = table.formats or [''] * len(table.columns)
    for row in table.rows:
        writer.writerow([_csv_value(v, fmt) for v, fmt in zip(row, formats, strict=True)])
    return buffer.getvalue()


def _csv_value(value: Any, fmt: str) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ''
    # A column labelled % holds percentages, unrounded (the tables keep fractions internally).
    return 100.0 * value if fmt == '%' else value


def render_html(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """A self-contained HTML page (plots linked as PNG files next to it)."""
    esc = html.escape
    parts = [
        '<!DOCTYPE html>',
        '<html lang="en"><head><meta charset="utf-8"><title>metavlm_ros campaign report</title>',
        '<style>body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;'
        'margin:0.5em 0}td,th{border:1px solid #aaa;padding:0.2em 0.5em;text-align:right}'
        'th{background:#eee}td:first-child,th:first-child{text-align:left}img{max-width:48em;display:block;'
        'margin:1em 0}.note{color:#444;font-size:90%}</style></head><body>',
        '<h1>metavlm_ros campaign report</h1><ul>',
    ]
    parts += [f'<li>{esc(line[2:]).replace("`", "")}</li>' for line in _header_lines(report)]
    parts += [f'<li>{esc(note)}</li>' for note in report.notes]
    parts.append('</ul>')
    parts.append('<h2>Contents</h2><ul>')
    parts += [f'<li><a href="#{esc(t.key)}">{esc(t.title)}</a></li>' for t in report.tables]
    if plots:
        parts.append('<li><a href="#plots">Plots</a></li>')
    parts.append('</ul>')
    for table in report.tables:
        parts.append(f'<h2 id="{esc(table.key)}">{esc(table.title)}</h2>')
        parts.append('<table><tr>' + ''.join(f'<th>{esc(c)}</th>' for c in table.columns) + '</tr>')
        for row in table.formatted():
            parts.append('<tr>' + ''.join(f'<td>{esc(v)}</td>' for v in row) + '</tr>')
        parts.append('</table>')
        if table.note:
            parts.append(f'<p class="note">{esc(table.note)}</p>')
    if plots:
        parts.append('<h2 id="plots">Plots</h2>')
        for title, path in plots:
            parts.append(f'<h3>{esc(title)}</h3><img src="{esc(path)}" alt="{esc(title)}">')
    parts.append('</body></html>')
    return '\n'.join(parts) + '\n'


def write_report(report: Report, out: str | Path, fmt: str = 'md', plots: bool = True) -> list[Path]:
    """Write the report under `out`: report.md, index.html, or one CSV per table; plots as PNG.

    Returns:
        The files written, the main document first.

    Raises:
        ParameterError: Unknown format.
    """
    if fmt not in FORMATS:
        raise ParameterError(f'unknown report format "{fmt}" (choose from {", ".join(FORMATS)})')
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    images = make_plots(report.results, out) if plots and fmt != 'csv' else []
    links = [(title, path.relative_to(out).as_posix()) for title, path in images]
    if fmt == 'md':
        path = out / 'report.md'
        path.write_text(render_markdown(report, links), encoding='utf-8')
        written.append(path)
    elif fmt == 'html':
        path = out / 'index.html'
        path.write_text(render_html(report, links), encoding='utf-8')
        written.append(path)
    else:
        for table in report.tables:
            path = out / f'{table.key}.csv'
            path.write_text(render_csv(table), encoding='utf-8')
            written.append(path)
    return written + [path for _, path in images]
