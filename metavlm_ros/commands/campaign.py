"""`metavlm campaign`: run the paper's evaluation as resumable cells, locally or on a Dask cluster."""

from __future__ import annotations

import argparse
import sys

HELP = 'run a campaign (models x algorithms x runs x images) into a resumable results directory'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm campaign`."""
    parser = subparsers.add_parser(
        'campaign',
        help=HELP,
        description=HELP + '. Running it again on the same --out skips finished cells and continues.',
    )
    parser.add_argument('config', metavar='CONFIG.yaml', help='the campaign configuration (see examples/)')
    parser.add_argument('--out', required=True, metavar='DIR', help='results directory (created or resumed)')
    parser.add_argument(
        '--executor', default='local', choices=('local', 'dask'), help='where cells run (default: local)'
    )
    parser.add_argument(
        '--workers', type=int, default=1, metavar='N', help='worker processes on this machine (default: 1)'
    )
    parser.add_argument(
        '--scheduler', default=None, metavar='ADDR', help='Dask scheduler address (default: a local cluster)'
    )
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        metavar='N',
        help="torch threads per cell (default: the config's threads, 1); recorded with every cell",
    )
    parser.add_argument('--force', action='store_true', help='continue a directory made with another config')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Validate the configuration, then run every unfinished cell; returns the exit code."""
    from metavlm_ros.campaign.config import load_config
    from metavlm_ros.campaign.runner import run_campaign

    config = load_config(args.config)

    def log(message: str) -> None:
        print(f'metavlm: {message}', file=sys.stderr)

    result = run_campaign(
        config,
        args.out,
        executor=args.executor,
        workers=args.workers,
        scheduler=args.scheduler,
        force=args.force,
        threads=args.threads,
        progress=not args.no_progress,
        log=log,
    )
    rate = f', {result.cells_per_minute:.1f} cells/min' if result.completed else ''
    print(
        f'campaign: {result.completed} cells run, {result.skipped} already finished, '
        f'{result.total} in all ({result.seconds:.1f} s{rate}); results in {result.directory}'
    )
    return 0
