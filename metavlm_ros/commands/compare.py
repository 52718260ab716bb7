"""`metavlm compare`: gate a candidate model version against the base one, on the same evidence plan."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = 'compare the evidence of two model versions: regressed, improved or no significant change'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm compare`."""
    parser = subparsers.add_parser(
        'compare',
        help=HELP,
        description=HELP + ', per relation and direction, rate region and search. The two results '
        'directories (metavlm verify, search or campaign) must hold the same searches of the same frames '
        'with the same settings. Exit status 1 on any regression, 0 otherwise, 2 when the two are not '
        'comparable (docs/assurance.md).',
    )
    parser.add_argument(
        'base', type=Path, metavar='BASE', help="the base model's results (the one that flew)"
    )
    parser.add_argument('candidate', type=Path, metavar='CANDIDATE', help="the candidate model's results")
    parser.add_argument(
        '--threshold',
        type=float,
        default=None,
        help='the violation threshold to compare at (default: the one the searches used)',
    )
    parser.add_argument(
        '--out', type=Path, default=Path('results/compare'), metavar='DIR',
        help='where compare.md, compare.html and compare.json go (default: results/compare)',
    )  # fmt: skip
    parser.add_argument('--junit', type=Path, default=None, metavar='FILE', help='also write JUnit XML here')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Compare; print each item's verdict and the outcome (REGRESSED, IMPROVED or no regression); exit 1
    on a regression, whatever else improved."""
    from metavlm_ros.assurance.compare import IMPROVED, comparison_outcome
    from metavlm_ros.assurance.workflow import compare_results
    from metavlm_ros.common.manifest import MANIFEST

    done = compare_results(args.base, args.candidate, args.out, threshold=args.threshold, junit=args.junit)
    for change in done.changes:
        print(
            f'{change.verdict:22} {change.item}: {change.effect_text} '
            f'(p {change.p:.3g}, Holm {change.p_adjusted:.3g})'
        )
    for note in done.notes:
        print(f'note: {note}')
    if done.unchecked:
        print(f'note: no {MANIFEST} in {", ".join(done.unchecked)}: not checked')
    regressions = len(done.regressions)
    improved = sum(change.verdict == IMPROVED for change in done.changes)
    print(
        f'{comparison_outcome(done.changes)}: {args.candidate} against {args.base} ({regressions} of '
        f'{len(done.changes)} items regressed, {improved} improved; {", ".join(map(str, done.written))})'
    )
    return 1 if regressions else 0
