"""`metavlm verify`: judge a model against acceptance criteria; a verdict per criterion and overall."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = 'judge results against acceptance criteria: PASS, FAIL or INCONCLUSIVE per criterion and overall'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm verify`."""
    parser = subparsers.add_parser(
        'verify',
        help=HELP,
        description=HELP + '. Exit status 0: all PASS; 1: a FAIL; 3: INCONCLUSIVE and no FAIL; 2: an error '
        '(docs/assurance.md).',
    )
    parser.add_argument(
        '--criteria', type=Path, required=True, metavar='FILE', help='acceptance criteria (YAML)'
    )
    parser.add_argument(
        '--results',
        type=Path,
        required=True,
        metavar='DIR',
        help='evidence to judge, as it is: a results directory (search, tester, verify, campaign) or a '
        'folder of them; checked against its SHA256SUMS where it has one',
    )
    parser.add_argument(
        '--out',
        type=Path,
        default=Path('results/verdict'),
        metavar='DIR',
        help='where verdict.md, verdict.html and verdict.json go (default: results/verdict; not inside '
        'the evidence)',
    )
    parser.add_argument('--junit', type=Path, default=None, metavar='FILE', help='also write JUnit XML here')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Judge; print the verdicts; exit status by the overall outcome."""
    from metavlm_ros.assurance.criteria import load_criteria
    from metavlm_ros.assurance.judge import judge, load_evidence
    from metavlm_ros.assurance.manifest import MANIFEST, check_manifest
    from metavlm_ros.assurance.report import write_report
    from metavlm_ros.assurance.verdict import EXIT_CODES, overall
    from metavlm_ros.common.errors import ParameterError

    criteria = load_criteria(args.criteria)
    if args.out.resolve().is_relative_to(args.results.resolve()):
        raise ParameterError(
            f'--out {args.out}: inside the evidence {args.results}; write the verdict elsewhere'
        )
    evidence = load_evidence(args.results)
    manifest = (
        f'{MANIFEST} verified'
        if check_manifest(args.results)
        else f'no {MANIFEST} (written before manifests): not verified'
    )
    verdicts = judge(criteria, evidence)
    written = write_report(args.out, criteria, evidence, verdicts, manifest=manifest, junit=args.junit)
    outcome = overall(verdicts)
    for verdict in verdicts:
        print(f'{verdict.status:12} {verdict.criterion}: {verdict.claim}\n             {verdict.reason}')
    print(f'{outcome}: {criteria.name} ({len(verdicts)} criteria; {", ".join(map(str, written))})')
    return EXIT_CODES[outcome]
