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
    from metavlm_ros.method.render import find_search, render_search
    from metavlm_ros.method.search import followup_name

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
    frames = render_search(results, summary, indices)
    for index, rgb in frames.items():
        path = out / f'{followup_name(summary["image"], summary["algorithm"], summary["seed"], index)}.png'
        data = encode_png(rgb)
        if path.exists() and path.read_bytes() != data:
            raise ResultsError(
                f'{path}: already there with other bytes; nothing overwritten (use another --out)'
            )
        out.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, data)
    print(f'{len(frames)} follow-up frame(s) of {summary["image"]} rendered into {args.out}/')
    return 0
