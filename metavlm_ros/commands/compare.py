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
    """Compare; print each item's verdict; exit 1 on a regression."""
    from metavlm_ros.assurance.compare import REGRESSED, compare
    from metavlm_ros.assurance.judge import load_evidence
    from metavlm_ros.assurance.manifest import MANIFEST, check_manifest
    from metavlm_ros.assurance.report import write_compare_report
    from metavlm_ros.common.errors import ParameterError

    for given in (args.base, args.candidate):
        if args.out.resolve().is_relative_to(given.resolve()):
            raise ParameterError(
                f'--out {args.out}: inside the evidence {given}; write the comparison elsewhere'
            )
    base, candidate = load_evidence(args.base), load_evidence(args.candidate)
    checked = {str(d): check_manifest(d) for d in (args.base, args.candidate)}
    changes, notes = compare(base, candidate, threshold=args.threshold)
    configs = {
        'base': {'root': str(args.base), 'models': base.models, 'manifest': checked[str(args.base)]},
        'candidate': {
            'root': str(args.candidate),
            'models': candidate.models,
            'manifest': checked[str(args.candidate)],
        },
        'runs': {
            side: {run.label(evidence.root): run.identity for run in evidence.runs}
            for side, evidence in (('base', base), ('candidate', candidate))
        },
        'frames': base.frames,
    }
    written = write_compare_report(
        args.out, args.base, args.candidate, changes, notes, configs, junit=args.junit
    )
    for change in changes:
        print(
            f'{change.verdict:22} {change.item}: {change.effect_text} '
            f'(p {change.p:.3g}, Holm {change.p_adjusted:.3g})'
        )
    for note in notes:
        print(f'note: {note}')
    unchecked = [d for d, ok in checked.items() if not ok]
    if unchecked:
        print(f'note: no {MANIFEST} in {", ".join(unchecked)}: not checked')
    regressions = sum(c.verdict == REGRESSED for c in changes)
    print(
        f'{"REGRESSED" if regressions else "no regression"}: {args.candidate} against {args.base} '
        f'({regressions} of {len(changes)} items regressed; {", ".join(map(str, written))})'
    )
    return 1 if regressions else 0
