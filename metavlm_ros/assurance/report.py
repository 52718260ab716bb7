"""A verdict report: the criteria judged, what each rests on, and the exact configuration they hold for,
as JSON, Markdown, HTML and JUnit XML."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from metavlm_ros import __version__
from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.judge import Evidence, envelope_table, merged_boundaries
from metavlm_ros.assurance.junit import write_junit
from metavlm_ros.assurance.verdict import Verdict, overall
from metavlm_ros.common.directories import write_file_atomic
from metavlm_ros.common.record_format import to_jsonable
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import directions

__all__ = [
    'compare_markdown',
    'configuration',
    'markdown',
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


def markdown(
    criteria: Criteria, verdicts: list[Verdict], config: dict, table: list[dict], by_class: dict | None = None
) -> str:
    """The verdict as Markdown: outcome, one row per criterion, reasons, envelope table, configuration."""
    lines = [
        f'# Verdict: {overall(verdicts)}',
        '',
        f'Criteria: **{criteria.name}** (`{criteria.path}`, sha256 `{criteria.sha256}`); evidence: '
        f'`{config["evidence"]["root"]}` ({config["evidence"]["manifest"]}); model(s): '
        f'{", ".join(f"`{m}`" for m in config["models"]) or "none"}; '
        f'metavlm_ros {config["tool"]["version"]}.',
        '',
        '| criterion | kind | status | claim |',
        '|---|---|---|---|',
        *(f'| {v.criterion} | {v.kind} | **{v.status}** | {v.claim} |' for v in verdicts),
        '',
    ]
    for v in verdicts:
        lines += [f'## {v.criterion}: {v.status}', '', f'Claim: {v.claim}.', '', v.reason + '.', '']
        if v.figures:
            lines += ['Figures: ' + ', '.join(f'{k} {_figure(x)}' for k, x in v.figures.items()) + '.', '']
        if v.counterexample:
            example = v.counterexample
            lines += [
                f'Counterexample: `{example["composition"]}` {example["parameters"]} on `{example["image"]}` '
                f'(evaluation {example["index"]}, f_trans {_figure(example["f_trans"])}, f_pred '
                f'{_figure(example["f_pred"])}); render it: `{example["render"]}`',
                '',
            ]
    if table:
        lines += [
            '## Robustness envelope',
            '',
            'Per relation and direction, over frames: the boundary (the smallest change that breaks the '
            "answer, in the relation's unit) lies above the lower and below the upper bound shown, with "
            f'{criteria.confidence:.0%} confidence each (order statistics; frames that held to the searched '
            'end are censored, never dropped).',
            '',
            '![The boundary per frame, per relation and direction](envelope.png)',
            '',
            '| direction | frames | censored | median: lower | median: upper | 5 %: lower | 5 %: upper '
            '| smallest break |',
            '|---|---|---|---|---|---|---|---|',
            *(
                f'| {r["direction"]} | {r["frames"]} | {r["censored"]} | {_figure(r["median_lower"])} | '
                f'{_figure(r["median_upper"])} | {_figure(r["q05_lower"])} | {_figure(r["q05_upper"])} | '
                f'{_figure(r["min_violating"])} |'
                for r in table
            ),
            '',
        ]
    if table and by_class:
        classes = list(by_class)
        medians = {c: {r['direction']: r['median_lower'] for r in rows} for c, rows in by_class.items()}
        lines += [
            "Per class: the lower bound of the median boundary of that class's answer alone (verdict.json "
            'holds every column per class, and per threshold):',
            '',
            '| direction | ' + ' | '.join(classes) + ' |',
            '|---|' + '---|' * len(classes),
            *(
                f'| {r["direction"]} | '
                + ' | '.join(_figure(medians[c].get(r['direction'])) for c in classes)
                + ' |'
                for r in table
            ),
            '',
        ]
    lines += [
        '## Configuration',
        '',
        "The verdict holds for exactly this: the frames by sha256, each results directory's identity "
        '(model weights, options, settings) and the criteria file by sha256.',
        '',
        '```json',
        json.dumps(to_jsonable(config), indent=1, sort_keys=True),
        '```',
        '',
    ]
    return '\n'.join(lines)


def envelope_plot(evidence: Evidence, key: str, path: Path) -> Path | None:
    """The envelope as a PNG: per relation and direction (a row), each frame's bracket (clean to
    violating magnitude) as a segment, a frame that held to the end searched as an arrow; magnitudes
    as a share of the direction's range, so rows compare. None when no direction has evidence."""
    import matplotlib

    matplotlib.use('Agg')  # files only: no display on robots, CI or cluster nodes
    import matplotlib.pyplot as plt

    merged = merged_boundaries(evidence, key)
    ends = {d.name: d.end for d in directions(SearchSpace.from_options(['all']))}
    rows = [row['direction'] for row in envelope_table(evidence, key)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for y, direction in enumerate(rows):
        brackets = sorted(b for (_, d), b in merged.items() if d == direction)
        end = ends[direction]
        for k, (clean, bad) in enumerate(brackets):
            offset = y + (k - (len(brackets) - 1) / 2) * min(0.6 / max(len(brackets), 1), 0.08)
            if bad is None:
                ax.plot([clean / end], [offset], marker='>', color='tab:green', markersize=4)
            else:
                ax.plot([clean / end, bad / end], [offset, offset], color='tab:red', linewidth=2)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("magnitude, as a share of the direction's range (red: breaks inside; green: held to there)")
    ax.invert_yaxis()
    ax.grid(axis='x', alpha=0.3)
    fig.savefig(path, dpi=90, bbox_inches='tight')
    plt.close(fig)
    return path


def _html(text: str, title: str) -> str:
    """The Markdown shown as a page: tables as tables, the rest as preformatted text, all escaped."""
    body, rows, code = [], [], None
    for line in text.splitlines():
        if code is not None:  # inside a fenced block: kept as it is
            if line.startswith('```'):
                body.append('<pre>' + html.escape('\n'.join(code)) + '</pre>')
                code = None
            else:
                code.append(line)
            continue
        if line.startswith('|'):
            if not set(line) <= set('|-'):
                cells = [html.escape(c.strip()).replace('**', '') for c in line.strip('|').split('|')]
                tag = 'th' if not rows else 'td'
                rows.append('<tr>' + ''.join(f'<{tag}>{c}</{tag}>' for c in cells) + '</tr>')
            continue
        if rows:
            body.append('<table>' + ''.join(rows) + '</table>')
            rows = []
        image = re.fullmatch(r'!\[(.*)\]\((.*)\)', line)
        if line.startswith('```'):
            code = []
        elif image:
            alt, src = (html.escape(part, quote=True) for part in image.groups())
            body.append(f'<p><img src="{src}" alt="{alt}"></p>')
        elif line.startswith('#'):
            level = len(line) - len(line.lstrip('#'))
            body.append(f'<h{level}>{html.escape(line.lstrip("#").strip())}</h{level}>')
        elif line.strip():
            body.append(f'<p>{html.escape(line)}</p>')
    if rows:
        body.append('<table>' + ''.join(rows) + '</table>')
    style = 'body{font-family:sans-serif;max-width:70em}td,th{border:1px solid #999;padding:2px 6px}'
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<style>{style}table{{border-collapse:collapse}}</style></head><body>{"".join(body)}</body></html>\n'
    )


def _write_three(out: Path, stem: str, record: dict, text: str, title: str) -> list[Path]:
    """STEM.json (the record), STEM.md (the text) and STEM.html (the text as a page), each atomically."""
    written = []
    for suffix, data in (
        ('json', json.dumps(record, indent=1, sort_keys=True) + '\n'),
        ('md', text),
        ('html', _html(text, title)),
    ):
        write_file_atomic(out / f'{stem}.{suffix}', data.encode())
        written.append(out / f'{stem}.{suffix}')
    return written


def write_report(
    out: str | Path,
    criteria: Criteria,
    evidence: Evidence,
    verdicts: list[Verdict],
    *,
    manifest: str,
    junit: str | Path | None = None,
) -> list[Path]:
    """Write verdict.json, verdict.md and verdict.html into `out` (and JUnit XML to `junit`)."""
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
    text = markdown(criteria, verdicts, config, table, by_class)
    plot = envelope_plot(evidence, key, out / 'envelope.png') if table else None
    written = [] if plot is None else [plot]
    written += _write_three(out, 'verdict', record, text, f'Verdict: {criteria.name}')
    if junit is not None:
        write_junit(junit, verdicts, suite=f'metavlm verify: {criteria.name}', properties=_properties(config))
        written.append(Path(junit))
    return written


def compare_markdown(base: Path, candidate: Path, changes: list, notes: list[str], configs: dict) -> str:
    """The comparison as Markdown: the gate's outcome, a row per item, what differed, both configurations."""
    regressed = [c for c in changes if c.verdict == 'regressed']
    lines = [
        f'# Model comparison: {"REGRESSED" if regressed else "no regression"}',
        '',
        f'Base `{base}`, candidate `{candidate}`: the same frames (by sha256) and search settings'
        + (' (notes below)' if notes else '')
        + ". Each item is a two-sided test; p-values are adjusted with Holm's method over all items, and a "
        'change is called only when the adjusted p is below 0.05 and the effect is at least the minimum '
        '(docs/assurance.md).',
        '',
        '| item | test | effect | p | p (Holm) | verdict |',
        '|---|---|---|---|---|---|',
        *(
            f'| {c.item} | {c.test} | {c.effect_text} | {c.p:.3g} | {c.p_adjusted:.3g} | **{c.verdict}** |'
            for c in changes
        ),
        '',
        *(['## Notes', '', *(f'- {note}' for note in notes), ''] if notes else []),
        '## Configurations',
        '',
        '```json',
        json.dumps(to_jsonable(configs), indent=1, sort_keys=True),
        '```',
        '',
    ]
    return '\n'.join(lines)


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
        'regressed': any(c.verdict == 'regressed' for c in changes),
        'changes': [to_jsonable(c.__dict__) for c in changes],
        'notes': notes,
        'configurations': to_jsonable(configs),
    }
    text = compare_markdown(base, candidate, changes, notes, configs)
    written = _write_three(out, 'compare', record, text, f'Comparison: {candidate} against {base}')
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
