"""The catalogue written out: modes.json (a mode a line), modes.md and modes.html, from one Document."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from metavlm_ros.common.directories import build_aside, write_file_atomic
from metavlm_ros.common.document import (
    Bullets,
    Code,
    Document,
    Paragraph,
    Section,
    Strong,
    Table,
    write_document,
)
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.record_format import to_jsonable
from metavlm_ros.explain.catalogue import Catalogue, FailureMode

__all__ = ['MODES', 'catalogue_document', 'modes_lines', 'write_catalogue']

#: The files the catalogue writes, by stem.
MODES = 'modes'


def modes_lines(catalogue: Catalogue) -> bytes:
    """One whole JSON record a mode, a line each, best first (jq, pandas lines=True, DuckDB)."""
    lines = [
        json.dumps(to_jsonable(mode.as_record(rank)), sort_keys=True, allow_nan=False)
        for rank, mode in enumerate(catalogue.modes, start=1)
    ]
    return ''.join(line + '\n' for line in lines).encode('utf-8')


def _texts(mode: FailureMode) -> list[str]:
    return [c.describe() for c in mode.conditions]


def _mode_section(rank: int, mode: FailureMode) -> Section:
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
    return Section(f'{rank}. {mode.rule}', blocks)


def catalogue_document(catalogue: Catalogue, roots: Sequence[str | Path]) -> Document:
    """The catalogue as a document: the modes' table, a section a mode, what it was learnt from."""
    s = catalogue.settings
    changes = ', '.join(f'{label} {n}' for label, n in sorted(catalogue.violations.items())) or 'none'
    table = Table(
        columns=[
            'rank', 'rule', 'violations', 'evaluations', 'rate inside', 'rate outside', 'frames', 'searches'
        ],
        rows=[
            [rank, m.rule, m.violations_inside, m.evaluations_inside, m.rate_inside, m.rate_outside, m.frames,
             m.searches]
            for rank, m in enumerate(catalogue.modes, start=1)
        ],
        formats=['', '', '', '', '.1%', '.2%', '', ''],
        key='modes',
        title='Modes',
        note='Violations and evaluations inside each rule; rates inside and outside it.',
    )  # fmt: skip
    blocks = [
        Paragraph(
            'Evidence: ', *[part for root in roots for part in (Code(str(root)), ' ')],
            f'({catalogue.evaluations} evaluations judged; answer changes: {changes}). A shallow decision '
            f'tree (depth {s.depth}) per kind of answer change over each relation\'s deviation from nominal, '
            'the order and the source frame\'s brightness, contrast and colour cast; each leaf where the '
            f'change is at least {s.min_lift:g} times likelier than outside, with at least '
            f'{s.min_violations} violations, is a mode (docs/explain.md).'
            + (f' Confidence threshold {s.threshold:g}.' if s.threshold else ''),
        ),
        table.section(),
        *[_mode_section(rank, m) for rank, m in enumerate(catalogue.modes, start=1)],
    ]  # fmt: skip
    if catalogue.notes:
        blocks.append(Section('Notes', [Bullets(catalogue.notes)]))
    return Document('Failure modes', blocks, page_title='metavlm modes')


def write_catalogue(catalogue: Catalogue, out: str | Path, roots: Sequence[str | Path]) -> list[Path]:
    """Write modes.json, modes.md and modes.html into the new directory `out`, whole or not at all.

    Raises:
        InputError: `out` exists or lies inside one of the evidence `roots`.
        StorageError: `out` could not be written.
    """
    out = Path(out)
    for root in roots:
        if out.resolve().is_relative_to(Path(root).resolve()):
            raise InputError(f'{out}: inside the evidence {root}; name a directory outside it')
    document = catalogue_document(catalogue, roots)

    def fill(directory: Path) -> list[str]:
        write_file_atomic(directory / f'{MODES}.json', modes_lines(catalogue))
        write_document(document, directory / f'{MODES}.md')
        write_document(document, directory / f'{MODES}.html')
        return [f'{MODES}.json', f'{MODES}.md', f'{MODES}.html']

    return [out / name for name in build_aside(out, fill)]
