"""`metavlm upgrade`: write a results directory of an earlier version as a new one in results format 3."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = 'write results of an earlier version (formats 1, 2) as a new directory in results format 3'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm upgrade`."""
    parser = subparsers.add_parser(
        'upgrade',
        help=HELP,
        description=HELP + ', record for record, checked as it is written; OLD is only read '
        '(docs/results.md).',
    )
    parser.add_argument(
        'old',
        type=Path,
        metavar='OLD',
        help='a results directory (search, tester node, run, demo model, campaign cell) or a campaign',
    )
    parser.add_argument('new', type=Path, metavar='NEW', help='the new directory (must not exist)')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Upgrade; errors reach the CLI as one line, and leave no NEW behind."""
    from metavlm_ros.campaign.cells import CAMPAIGN_FILE
    from metavlm_ros.campaign.upgrade import upgrade_campaign
    from metavlm_ros.common.upgrade import upgrade_results

    campaign = (args.old / CAMPAIGN_FILE).is_file()
    upgrade = upgrade_campaign if campaign else upgrade_results
    done = upgrade(args.old, args.new, log=lambda message: print(f'metavlm upgrade: {message}'))
    counts = ', '.join(f'{count} in {name}.gz' for name, count in done.records.items())
    what = 'campaign' if campaign else 'results'
    print(f'{args.new}: the {what} of {args.old} in results format 3 ({counts}; {done.pngs} PNGs copied)')
    return 0
