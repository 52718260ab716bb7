"""`metavlm report`: the paper's RQ1-RQ3 tables and plots, and each model's failure modes, from a campaign."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write a campaign's report: RQ1-RQ3 tables (Tables 4-7), plots and failure modes"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm report`."""
    parser = subparsers.add_parser('report', help=HELP, description=HELP + '.')
    parser.add_argument('results', metavar='DIR', help='a directory written by `metavlm campaign --out`')
    parser.add_argument(
        '--format', default='md', choices=('md', 'html', 'csv'), help='md (also printed), html or csv'
    )
    parser.add_argument('--out', default=None, metavar='DIR', help='where to write (default: DIR/report)')
    parser.add_argument(
        '--solutions',
        default='all',
        choices=('all', 'final', 'pareto'),
        help='solution set of the RQ2/RQ3 tables: all evaluations (default), final generation, or pareto',
    )
    parser.add_argument(
        '--rq3',
        default='run',
        choices=('run', 'pooled'),
        help='samples of the RQ3 test: one mean strength per image and run (default), or every violating '
        'pair pooled (the tables say so)',
    )
    parser.add_argument(
        '--baseline',
        default=None,
        metavar='ALGORITHM',
        help="the algorithm RQ1 and RQ3 compare every other one against (default: the campaign's "
        'baseline, else random as in the paper), or all: every pair',
    )
    parser.add_argument('--no-plots', action='store_true', help='tables only')
    parser.add_argument(
        '--no-modes', action='store_true', help='leave out the failure modes of each model (docs/explain.md)'
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build and write the report; returns the exit code."""
    from metavlm_ros.campaign.report import build_report, render_markdown, write_campaign_report
    from metavlm_ros.common.errors import ResultsError
    from metavlm_ros.common.manifest import MANIFEST
    from metavlm_ros.common.results import check_output_dir, storage_error

    out = Path(args.out) if args.out else Path(args.results) / 'report'
    check_output_dir(out, what='the report')
    report = build_report(args.results, solutions=args.solutions, rq3=args.rq3, baseline=args.baseline)
    if not args.no_modes:
        from metavlm_ros.explain.sections import campaign_modes

        report.sections.append(campaign_modes(report.results))
    try:
        done = write_campaign_report(report, args.results, out, fmt=args.format, plots=not args.no_plots)
    except OSError as exc:
        raise storage_error(out, exc, 'the report', 'the results are untouched') from None
    if args.format == 'md':
        print(render_markdown(report))
    written = done.files
    print(f'report: {len(written)} files in {out} (main: {written[0].name})', file=sys.stderr)
    if done.listed:
        print(f'{MANIFEST} of {args.results} rewritten: it lists the report', file=sys.stderr)
    elif done.problem:
        print(f'{MANIFEST} of {args.results} left as it was: {done.problem}', file=sys.stderr)
    damaged = report.results.damaged
    if damaged:
        # The report is written without them and says so; the exit status says so too.
        names = ', '.join(f'{cell} ({problem})' for cell, problem in damaged)
        raise ResultsError(
            f'{len(damaged)} damaged cell(s) left out of the report: {names}; '
            f'run the campaign again on {args.results} to redo them'
        )
    return 0
