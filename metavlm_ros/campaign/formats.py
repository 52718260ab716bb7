"""The campaign report as a document: Markdown, HTML or one CSV per table, written with its plots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from metavlm_ros.campaign.loading import SOLUTION_SETS
from metavlm_ros.campaign.plots import make_plots
from metavlm_ros.campaign.tables import WARP_NOTES, Report
from metavlm_ros.common import document
from metavlm_ros.common.document import (
    Block,
    Bullets,
    Code,
    Document,
    Figure,
    Paragraph,
    Section,
    Table,
    render_csv,
)
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID

__all__ = [
    'FORMATS',
    'campaign_document',
    'render_csv',
    'render_html',
    'render_markdown',
    'write_report',
]


FORMATS = ('md', 'html', 'csv')


def campaign_document(report: Report, plots: Sequence[tuple[str, str]] = ()) -> Document:
    """The report as a document: the header, the notes, a section per table, the report's own sections
    (the failure modes), the plots.

    Args:
        report: The computed report.
        plots: (title, path relative to the document) of each plot to show.
    """
    blocks: list[Block] = [Bullets(_header(report))]
    if report.notes:
        blocks.append(Bullets(report.notes))
    blocks += [table.section() for table in report.tables]
    blocks += report.sections
    if plots:
        blocks.append(Section('Plots', [Figure(path, title) for title, path in plots], anchor='plots'))
    return Document('metavlm_ros campaign report', blocks, contents=True)


def render_markdown(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The report as Markdown; `plots` are (title, relative path) pairs to show."""
    return document.render_markdown(campaign_document(report, plots))


def render_html(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The report as a self-contained HTML page (plots linked as PNG files next to it)."""
    return document.render_html(campaign_document(report, plots))


def _header(report: Report) -> list[str | Paragraph]:
    """The header's lines: the results, the campaign's settings and models, what the tables hold."""
    campaign = report.results.campaign
    config = campaign.get('config', {})
    lines: list[str | Paragraph] = [
        Paragraph(
            'Results: ',
            Code(str(report.results.directory)),
            f' (campaign {campaign.get("fingerprint")}, metavlm_ros {campaign.get("version")})',
        ),
        f'Images: {len(report.results.images)}; runs: {config.get("runs")}; population '
        f'{config.get("population")}, {config.get("evaluations")} evaluations per search; base seed '
        f'{config.get("seed")}',
    ]
    for model in campaign.get('models', []):
        digest = model.get('weights_sha256') or 'unknown'
        lines.append(
            Paragraph(
                f'Model {model["name"]}: {model["backend"]} ',
                Code(str(model['model'])),
                f', weights sha256 {digest[:16]}',
            )
        )
    # Campaigns made before the warp setting existed used fused warps.
    warp = config.get('warp', 'fused')
    lines.append(f'Warps: {warp} ({WARP_NOTES.get(warp, "unknown")}; docs/method.md §8)')
    threads = Counter(str(c.info.get('torch_threads', 'not recorded')) for c in report.results.cells)
    if len(threads) > 1:
        mixed = ', '.join(f'{t} ({n} cells)' for t, n in sorted(threads.items()))
        lines.append(f'Torch threads per cell: MIXED, {mixed}: float sums may differ in the last digits')
    elif threads:
        lines.append(f'Torch threads per cell: {next(iter(threads))}')
    relations = report.results.relations
    if relations != list(DEFAULT_RELATIONS):
        numbered = ', '.join(f'MR{RELATION_BY_ID[rid].number} {rid}' for rid in relations)
        lines.append(f'Relations: {numbered} (docs/method.md §1, §12)')
    if config.get('water_ranges') == 'truth':  # absent: MR12's priors
        lines.append(
            "Water ranges: truth (MR12 at each pixel's range from the frame's map; docs/underwater.md)"
        )
    lines.append(f'Solution set: {SOLUTION_SETS[report.results.solutions]}')
    return lines


def _keyed_tables(section: Section) -> list[Table]:
    """The tables with a key (a CSV file's name) in a section and the sections inside it, in order."""
    found = []
    for block in section.blocks:
        if isinstance(block, Section):
            found += _keyed_tables(block)
        elif isinstance(block, Table) and block.key:
            found.append(block)
    return found


def write_report(report: Report, out: str | Path, fmt: str = 'md', plots: bool = True) -> list[Path]:
    """Write the report under `out`, each file atomically: report.md, index.html, or one CSV per table;
    plots as PNG.

    Returns:
        The files written, the main document first.

    Raises:
        ParameterError: Unknown format.
    """
    if fmt not in FORMATS:
        raise ParameterError(f'unknown report format "{fmt}" (choose from {", ".join(FORMATS)})')
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == 'csv':
        tables = report.tables + [table for section in report.sections for table in _keyed_tables(section)]
        return [document.write_csv(table, out / f'{table.key}.csv') for table in tables]
    images = make_plots(report.results, out) if plots else []
    links = [(title, path.relative_to(out).as_posix()) for title, path in images]
    page = out / ('report.md' if fmt == 'md' else 'index.html')
    return [document.write_document(campaign_document(report, links), page)] + [path for _, path in images]
