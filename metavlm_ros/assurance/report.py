"""A verdict report: the criteria judged, what each rests on, and the exact configuration they hold for,
as JSON, Markdown, HTML and JUnit XML."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from metavlm_ros import __version__
from metavlm_ros.assurance.compare import comparison_outcome
from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import Evidence
from metavlm_ros.assurance.judge import condition_boundaries, envelope_table, row_label
from metavlm_ros.assurance.junit import write_junit
from metavlm_ros.assurance.verdict import FailureModes, Verdict, overall
from metavlm_ros.common.directories import write_file_atomic
from metavlm_ros.common.document import (
    Block,
    Bullets,
    Code,
    Document,
    Figure,
    Inline,
    Link,
    Paragraph,
    Preformatted,
    Section,
    Strong,
    Table,
    slug,
    write_document,
)
from metavlm_ros.common.record_format import to_jsonable
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import directions

__all__ = [
    'compare_document',
    'configuration',
    'verdict_document',
    'write_compare_report',
    'write_report',
]


def configuration(criteria: Criteria, evidence: Evidence, manifest: str) -> dict[str, Any]:
    """The exact configuration the verdicts hold for: tool, criteria file, every results directory's
    identity (model weights and options, settings), every frame's sha256, the manifest's status."""
    frames: dict[str, str] = {}
    for run in evidence.runs:
        for record in run.records:
            frames.setdefault(record['image'], record.get('frame_sha256') or '')
        for summary in run.summaries:
            if summary.get('source_sha256'):
                frames[summary['image']] = summary['source_sha256']
    return {
        'tool': {'package': 'metavlm_ros', 'version': __version__},
        'criteria': {'path': str(criteria.path), 'sha256': criteria.sha256, 'name': criteria.name},
        'evidence': {'root': str(evidence.root), 'manifest': manifest},
        'models': evidence.models,
        'runs': [
            {'directory': run.label(evidence.root), 'identity': run.identity, 'evaluations': len(run.records)}
            for run in evidence.runs
        ],
        'frames': dict(sorted(frames.items())),
    }


def _properties(config: dict) -> dict[str, str]:
    """The configuration as JUnit properties: flat, one value each."""
    props = {
        'metavlm.version': config['tool']['version'],
        'criteria.name': config['criteria']['name'],
        'criteria.sha256': config['criteria']['sha256'],
        'evidence.root': config['evidence']['root'],
        'evidence.manifest': config['evidence']['manifest'],
        'models': ', '.join(config['models']),
    }
    for run in config['runs']:
        model = (run['identity'] or {}).get('model') or {}
        if model.get('weights_sha256'):
            props[f'run.{run["directory"]}.weights_sha256'] = str(model['weights_sha256'])
    for image, digest in config['frames'].items():
        props[f'frame.{image}.sha256'] = digest
    return props


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f'{value:.4g}'
    return 'none' if value is None else str(value)


def _codes(names: list[str]) -> list[Inline]:
    """Names as code, separated by commas; 'none' for no name."""
    parts: list[Inline] = []
    for name in names:
        parts += [', '] * bool(parts) + [Code(name)]
    return parts or ['none']


def _modes_section(criterion: str, modes: FailureModes, where: Path) -> Section:
    """A failing criterion's failure modes, as `modes` words them, and a link to the whole catalogue."""
    href = Path(os.path.relpath(modes.catalogue, where)).as_posix()
    return Section(
        'Failure modes',
        [
            Paragraph(
                'The failure modes of the evidence that hold its violations, most first (each: how many of '
                "them it holds, and the mode's violation rate inside and outside its rule); every mode, "
                'its example and its render command: ', Link(href, href), '.',
            ),
            Bullets(list(modes.lines[criterion])),
        ],
        anchor=slug(f'{criterion} failure modes'),
    )  # fmt: skip


def verdict_document(
    criteria: Criteria,
    verdicts: list[Verdict],
    config: dict,
    table: list[dict],
    by_class: dict | None = None,
    *,
    modes: FailureModes | None = None,
    where: Path = Path(),
) -> Document:
    """The verdict as a document: outcome, one row per criterion, reasons (with `modes`, under a failing
    criterion the failure modes that break it, linked relative to `where`, the document's directory),
    envelope table, configuration."""
    blocks: list[Block] = [
        Paragraph(
            'Criteria: ', Strong(criteria.name), ' (', Code(str(criteria.path)), ', sha256 ',
            Code(criteria.sha256), '); evidence: ', Code(config['evidence']['root']),
            f' ({config["evidence"]["manifest"]}); model(s): ', *_codes(config['models']),
            f'; metavlm_ros {config["tool"]["version"]}.',
        ),
        Table(
            columns=['criterion', 'kind', 'status', 'claim'],
            rows=[[v.criterion, v.kind, Strong(v.status), v.claim] for v in verdicts],
        ),
    ]  # fmt: skip
    for v in verdicts:
        said: list[Block] = [Paragraph(f'Claim: {v.claim}.'), Paragraph(v.reason + '.')]
        if v.figures:
            figures = ', '.join(f'{k} {_figure(x)}' for k, x in v.figures.items())
            said.append(Paragraph(f'Figures: {figures}.'))
        if v.counterexample:
            example = v.counterexample
            said.append(
                Paragraph(
                    'Counterexample: ', Code(example['composition']), f' {example["parameters"]} on ',
                    Code(example['image']), f' (evaluation {example["index"]}, f_trans '
                    f'{_figure(example["f_trans"])}, f_pred {_figure(example["f_pred"])}); render it: ',
                    Code(example['render']),
                )
            )  # fmt: skip
        if modes is not None and v.criterion in modes.lines:
            said.append(_modes_section(v.criterion, modes, where))
        blocks.append(Section(f'{v.criterion}: {v.status}', said))
    if table:
        blocks.append(Section('Robustness envelope', _envelope_blocks(criteria, table, by_class)))
    blocks.append(
        Section(
            'Configuration',
            [
                Paragraph(
                    "The verdict holds for exactly this: the frames by sha256, each results directory's "
                    'identity (model weights, options, settings) and the criteria file by sha256.'
                ),
                Preformatted(json.dumps(to_jsonable(config), indent=1, sort_keys=True), 'json'),
            ],
        )
    )
    return Document(f'Verdict: {overall(verdicts)}', blocks, page_title=f'Verdict: {criteria.name}')


def _envelope_blocks(criteria: Criteria, table: list[dict], by_class: dict | None) -> list[Block]:
    """The envelope's section: what the bounds mean, the plot, the table, each class's median lower bound."""
    bounds = ['median_lower', 'median_upper', 'q05_lower', 'q05_upper', 'min_violating']
    blocks: list[Block] = [
        Paragraph(
            'Per relation and direction, over frames: the boundary (the smallest change that breaks the '
            "answer, in the relation's unit) lies above the lower and below the upper bound shown, with "
            f'{criteria.confidence:.0%} confidence each (order statistics; frames that held to the searched '
            'end are censored, never dropped). MR12 water has a row per condition its evaluations were made '
            'at (a Jerlov type, a depth), or per region a search varied them over: boundaries in different '
            'waters are not one distribution.'
        ),
        Figure('envelope.png', 'The boundary per frame, per relation and direction'),
        Table(
            columns=['direction', 'frames', 'censored', 'median: lower', 'median: upper', '5 %: lower',
                     '5 %: upper', 'smallest break'],
            rows=[[r['row'], r['frames'], r['censored'], *(_figure(r[b]) for b in bounds)]
                  for r in table],
        ),
    ]  # fmt: skip
    if by_class:
        classes = list(by_class)
        medians = {c: {r['row']: r['median_lower'] for r in rows} for c, rows in by_class.items()}
        blocks += [
            Paragraph(
                "Per class: the lower bound of the median boundary of that class's answer alone "
                '(verdict.json holds every column per class, and per threshold):'
            ),
            Table(
                columns=['direction', *classes],
                rows=[[r['row'], *(_figure(medians[c].get(r['row'])) for c in classes)] for r in table],
            ),
        ]
    return blocks


def envelope_plot(evidence: Evidence, key: str, path: Path) -> Path | None:
    """The envelope as a PNG: per row of the envelope table (a relation and direction, and its condition
    where it has one), each frame's bracket (clean to violating magnitude) as a segment, a frame that held
    to the end searched as an arrow; magnitudes as a share of the direction's range, so rows compare.
    None when no direction has evidence."""
    import matplotlib

    matplotlib.use('Agg')  # files only: no display on robots, CI or cluster nodes
    import matplotlib.pyplot as plt

    by_row: dict[str, list] = {}
    for (_, direction, condition), bracket in condition_boundaries(evidence, key).items():
        by_row.setdefault(row_label(direction, condition), []).append(bracket)
    ends = {d.name: d.end for d in directions(SearchSpace.from_options(['all']))}
    table = envelope_table(evidence, key)
    if not table:
        return None
    rows = [row['row'] for row in table]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for y, row in enumerate(table):
        brackets = sorted(by_row[row['row']], key=lambda b: (b.clean, b.point))
        end = ends[row['direction']]
        for k, bracket in enumerate(brackets):
            offset = y + (k - (len(brackets) - 1) / 2) * min(0.6 / max(len(brackets), 1), 0.08)
            if bracket.censored:
                ax.plot([bracket.clean / end], [offset], marker='>', color='tab:green', markersize=4)
            else:
                ax.plot(
                    [bracket.clean / end, bracket.violating / end],
                    [offset, offset],
                    color='tab:red',
                    linewidth=2,
                )
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("magnitude, as a share of the direction's range (red: breaks inside; green: held to there)")
    ax.invert_yaxis()
    ax.grid(axis='x', alpha=0.3)
    fig.savefig(path, dpi=90, bbox_inches='tight')
    plt.close(fig)
    return path


def _write_three(out: Path, stem: str, record: dict, document: Document) -> list[Path]:
    """STEM.json (the record), STEM.md and STEM.html (the document), each atomically."""
    write_file_atomic(out / f'{stem}.json', (json.dumps(record, indent=1, sort_keys=True) + '\n').encode())
    return [out / f'{stem}.json', *(write_document(document, out / f'{stem}.{s}') for s in ('md', 'html'))]


def write_report(
    out: str | Path,
    criteria: Criteria,
    evidence: Evidence,
    verdicts: list[Verdict],
    *,
    manifest: str,
    junit: str | Path | None = None,
    modes: FailureModes | None = None,
) -> list[Path]:
    """Write verdict.json, verdict.md and verdict.html into `out` (and JUnit XML to `junit`); with `modes`,
    verdict.md, .html and the JUnit XML name under each failing criterion the failure modes that break it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = configuration(criteria, evidence, manifest)
    key = criteria.key(evidence.kind)
    table = envelope_table(evidence, key, criteria.confidence)
    by_class = {c: envelope_table(evidence, key, criteria.confidence, c) for c in evidence.classes}
    by_key = {k: envelope_table(evidence, k, criteria.confidence) for k in evidence.keys}
    record = {
        'overall': overall(verdicts),
        'verdicts': [to_jsonable(v.__dict__) for v in verdicts],
        'envelope': to_jsonable(table),
        'envelope_by_class': to_jsonable(by_class),
        'envelope_by_threshold': to_jsonable(by_key),
        'configuration': to_jsonable(config),
    }
    document = verdict_document(criteria, verdicts, config, table, by_class, modes=modes, where=out)
    plot = envelope_plot(evidence, key, out / 'envelope.png') if table else None
    written = [] if plot is None else [plot]
    written += _write_three(out, 'verdict', record, document)
    if junit is not None:
        suite = f'metavlm verify: {criteria.name}'
        write_junit(junit, verdicts, suite=suite, properties=_properties(config), modes=modes)
        written.append(Path(junit))
    return written


def compare_document(base: Path, candidate: Path, changes: list, notes: list[str], configs: dict) -> Document:
    """The comparison as a document: the gate's outcome, a row per item, what differed, the configurations."""
    blocks: list[Block] = [
        Paragraph(
            'Base ', Code(str(base)), ', candidate ', Code(str(candidate)),
            ': the same frames (by sha256) and search settings' + (' (notes below)' if notes else '')
            + ". Each item is a two-sided test; p-values are adjusted with Holm's method over all items, and "
            'a change is called only when the adjusted p is below 0.05 and the effect is at least the '
            'minimum (docs/assurance.md).',
        ),
        Table(
            columns=['item', 'test', 'effect', 'p', 'p (Holm)', 'verdict'],
            rows=[[c.item, c.test, c.effect_text, c.p, c.p_adjusted, Strong(c.verdict)] for c in changes],
            formats=['', '', '', '.3g', '.3g', ''],
        ),
    ]  # fmt: skip
    if notes:
        blocks.append(Section('Notes', [Bullets(notes)]))
    configurations = json.dumps(to_jsonable(configs), indent=1, sort_keys=True)
    blocks.append(Section('Configurations', [Preformatted(configurations, 'json')]))
    return Document(
        f'Model comparison: {comparison_outcome(changes)}',
        blocks,
        page_title=f'Comparison: {candidate} against {base}',
    )


def write_compare_report(
    out: str | Path,
    base: Path,
    candidate: Path,
    changes: list,
    notes: list[str],
    configs: dict,
    *,
    junit: str | Path | None = None,
) -> list[Path]:
    """Write compare.json, .md and .html into `out` (and JUnit XML: a failure per regression)."""
    from metavlm_ros.assurance.verdict import FAIL, PASS

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        'outcome': comparison_outcome(changes),
        'regressed': any(c.verdict == 'regressed' for c in changes),
        'changes': [to_jsonable(c.__dict__) for c in changes],
        'notes': notes,
        'configurations': to_jsonable(configs),
    }
    written = _write_three(out, 'compare', record, compare_document(base, candidate, changes, notes, configs))
    if junit is not None:
        cases = [
            Verdict(
                criterion=c.item.replace(' ', '_'),
                kind=c.kind,
                status=FAIL if c.verdict == 'regressed' else PASS,
                claim=f'{c.item}: no regression',
                reason=f'{c.verdict}: {c.effect_text}; {c.test}; p {c.p:.3g}, Holm {c.p_adjusted:.3g}',
                figures=c.figures,
            )
            for c in changes
        ]
        properties = {'base': str(base), 'candidate': str(candidate), 'metavlm.version': __version__}
        write_junit(junit, cases, suite=f'metavlm compare: {candidate} against {base}', properties=properties)
        written.append(Path(junit))
    return written
