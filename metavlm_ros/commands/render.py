"""`metavlm render`: make evaluations' follow-up PNGs again from a search's stored source frame."""

from __future__ import annotations

import argparse
from pathlib import Path

from metavlm_ros.common.errors import ParameterError, ResultsError

HELP = "recreate evaluations' follow-up frames, byte for byte, from a results directory"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm render`."""
    parser = subparsers.add_parser('render', help=HELP, description=HELP + '.')
    parser.add_argument(
        'results',
        type=Path,
        metavar='RESULTS',
        help='a results directory: metavlm search --out, a tester results_dir, a campaign cell, a demo model',
    )
    parser.add_argument(
        'indices',
        nargs='+',
        metavar='INDEX',
        help="evaluation indices of the search (its records' index), or pareto for its non-dominated set",
    )
    parser.add_argument('--image', default=None, help='the searched frame, when the directory has several')
    parser.add_argument('--algorithm', default=None, help='the search algorithm, when there are several')
    parser.add_argument('--seed', default=None, help='the seed, when there are several')
    parser.add_argument('--run', default=None, help='the campaign run, when there are several')
    parser.add_argument(
        '--boxes',
        action='store_true',
        help='detection results: also write each follow-up with its boxes drawn (<name>_boxes.png): the '
        "source's objects where the warp put them, the follow-up's, lost, new and changed ones marked",
    )
    parser.add_argument(
        '--out',
        type=Path,
        default=Path('rendered'),
        metavar='DIR',
        help='where the PNGs go (default: rendered)',
    )
    parser.set_defaults(handler=run)


def _indices(items: list[str], summary: dict) -> list[int]:
    indices: list[int] = []
    for item in items:
        if item == 'pareto':
            indices += [int(i) for i in summary.get('pareto') or []]
            continue
        try:
            indices.append(int(item))
        except ValueError:
            raise ParameterError(f'INDEX {item!r}: expected an evaluation index or pareto') from None
    return list(dict.fromkeys(indices))


def run(args: argparse.Namespace) -> int:
    from metavlm_ros.common.images import encode_png
    from metavlm_ros.common.results import write_file_atomic
    from metavlm_ros.method.render import find_search, render_search, search_evaluations
    from metavlm_ros.method.search import followup_name
    from metavlm_ros.viewer.boxes import draw_outlines, violation_outlines

    results = args.results
    if not results.is_dir():
        raise ParameterError(f'{results}: not a results directory')
    out = args.out.resolve()
    if out == results.resolve() or results.resolve() in out.parents:
        # Evidence is never mixed with what is made from it.
        raise ParameterError(f'--out {args.out}: inside the results directory {results}; choose another')
    summary = find_search(results, image=args.image, algorithm=args.algorithm, seed=args.seed, run=args.run)
    indices = _indices(args.indices, summary)
    if not indices:
        raise ParameterError(f'{results}: the search of {summary.get("image")} has no non-dominated solution')
    if args.boxes and summary.get('kind') != 'detection':
        raise ParameterError(
            f'--boxes: the search of {summary.get("image")} answered {summary.get("kind")}s, not boxes'
        )
    frames = render_search(results, summary, indices)
    records = search_evaluations(results, summary, frames) if args.boxes else {}
    written = []
    for index, rgb in frames.items():
        stem = followup_name(summary['image'], summary['algorithm'], summary['seed'], index)
        written.append((out / f'{stem}.png', encode_png(rgb)))
        if args.boxes:
            # The record's boxes are in source-frame pixels; the rendered frame is the searched one.
            zoom = rgb.shape[1] / (summary.get('source_size') or [rgb.shape[1]])[0]
            drawn = rgb.copy()
            record = records[index]
            draw_outlines(
                drawn, violation_outlines(record.get('boxes'), record.get('followup_detections')), zoom
            )
            written.append((out / f'{stem}_boxes.png', encode_png(drawn)))
    for path, data in written:
        if path.exists() and path.read_bytes() != data:
            raise ResultsError(
                f'{path}: already there with other bytes; nothing overwritten (use another --out)'
            )
    out.mkdir(parents=True, exist_ok=True)
    for path, data in written:
        write_file_atomic(path, data)
    drawn = ' (and with their boxes drawn)' if args.boxes else ''
    print(f'{len(frames)} follow-up frame(s) of {summary["image"]} rendered{drawn} into {args.out}/')
    return 0
