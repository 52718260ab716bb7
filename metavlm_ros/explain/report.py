"""The catalogue written out: modes.json (a mode a line), modes.md and modes.html, and its maps."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from metavlm_ros.common.directories import build_aside, write_file_atomic
from metavlm_ros.common.document import (
    Bullets,
    Code,
    Document,
    Figure,
    Link,
    Paragraph,
    Section,
    Strong,
    Table,
    write_document,
)
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.record_format import to_jsonable
from metavlm_ros.explain.attribution import GRID, INTEGRATED_GRADIENTS, ExampleMaps, Maps
from metavlm_ros.explain.catalogue import Catalogue, FailureMode
from metavlm_ros.explain.overlays import map_files, write_maps

__all__ = [
    'MODES',
    'changes_text',
    'catalogue_document',
    'check_out',
    'modes_lines',
    'modes_table',
    'write_catalogue',
]

#: The files the catalogue writes, by stem.
MODES = 'modes'


def _maps_record(maps: Maps, rank: int) -> dict | None:
    made = maps.by_rank.get(rank)
    if made is None:
        return None
    return {**made.as_record(), 'backend': maps.backend, 'model': maps.model, 'files': map_files(rank)}


def modes_lines(
    catalogue: Catalogue, maps: Maps | None = None, fields: Mapping[int, dict] | None = None
) -> bytes:
    """One whole JSON record a mode, a line each, best first (jq, pandas lines=True, DuckDB).

    With `maps`, each record also holds `maps`: its attribution maps' numbers and files (null for a
    mode without); without, the records are the catalogue's alone. `fields` adds to the record of
    each rank it names (`metavlm verify`: the failing criteria a mode breaks).
    """
    records = [mode.as_record(rank) for rank, mode in enumerate(catalogue.modes, start=1)]
    if maps is not None:
        records = [{**record, 'maps': _maps_record(maps, record['rank'])} for record in records]
    if fields:
        records = [{**record, **fields.get(record['rank'], {})} for record in records]
    lines = [json.dumps(to_jsonable(record), sort_keys=True, allow_nan=False) for record in records]
    return ''.join(line + '\n' for line in lines).encode('utf-8')


def _texts(mode: FailureMode) -> list[str]:
    return [c.describe() for c in mode.conditions]


def _where(cell: dict | None) -> str:
    return 'nowhere' if cell is None else f'row {cell["row"] + 1}, column {cell["col"] + 1}'


def _share(value: float | None) -> str:
    return 'n/a' if value is None else f'{value:.0%}'


def _score(value: float | None) -> str:
    return 'n/a' if value is None else f'{value:.3g}'


def _map_blocks(rank: int, made: ExampleMaps) -> list:
    record, files = made.as_record(), map_files(rank)
    source, followup, moved = record['source'], record['followup'], record['difference']
    method = 'integrated gradients' if record['method'] == INTEGRATED_GRADIENTS else 'occlusion'
    caption = (
        f"Top: the source, the follow-up, the pixels that changed. Bottom: where the model's "
        f'{record["class"]} score came from on each ({method}), and how that moved (red: more on the '
        'follow-up, blue: less).'
    )
    recorded = record['recorded']
    return [
        Figure(files['montage'], caption),
        Bullets([
            f'{record["class"]} score {_score(source["score"])} on the source, '
            f'{_score(followup["score"])} on the follow-up (the evidence recorded '
            f'{_score(recorded["source"])} and {_score(recorded["followup"])})',
            f'most mass at {_where(source["top_cell"])} of a {GRID} x {GRID} grid on the source '
            f'({_share((source["top_cell"] or {}).get("share"))}), {_where(followup["top_cell"])} on the '
            f'follow-up ({_share((followup["top_cell"] or {}).get("share"))}); half the mass on '
            f'{_share(source["area_50"])} and {_share(followup["area_50"])} of the frame',
            f'{_share(moved["moved"])} of the mass moved; most gained at {_where(moved["top_gain"])}, '
            f'most lost at {_where(moved["top_loss"])}',
            f'{method}: {record["frames_judged"]} frames judged',
        ]),
        Paragraph(
            'Maps: ', Link('source', files['source']), ', ', Link('follow-up', files['followup']), ', ',
            Link('difference', files['difference']), '; numbers: ', Link(files['numbers'], files['numbers']),
        ),
    ]  # fmt: skip


def _mode_section(rank: int, mode: FailureMode, maps: Maps | None = None) -> Section:
    blocks = [
        Paragraph(Strong(mode.change.label), ' when ', ' and '.join(_texts(mode)), '.'),
        Bullets([
            f'{mode.violations_inside} of {mode.evaluations_inside} evaluations inside the rule '
            f'({mode.rate_inside:.1%}) against {mode.violations_outside} of {mode.evaluations_outside} '
            f'outside ({mode.rate_outside:.2%})',
            f'on {mode.frames} frame(s), in {mode.searches} search(es)',
        ]),
    ]  # fmt: skip
    if mode.example is not None:
        e = mode.example
        blocks.append(
            Paragraph(
                f'Smallest example: {e["composition"]} at f_trans {e["f_trans"]:.4g} on {e["image"]} '
                f'(evaluation {e["index"]}); render it with ',
                Code(e['render']),
            )
        )
    if maps is not None and rank in maps.by_rank:
        blocks += _map_blocks(rank, maps.by_rank[rank])
    return Section(f'{rank}. {mode.rule}', blocks)


def _maps_paragraph(maps: Maps) -> Paragraph:
    s = maps.settings
    how = (
        f"integrated gradients in the frame's pixels ({s.steps} steps from the frame's mean colour)"
        if maps.method == INTEGRATED_GRADIENTS
        else f'occlusion (cells of the frame set to its mean colour in turn; budget {s.budget} frames)'
    )
    return Paragraph(
        f'Attribution maps of backend {maps.backend}, model ',
        Code(maps.model),
        f": {how}, of the class whose answer changed, on each mode's smallest example; "
        f'{maps.frames_judged} frames judged in all (docs/explain.md).',
    )


def changes_text(catalogue: Catalogue) -> str:
    """The answer changes the catalogue saw, with their violations: 'animal rose 520, trash dropped 121'."""
    return ', '.join(f'{label} {n}' for label, n in sorted(catalogue.violations.items())) or 'none'


def modes_table(catalogue: Catalogue, top: int | None = None, key: str = 'modes') -> Table:
    """The modes as a table, best first (the first `top`; None: all): each rule, its support, its rates.

    The one table of the catalogue, in modes.md and wherever another report shows the modes.
    """
    modes = catalogue.modes if top is None else catalogue.modes[:top]
    return Table(
        columns=[
            'rank', 'rule', 'violations', 'evaluations', 'rate inside', 'rate outside', 'frames', 'searches'
        ],
        rows=[
            [rank, m.rule, m.violations_inside, m.evaluations_inside, m.rate_inside, m.rate_outside, m.frames,
             m.searches]
            for rank, m in enumerate(modes, start=1)
        ],
        formats=['', '', '', '', '.1%', '.2%', '', ''],
        key=key,
        title='Modes',
        note='Violations and evaluations inside each rule; rates inside and outside it.',
    )  # fmt: skip


def catalogue_document(
    catalogue: Catalogue,
    roots: Sequence[str | Path],
    maps: Maps | None = None,
    sections: Sequence[Section] = (),
) -> Document:
    """The catalogue as a document: the modes' table, `sections` (what a caller adds: the criteria the
    modes break), a section a mode (with `maps`, its maps), what it was learnt from."""
    s = catalogue.settings
    blocks = [
        Paragraph(
            'Evidence: ', *[part for root in roots for part in (Code(str(root)), ' ')],
            f'({catalogue.evaluations} evaluations judged; answer changes: {changes_text(catalogue)}). '
            f'A shallow decision tree (depth {s.depth}) per kind of answer change over each relation\'s '
            'deviation from nominal, the order and the source frame\'s brightness, contrast and colour cast; '
            f'each leaf where the change is at least {s.min_lift:g} times likelier than outside, with at '
            f'least {s.min_violations} violations, is a mode (docs/explain.md).'
            + (f' Confidence threshold {s.threshold:g}.' if s.threshold else ''),
        ),
        *([_maps_paragraph(maps)] if maps is not None else []),
        modes_table(catalogue).section(),
        *sections,
        *[_mode_section(rank, m, maps) for rank, m in enumerate(catalogue.modes, start=1)],
    ]  # fmt: skip
    notes = [*catalogue.notes, *(maps.notes if maps is not None else [])]
    if notes:
        blocks.append(Section('Notes', [Bullets(notes)]))
    return Document('Failure modes', blocks, page_title='metavlm modes')


def check_out(out: str | Path, roots: Sequence[str | Path]) -> Path:
    """`out` as a Path, checked before any work: a new directory, outside the evidence.

    Raises:
        InputError: `out` exists or lies inside one of the evidence `roots`.
    """
    out = Path(out)
    for root in roots:
        if out.resolve().is_relative_to(Path(root).resolve()):
            raise InputError(f'{out}: inside the evidence {root}; name a directory outside it')
    if out.exists():
        raise InputError(f'{out}: exists; name a new directory')
    return out


def write_catalogue(
    catalogue: Catalogue,
    out: str | Path,
    roots: Sequence[str | Path],
    maps: Maps | None = None,
    *,
    sections: Sequence[Section] = (),
    fields: Mapping[int, dict] | None = None,
) -> list[Path]:
    """Write modes.json, modes.md and modes.html (with `maps`, and maps/) into the new directory `out`,
    whole or not at all; `sections` and `fields` as `catalogue_document` and `modes_lines` take them.

    Raises:
        InputError: `out` exists or lies inside one of the evidence `roots`.
        StorageError: `out` could not be written.
    """
    out = check_out(out, roots)
    document = catalogue_document(catalogue, roots, maps, sections)

    def fill(directory: Path) -> list[str]:
        written = []
        for rank, made in (maps.by_rank if maps is not None else {}).items():
            written += write_maps(directory, rank, made)
        write_file_atomic(directory / f'{MODES}.json', modes_lines(catalogue, maps, fields))
        write_document(document, directory / f'{MODES}.md')
        write_document(document, directory / f'{MODES}.html')
        return [f'{MODES}.json', f'{MODES}.md', f'{MODES}.html', *written]

    return [out / name for name in build_aside(out, fill)]
