"""The `metavlm demo` report: violations by order and by composition, and a montage of the strongest ones."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.directories import write_file_atomic
from metavlm_ros.common.document import (
    Block,
    Code,
    Document,
    Figure,
    Paragraph,
    Section,
    Table,
    markdown_text,
    write_document,
)
from metavlm_ros.common.errors import InputError
from metavlm_ros.method.answers import iou_key

__all__ = [
    'DemoSection',
    'criterion',
    'montage',
    'pair_panel',
    'pareto_plot',
    'strongest',
    'tabulate',
    'write_demo_report',
]

# The confidence threshold the demo reports for CLIP (the strictest of the paper's three).
DEFAULT_CONFIDENCE_KEY = '0.05'


def criterion(record: Mapping[str, Any], threshold_key: str = DEFAULT_CONFIDENCE_KEY) -> str:
    """The violation key a record is judged by: 'count' for count models, the IoU key its search judged
    boxes at for detections ('iou0.5'), the threshold key otherwise."""
    kind = record.get('kind')
    if kind == 'count':
        return 'count'
    if kind == 'detection':
        return next((k for k in record.get('violation') or {} if k.startswith('iou')), iou_key(0.5))
    return threshold_key


def _judged(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # The identity (order 0) is never a violation; failed probes carry no judgement (docs/results.md).
    return [r for r in records if not r.get('failed') and int(r.get('order', 0)) > 0]


def tabulate(
    records: Sequence[Mapping[str, Any]], threshold_key: str = DEFAULT_CONFIDENCE_KEY
) -> dict[str, dict[str, list[int]]]:
    """Violation counts by order and by composition.

    Args:
        records: evaluation records (docs/results.md) of one model.
        threshold_key: which confidence threshold decides a CLIP violation.

    Returns:
        {'by_order': {order: [violations, evaluations]},
         'by_composition': {label: [violations, evaluations]}}, orders ascending, compositions by
        decreasing violation rate, then by label.
    """
    by_order: dict[int, list[int]] = {}
    by_composition: dict[str, list[int]] = {}
    for record in _judged(records):
        hit = bool(record.get('violation', {}).get(criterion(record, threshold_key), False))
        for table, key in ((by_order, int(record['order'])), (by_composition, str(record['composition']))):
            cell = table.setdefault(key, [0, 0])
            cell[0] += hit
            cell[1] += 1
    compositions = sorted(by_composition.items(), key=lambda kv: (-kv[1][0] / kv[1][1], kv[0]))
    return {
        'by_order': {str(k): v for k, v in sorted(by_order.items())},
        'by_composition': dict(compositions),
    }


def strongest(
    records: Sequence[Mapping[str, Any]], n: int, threshold_key: str = DEFAULT_CONFIDENCE_KEY
) -> list[Mapping[str, Any]]:
    """The n violations of largest strength (Eq. 7), one per composition; ties: lower f_trans first."""
    best: dict[str, Mapping[str, Any]] = {}
    for record in _judged(records):
        key = criterion(record, threshold_key)
        strength = (record.get('strength') or {}).get(key)
        if not record.get('violation', {}).get(key) or strength is None:
            continue
        # One per composition: the montage shows different relations rather than one relation twice.
        slot = str(record['composition'])
        rank = (float(strength), -float(record['f_trans']))
        if slot not in best or rank > (float(best[slot]['strength'][key]), -float(best[slot]['f_trans'])):
            best[slot] = record
    ordered = sorted(
        best.values(), key=lambda r: (-float(r['strength'][criterion(r, threshold_key)]), r['f_trans'])
    )
    return ordered[:n]


_FONT_SCALE = 0.42
_LINE_STEP = 16


def _wrap(line: str, width: int) -> list[str]:
    """Split a line into pieces that fit `width` pixels in the label font (greedy, at spaces)."""
    import cv2

    def fits(text: str) -> bool:
        return cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, _FONT_SCALE, 1)[0][0] <= width - 12

    pieces, current = [], ''
    for word in line.split(' '):
        candidate = f'{current} {word}' if current else word
        if fits(candidate) or not current:
            current = candidate
        else:
            pieces.append(current)
            current = word
    pieces.append(current)
    return pieces


def _text_lines(image: np.ndarray, lines: Sequence[str], colour: tuple[int, int, int]) -> np.ndarray:
    """A strip of text lines (wrapped to the image width) stacked above the image."""
    import cv2

    wrapped = [piece for line in lines for piece in _wrap(line, image.shape[1])]
    strip = np.full((_LINE_STEP * len(wrapped) + 6, image.shape[1], 3), 24, np.uint8)
    for i, line in enumerate(wrapped):
        cv2.putText(
            strip,
            line,
            (6, _LINE_STEP * (i + 1)),
            cv2.FONT_HERSHEY_SIMPLEX,
            _FONT_SCALE,
            colour,
            1,
            cv2.LINE_AA,
        )
    return np.vstack([strip, image])


def _values_line(source: Mapping[str, float], followup: Mapping[str, float], kind: str) -> str:
    # Detections: how many objects of each class were found, as counts.
    fmt = (lambda v: f'{v:g}') if kind in ('count', 'detection') else (lambda v: f'{v:.3f}')
    parts = []
    for cls, value in source.items():
        after = followup.get(cls, value)
        mark = '*' if after != value else ''
        parts.append(f'{cls} {fmt(value)}->{fmt(after)}{mark}')
    return '  '.join(parts)


def _boxes_line(boxes: Mapping[str, Any]) -> str:
    """A detection evaluation's match in words: what was lost, new, re-classed or displaced."""
    expected = boxes.get('expected') or ()
    parts = [f'{len(expected)} expected']
    if boxes.get('lost'):
        parts.append('lost ' + ', '.join(str(expected[int(i)]['class']) for i in boxes['lost']))
    if boxes.get('new'):
        parts.append(f'{len(boxes["new"])} new')
    if boxes.get('reclassed'):
        parts.append(f'{len(boxes["reclassed"])} re-classed')
    for row in boxes.get('displaced') or ():
        parts.append(f'{expected[int(row[0])]["class"]} displaced (IoU {float(row[2]):.2f})')
    return 'boxes: ' + ', '.join(parts)


def pair_panel(
    source: np.ndarray, followup: np.ndarray, record: Mapping[str, Any], title: str, height: int = 216
) -> np.ndarray:
    """Source and follow-up side by side, each labelled, with the composition and the prediction change.

    Args:
        source: the source frame, RGB uint8.
        followup: the follow-up frame, RGB uint8 (same size as the source).
        record: the evaluation record (composition, parameters, f_trans, f_pred, source, followup).
        title: what the panel shows (e.g. model and frame).
        height: panel height of each frame in pixels.

    Returns:
        An RGB image.
    """
    import cv2

    def fit(frame: np.ndarray) -> np.ndarray:
        width = max(1, round(frame.shape[1] * height / frame.shape[0]))
        return cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)

    params = ', '.join(f'{k}={v:.3g}' for k, v in record.get('parameters', {}).items())
    left = _text_lines(fit(source), ['SOURCE', title], (255, 255, 255))
    right = _text_lines(
        fit(followup),
        [f'FOLLOW-UP {record["composition"]} order {record["order"]}', params],
        (255, 210, 90),
    )
    # Wrapped labels may differ in height; pad the shorter column above its text.
    tall = max(left.shape[0], right.shape[0])
    left, right = (
        np.vstack([np.full((tall - c.shape[0], c.shape[1], 3), 24, np.uint8), c]) for c in (left, right)
    )
    gap = np.full((tall, 6, 3), 24, np.uint8)
    pair = np.hstack([left, gap, right])
    kind = str(record.get('kind', 'confidence'))
    footer = [
        f'f_trans {record["f_trans"]:.3f}  f_pred {record["f_pred"]:.3f}',
        _values_line(record.get('source') or {}, record.get('followup') or {}, kind),
    ]
    if kind == 'count' and record.get('followup_text') is not None:
        footer.append(f'src: {record.get("source_text", "")}')
        footer.append(f'fol: {record.get("followup_text", "")}')
    if kind == 'detection':
        footer.append(_boxes_line(record.get('boxes') or {}))
    # The footer goes under the pair: a text strip over an empty image, stacked below.
    strip = _text_lines(np.zeros((0, pair.shape[1], 3), np.uint8), footer, (200, 230, 255))
    return np.vstack([pair, strip])


def montage(panels: Sequence[np.ndarray], gap: int = 10) -> np.ndarray:
    """Stack panels vertically, padding narrower ones on the right."""
    if not panels:
        raise InputError('no violations to show in a montage')
    width = max(p.shape[1] for p in panels)
    rows = []
    for panel in panels:
        pad = np.full((panel.shape[0], width - panel.shape[1], 3), 12, np.uint8)
        rows.append(np.hstack([panel, pad]))
        rows.append(np.full((gap, width, 3), 12, np.uint8))
    return np.vstack(rows[:-1])


_ALGORITHM_STYLE = {
    'nsga2': ('NSGA-II', '#d62728'),
    'random': ('Rand', '#1f77b4'),
    'mobo': ('mobo', '#2ca02c'),
}


def pareto_plot(
    groups: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], path: Path, dpi: int = 110
) -> Path:
    """The trade-off the search explores: f_trans against f_pred, one panel per model.

    Every judged evaluation is a faint point, coloured by algorithm; each algorithm's non-dominated
    points over all its searched frames are joined as a step line (the attainment of the best
    trade-offs: least transformation for each size of prediction change).

    Args:
        groups: model title -> algorithm ('nsga2', 'random') -> evaluation records.
        path: the PNG to write.
        dpi: resolution.

    Returns:
        `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from metavlm_ros.method.metrics import non_dominated

    figure = Figure(figsize=(5.2 * max(1, len(groups)), 4.2), layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(1, len(groups)), squeeze=False)[0]
    for ax, (title, algorithms) in zip(axes, groups.items(), strict=False):
        for algorithm, records in algorithms.items():
            label, colour = _ALGORITHM_STYLE.get(algorithm, (algorithm, 'grey'))
            judged = _judged(records)
            if not judged:
                continue
            ft = np.array([float(r['f_trans']) for r in judged])
            fp = np.array([float(r['f_pred']) for r in judged])
            ax.scatter(ft, fp, s=6, alpha=0.25, color=colour, linewidths=0)
            front = [i for i in non_dominated(ft, fp) if fp[i] > 0]
            front.sort(key=lambda i: ft[i])
            if front:
                ax.step(
                    ft[front], fp[front], where='post', color=colour, linewidth=2, marker='o', markersize=3
                )
            ax.plot([], [], color=colour, marker='o', label=f'{label} ({len(judged)} evaluations)')
        ax.set_title(title)
        ax.set_xlabel('f_trans (size of the transformation, minimised)')
        ax.set_ylabel('f_pred (change of the answer, maximised)')
        ax.grid(alpha=0.3)
        ax.legend(loc='center right', fontsize=8)
    figure.savefig(path, dpi=dpi)
    return path


@dataclass
class DemoSection:
    """One model's (or one run's) results in the demo report.

    Attributes:
        title: e.g. 'CLIP demo model, offline search'.
        results_dir: where its JSON Lines live.
        records: its evaluation records.
        kind: 'count' or 'confidence'.
        notes: extra lines printed under the title.
    """

    title: str
    results_dir: Path
    records: list[dict[str, Any]]
    kind: str
    notes: list[str] = field(default_factory=list)


def _rate(cell: Sequence[int]) -> str:
    return f'{cell[0]}/{cell[1]} ({cell[0] / cell[1]:.0%})' if cell[1] else '-'


def write_demo_report(
    out: Path,
    sections: Sequence[DemoSection],
    montage_path: Path | None,
    top_compositions: int = 8,
    trade_off: Mapping[str, Any] | None = None,
    assurance: Sequence[Block] = (),
    modes: Section | None = None,
    modes_records: Sequence[Mapping[str, Any]] = (),
    water: Section | None = None,
    water_figures: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write report.md (human) and report.json (the same tables) under `out`, each atomically.

    `water` (optional): the demo models' envelope per Jerlov water type as a section (assurance/, a layer
    above, measures and makes it); report.json keeps `water_figures`, its figures and what they were
    measured on.

    `modes` (optional): the demo CLIP's failure modes as a section (explain/, a layer above, makes it);
    report.json keeps `modes_records`, modes.json's records.

    `assurance` (optional): the acceptance criteria's verdict and the regression gate, shown as their
    own section (report.json keeps them as Markdown lines).

    `trade_off` (optional): {'plot': path of pareto_plot's PNG, 'hypervolume': {model: {algorithm:
    {image: hypervolume}}}}, shown as the NSGA-II vs Rand section.

    Returns:
        The paths of report.md and report.json.
    """
    out = Path(out)
    blocks: list[Block] = [
        Paragraph(
            'Violations: a count model violates when some class count changes (Eq. 4); CLIP when some class '
            f'confidence changes by at least {DEFAULT_CONFIDENCE_KEY} (Eq. 5); a detector when an object of '
            'the source is lost or re-classed, a new one appears, or a box lies below IoU 0.5 of where the '
            "relation's warp moved it (docs/method.md §13). The identity is never a violation."
        )
    ]
    data: dict[str, Any] = {'sections': []}
    for section in sections:
        table = tabulate(section.records)
        blocks.append(_section(section, table, top_compositions))
        data['sections'].append(
            {'title': section.title, 'results_dir': str(section.results_dir), 'kind': section.kind, **table}
        )
    if trade_off:
        blocks.append(_trade_off(trade_off))
        data['trade_off'] = {'plot': str(trade_off['plot']), 'hypervolume': trade_off['hypervolume']}
    if montage_path is not None:
        blocks.append(Section('Strongest violations', [Figure(montage_path.name, 'strongest violations')]))
        data['montage'] = str(montage_path)
    if modes is not None:
        blocks.append(modes)
        data['modes'] = list(modes_records)
    if assurance:
        blocks.append(Section('Acceptance criteria and the regression gate (demo CLIP)', assurance))
        data['assurance'] = markdown_text(assurance).split('\n')
    if water is not None:
        blocks.append(water)
        data['water'] = dict(water_figures or {})
    md = write_document(Document('metavlm demo report', blocks), out / 'report.md')
    js = out / 'report.json'
    write_file_atomic(js, json.dumps(data, indent=1).encode('utf-8'))
    return md, js


def _section(section: DemoSection, table: dict[str, dict[str, list[int]]], top_compositions: int) -> Section:
    """One model's section: where its results are, its violations by order and by composition."""
    judged = sum(cell[1] for cell in table['by_order'].values())
    hits = sum(cell[0] for cell in table['by_order'].values())
    shown = list(table['by_composition'].items())[:top_compositions]
    compositions = [[Code(label), _rate(cell)] for label, cell in shown]
    if len(table['by_composition']) > len(shown):
        compositions.append([f'... {len(table["by_composition"]) - len(shown)} more in report.json', ''])
    return Section(
        section.title,
        [
            # The notes go on lines of their own under the results directory.
            Paragraph('Results: ', Code(str(section.results_dir)), *(f'\n{note}' for note in section.notes)),
            Paragraph(f'{hits} violation(s) in {judged} evaluation(s).'),
            Table(
                columns=['order', 'violations / evaluations'],
                rows=[[order, _rate(cell)] for order, cell in table['by_order'].items()],
            ),
            Table(columns=['composition', 'violations / evaluations'], rows=compositions),
        ],
    )


def _trade_off(trade_off: Mapping[str, Any]) -> Section:
    """The trade-off section: each search's hypervolume per algorithm, and the plot of f_trans and f_pred."""
    # NSGA-II and Rand, then any algorithm the demo was asked to run `--also`, in that order.
    shown = ['nsga2', 'random']
    for algorithms in trade_off['hypervolume'].values():
        shown += [a for a in algorithms if a not in shown]
    names = [_ALGORITHM_STYLE.get(a, (a, ''))[0] for a in shown]
    others = f' (and {", ".join(names[2:])}, asked with --also)' if len(names) > 2 else ''
    rows = []
    for model, algorithms in trade_off['hypervolume'].items():
        tables = [algorithms.get(a, {}) for a in shown]
        for image in sorted(set().union(*tables)):
            rows.append([model, Code(image), *(table.get(image) for table in tables)])
    return Section(
        f'Trade-off: NSGA-II against Rand{" and " + ", ".join(names[2:]) if others else ""}',
        [
            Paragraph(
                'The same frames searched with the same budget by NSGA-II (through the ROS nodes) and by '
                f"Rand (the random baseline, in process){others}; hypervolume of each search's non-dominated "
                'set (higher is better, docs/method.md §5).'
            ),
            Table(columns=['model', 'frame', *names], rows=rows, formats=['', ''] + ['.4f'] * len(names)),
            Figure(Path(trade_off['plot']).name, 'f_trans against f_pred'),
        ],
    )
