"""The catalogue as a section of other reports: a campaign's (`metavlm report`) and the demo's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.campaign.loading import CampaignResults
from metavlm_ros.common.document import Block, Code, Inline, Link, Paragraph, Section, slug
from metavlm_ros.common.results import EVALUATIONS, records_file
from metavlm_ros.explain.catalogue import Catalogue, CatalogueSettings
from metavlm_ros.explain.modes import learn, load_all
from metavlm_ros.explain.report import MODES, changes_text, modes_table, write_catalogue

__all__ = [
    'NO_EVALUATIONS',
    'NO_MODES',
    'TOP_MODES',
    'ModesWritten',
    'campaign_modes',
    'modes_section',
    'results_modes',
]

#: The modes another report shows, best first; modes.md (`metavlm modes`) has them all.
TOP_MODES = 5
#: What a section says when the evidence holds nothing the catalogue can learn from.
NO_EVALUATIONS = (
    'No evaluation to learn from: all failed, identities, or records written before they carried parameters.'
)

#: What a section says when no rule makes an answer change much likelier.
NO_MODES = 'No failure mode: no answer change is much likelier under any rule than outside it.'


def modes_section(
    catalogue: Catalogue | None,
    title: str,
    *,
    lead: Sequence[Inline] = (),
    top: int = TOP_MODES,
    key: str = 'modes',
) -> Section:
    """The top modes of `catalogue` as a section: what it was learnt from, then the table of each mode's
    rule, support and violation rates inside and outside it (`modes_table`, as modes.md shows it).

    Args:
        catalogue: The catalogue; None when the evidence held nothing to learn from (said so).
        title: The section's heading.
        lead: What the first paragraph starts with (where the evidence is).
        top: How many modes the table shows.
        key: The table's key (its CSV file and anchor).
    """
    if catalogue is None:
        return Section(title, [Paragraph(*lead, NO_EVALUATIONS)], anchor=key)
    s = catalogue.settings
    threshold = f'; confidence threshold {s.threshold:g}' if s.threshold else ''
    blocks: list[Block] = [
        Paragraph(
            *lead,
            f'{catalogue.evaluations} evaluations judged; answer changes: {changes_text(catalogue)}'
            f'{threshold}. A mode is a rule over the relations, the order and the source frame under which '
            f'an answer change is at least {s.min_lift:g} times likelier than outside it, with at least '
            f'{s.min_violations} violations (docs/explain.md).',
        )
    ]
    if not catalogue.modes:
        blocks.append(Paragraph(NO_MODES))
        return Section(title, blocks, anchor=key)
    table = modes_table(catalogue, top, key)
    shown = len(table.rows)
    more = f' The first {shown} of {len(catalogue.modes)} modes.' if shown < len(catalogue.modes) else ''
    blocks += [table, Paragraph(table.note + more)]
    return Section(title, blocks, anchor=key)


def campaign_modes(
    results: CampaignResults, settings: CatalogueSettings | None = None, top: int = TOP_MODES
) -> Section:
    """The failure modes of each model of a campaign, learnt from every evaluation of its verified cells.

    Every evaluation counts, whatever solution set the report's tables use: a mode's rates inside and
    outside its rule need the evaluations that did not violate as much as those that did.
    """
    blocks: list[Block] = [
        Paragraph(
            "Each model's evaluations in its finished cells (all of them, whatever the solution set of the "
            "tables above), grouped into failure modes. Each mode's smallest example, its render command "
            'and attribution maps: ',
            Code('metavlm modes'),
            ' on the campaign directory (docs/explain.md).',
        )
    ]
    for model in results.models:
        roots = [cell.directory for cell in results.of(model) if cell.directory is not None]
        if not roots:
            continue
        learnt = learn(load_all(roots), settings)
        blocks.append(
            modes_section(learnt[0] if learnt else None, model, top=top, key=f'modes_{slug(model)}')
        )
    return Section('Failure modes', blocks, anchor='modes')


@dataclass
class ModesWritten:
    """`results_modes`' outcome: the section, the modes' records (modes.json's) and the files written."""

    section: Section
    records: list[dict] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def results_modes(
    roots: Sequence[Path],
    out: Path,
    title: str,
    *,
    link: str,
    settings: CatalogueSettings | None = None,
    top: int = TOP_MODES,
) -> ModesWritten:
    """The failure modes of the results directories among `roots` that hold evaluations: written whole to
    the new directory `out` (modes.json, .md, .html), and as a section that shows the top ones and links
    to modes.md at `link` (relative to the document that shows it).

    Nothing is written when no root holds an evaluation to learn from; the section says so.
    """
    found = [root for root in roots if records_file(Path(root) / EVALUATIONS).is_file()]
    learnt = learn(load_all(found), settings) if found else None
    if learnt is None:
        return ModesWritten(modes_section(None, title, top=top))
    catalogue = learnt[0]
    files = write_catalogue(catalogue, out, found)
    lead = [
        Link(f'{MODES}.md', f'{link}/{MODES}.md'),
        ' (every mode, its smallest example and render command): ',
    ]
    records = [mode.as_record(rank) for rank, mode in enumerate(catalogue.modes, start=1)]
    return ModesWritten(modes_section(catalogue, title, lead=lead, top=top), records, files)
